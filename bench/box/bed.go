package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"

	"github.com/quro-dev/quro/bench/internal/benchbed"
	"github.com/quro-dev/quro/bench/internal/procs"
	"github.com/quro-dev/quro/internal/app"
	"github.com/quro-dev/quro/internal/engine/python"
	"github.com/quro-dev/quro/internal/sandbox"
)

// bed is one real App served over REST (benchbed), whose every session
// runs in its session box (app.New turns SessionBoxes on).
//
// The admission ceilings (sessions per tenant, the tenant's tasks, memory
// and session count) are lifted so that hundreds of sessions can be made;
// the per-box limits and everything else stay the shipped defaults.
// Auto-pause is off so that a long run is not paused under the bench.
type bed struct{ *benchbed.Bed }

// newBed assembles the App in dataDir with the embedded interpreter
// extracted under install (and warmed), issues an exec token and listens
// on 127.0.0.1:0. disk is each session's disk quota (0: the default image,
// negative: none).
func newBed(ctx context.Context, dataDir, install string, disk int64) (*bed, error) {
	a, err := app.New(ctx, dataDir, &app.Options{
		Python: &python.EmbeddedOptions{InstallRoot: install},
		// The interpreter lives outside the data directory here (shared
		// with the tests), so every box must show it, as app.New does
		// for the data directory's own python/: else a session's Python
		// worker does not fit a box its shell opened first and runs in a
		// box of its own (sandbox.BoxStats.Outside).
		Sandbox:        &sandbox.Options{BoxReadOnly: []string{install}},
		AutoPause:      -1,
		PrestartPython: *prestart,
		Limits: app.Limits{SessionsPerTenant: -1,
			Tenant: app.TenantLimits{Sessions: -1, Tasks: -1, Memory: -1, Disk: disk}},
	})
	if err != nil {
		return nil, err
	}
	b, err := benchbed.Serve(ctx, a, false)
	if err != nil {
		return nil, err
	}
	return &bed{b}, nil
}

// pause and resume are pause_session and resume_session; the answer says
// whether the session is paused afterwards and how long the server took.
func (b *bed) pause(ctx context.Context, body []byte) (*app.PauseResult, error) {
	var r app.PauseResult
	if err := b.Post(ctx, "pause_session", body, &r); err != nil {
		return nil, err
	}
	if !r.Paused {
		return nil, fmt.Errorf("pause_session: not paused: %s", r.Note)
	}
	return &r, nil
}

func (b *bed) resume(ctx context.Context, body []byte) (*app.PauseResult, error) {
	var r app.PauseResult
	if err := b.Post(ctx, "resume_session", body, &r); err != nil {
		return nil, err
	}
	if r.Paused || r.Note != "" {
		return nil, fmt.Errorf("resume_session: paused=%v, note %q", r.Paused, r.Note)
	}
	return &r, nil
}

// resources is get_session_status's resources of a session.
func (b *bed) resources(ctx context.Context, id string) (*app.SessionResources, error) {
	var s app.SessionInfo
	if err := b.Post(ctx, "get_session_status", benchbed.RefBody(id), &s); err != nil {
		return nil, err
	}
	if s.Resources == nil {
		return nil, fmt.Errorf("get_session_status of %s: no resources (no box?)", id)
	}
	return s.Resources, nil
}

// terminalExec runs command in the session's shell; it must exit 0.
func (b *bed) terminalExec(ctx context.Context, id, command string) error {
	var out struct {
		ExitCode int    `json:"exit_code"`
		Output   string `json:"output"`
	}
	if err := b.Post(ctx, "terminal_exec", benchbed.MustJSON(app.TerminalExecInput{Session: id, Command: command}), &out); err != nil {
		return err
	}
	if out.ExitCode != 0 {
		return fmt.Errorf("terminal_exec %q: exit %d, output %q", command, out.ExitCode, out.Output)
	}
	return nil
}

// The two baselines of a one-shot run, exec'd by the bench itself.

