package transpile

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime/debug"
	"strconv"
	"strings"

	"github.com/evanw/esbuild/pkg/api"
	"golang.org/x/sys/unix"
)

// The child's own bounds, set before it reads the request.
const (
	childAddressSpace = 3 << 30  // bytes of virtual memory
	childStack        = 64 << 20 // a goroutine's stack: some 16,000 levels of nesting, far beyond real code
)

// childMain is the esbuild child: args is the CPU seconds it may use.
func childMain(args []string, in io.Reader, out io.Writer) int {
	if len(args) != 1 {
		fmt.Fprintln(os.Stderr, "usage: quro", Arg, "CPU-SECONDS")
		return 2
	}
	cpu, err := strconv.ParseUint(args[0], 10, 16)
	if err != nil || cpu == 0 {
		fmt.Fprintln(os.Stderr, "transpile: bad CPU seconds")
		return 2
	}
	if err := confine(cpu); err != nil {
		fmt.Fprintln(os.Stderr, "transpile:", err)
		return 2
	}
	// The hello, an empty frame: the server tells a child that could not
	// start (it passes on the child's stderr) from one that died on a
	// request (code that nests too deeply).
	if _, err := out.Write([]byte{0, 0, 0, 0}); err != nil {
		return 2
	}
	for {
		body, err := readFrame(in, 2*MaxSource+4096)
		if errors.Is(err, io.EOF) {
			return 0 // the server is done with this child
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "transpile:", err)
			return 2
		}
		var req Request
		dec := json.NewDecoder(bytes.NewReader(body))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&req); err != nil || len(req.Src) > MaxSource || (req.Target != ES2022 && req.Target != ESNext) {
			fmt.Fprintln(os.Stderr, "transpile: bad request")
			return 2
		}
		reply, err := json.Marshal(transform(&req))
		if err != nil {
			return 2
		}
		frame := binary.BigEndian.AppendUint32(make([]byte, 0, 4+len(reply)), uint32(len(reply)))
		if _, err := out.Write(append(frame, reply...)); err != nil {
			return 2
		}
	}
}

// confine drops every capability, sets no_new_privs and limits the
// process's address space, CPU time and stack.
func confine(cpu uint64) error {
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("no_new_privs: %w", err)
	}
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capset(&hdr, &data[0]); err != nil && !capless() {
		// A seccomp policy (quro run as a box's workload) may refuse
		// capset; that is fine only when there is nothing to drop.
		return fmt.Errorf("dropping capabilities: %w", err)
	}
	if err := lower(unix.RLIMIT_AS, childAddressSpace, childAddressSpace); err != nil {
		return fmt.Errorf("address space limit: %w", err)
	}
	if err := lower(unix.RLIMIT_CPU, cpu, cpu+1); err != nil {
		return fmt.Errorf("CPU limit: %w", err)
	}
	debug.SetMaxStack(childStack)
	return nil
}

// lower sets resource's soft and hard limits to at most soft and hard: a
// limit the child already has that is lower (a box's, when quro runs
// inside one) stays, since raising a hard limit is refused.
func lower(resource int, soft, hard uint64) error {
	var cur unix.Rlimit
	if err := unix.Getrlimit(resource, &cur); err != nil {
		return err
	}
	lim := unix.Rlimit{Cur: min(cur.Cur, soft), Max: min(cur.Max, hard)}
	lim.Cur = min(lim.Cur, lim.Max)
	return unix.Setrlimit(resource, &lim)
}

// capless reports whether the process holds no capability at all.
func capless() bool {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if unix.Capget(&hdr, &data[0]) != nil {
		return false
	}
	for _, d := range data {
		if d.Effective != 0 || d.Permitted != 0 || d.Inheritable != 0 {
			return false
		}
	}
	return true
}

const tlaCJS = "Top-level await is currently not supported with the \"cjs\" output format"

// transform is esbuild's transform of req, in this process (the child's).
// A source with top-level await, which CommonJS cannot hold, keeps its ES
// syntax: both engines run it as an async script.
func transform(req *Request) *Result {
	loader := api.LoaderJS
	if req.TS {
		loader = api.LoaderTS
	}
	target := api.ES2022
	if req.Target == ESNext {
		target = api.ESNext
	}
	opts := api.TransformOptions{
		Loader:     loader,
		Format:     api.FormatCommonJS,
		Sourcefile: req.File,
		Target:     target,
		LogLevel:   api.LogLevelSilent,
	}
	if req.SourceMap {
		opts.Sourcemap = api.SourceMapExternal
	}
	r := api.Transform(req.Src, opts)
	if len(r.Errors) == 1 && strings.Contains(r.Errors[0].Text, tlaCJS) {
		opts.Format = api.FormatDefault
		r = api.Transform(req.Src, opts)
	}
	if len(r.Errors) > 0 {
		res := &Result{}
		for _, m := range r.Errors[:min(len(r.Errors), maxDiagnostics)] {
			d := Diagnostic{Text: m.Text}
			if m.Location != nil {
				d.Line, d.Column, d.LineText = m.Location.Line, m.Location.Column+1, m.Location.LineText
				if d.Line < 1 {
					d.Line = 1
				}
			}
			res.Errors = append(res.Errors, d)
		}
		return res
	}
	return &Result{Code: string(r.Code), Map: r.Map}
}