// bwrapTrue is `bwrap --unshare-all --ro-bind / / true`.
func bwrapTrue() error {
	return exec.Command("bwrap", "--unshare-all", "--ro-bind", "/", "/", "true").Run()
}

// forkTrue is a bare fork-exec of /bin/true.
func forkTrue() error { return exec.Command("/bin/true").Run() }

// heapCode makes a 100 MiB bytearray x and writes one byte in every page,
// so that all of it is resident.
const heapCode = "x = bytearray(100*1024*1024)\nx[::4096] = b'1' * len(x[::4096])\nprint(len(x))"

const heapLen = "104857600\n"

// Proportional set size of the processes of the boxes.

// cpuOf is the CPU time (user+system) of every process below this one
// named comm, in seconds.
func cpuOf(comm string) (float64, int) {
	ps, err := procs.Read()
	if err != nil {
		return 0, 0
	}
	var ticks int64
	n := 0
	for _, p := range procs.Descendants(ps, os.Getpid()) {
		if p.Comm != comm {
			continue
		}
		data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p.PID))
		if err != nil {
			continue
		}
		s := string(data)
		f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
		if len(f) < 13 {
			continue
		}
		ut, _ := strconv.ParseInt(f[11], 10, 64) // field 14 of stat
		st, _ := strconv.ParseInt(f[12], 10, 64) // field 15
		ticks += ut + st
		n++
	}
	return float64(ticks) / 100, n // USER_HZ is 100 on Linux
}

// pss is a process's proportional set size (smaps_rollup's Pss) and its
// private memory (Private_Clean + Private_Dirty), bytes.
func pss(pid int) (pss, private int64, err error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
	if err != nil {
		return 0, 0, err
	}
	found := false
	for l := range strings.Lines(string(data)) {
		f := strings.Fields(l)
		if len(f) < 2 {
			continue
		}
		kb, _ := strconv.ParseInt(f[1], 10, 64)
		switch f[0] {
		case "Pss:":
			pss, found = kb<<10, true
		case "Private_Clean:", "Private_Dirty:":
			private += kb << 10
		}
	}
	if !found {
		return 0, 0, fmt.Errorf("pid %d: no Pss line", pid)
	}
	return pss, private, nil
}

// pssReport is the PSS of this process (the server) and of every process
// below it, by command name.
type pssReport struct {
	Server   int64            `json:"server_bytes"`
	Boxes    int64            `json:"boxes_bytes"`
	Procs    int              `json:"box_processes"`
	ByComm   map[string]int64 `json:"by_comm_bytes"`
	PrivComm map[string]int64 `json:"by_comm_private_bytes"`
	Threads  map[string]int   `json:"by_comm_threads"`
	NComm    map[string]int   `json:"by_comm_processes"`
}

func measurePSS() (*pssReport, error) {
	ps, err := procs.Read()
	if err != nil {
		return nil, err
	}
	r := &pssReport{ByComm: map[string]int64{}, NComm: map[string]int{}, PrivComm: map[string]int64{}, Threads: map[string]int{}}
	if r.Server, _, err = pss(os.Getpid()); err != nil {
		return nil, err
	}
	for i, p := range procs.Descendants(ps, os.Getpid()) {
		if i < *treeLines {
			args, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", p.PID))
			fmt.Fprintf(os.Stderr, "   pid %d ppid %d %s: %.150s\n", p.PID, p.PPID, p.Comm, bytes.ReplaceAll(args, []byte{0}, []byte{' '}))
		}
		v, priv, err := pss(p.PID)
		if err != nil {
			continue // ended meanwhile, or a kernel thread
		}
		r.Boxes += v
		r.Procs++
		r.ByComm[p.Comm] += v
		r.NComm[p.Comm]++
		r.PrivComm[p.Comm] += priv
		if st, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.PID)); err == nil {
			for l := range strings.Lines(string(st)) {
				if v, ok := strings.CutPrefix(l, "Threads:"); ok {
					n, _ := strconv.Atoi(strings.TrimSpace(v))
					r.Threads[p.Comm] += n
				}
			}
		}
	}
	return r, nil
}
