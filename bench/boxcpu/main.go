// Command boxcpu measures what the boxes' CPU weight (quro serve
// --box-cpu-weight) does to a box's commands beside busy host work (see
// bench/README.md):
//
//	stress-ng --cpu 2 &            # the host's other work, in the host's cgroup
//	go run ./bench/boxcpu -n 10    # as root: session boxes, and the weight is written
//
// One App is served over REST on a loopback listener with a real token,
// its sessions in session boxes. Round by round it alternates the weight
// of the group that holds every box (quro/: -a, then -b; the order
// reversed every other round) and, at each, times -calls REST calls of
// run_code sh `cat /proc/$$/schedstat` in a warm session — the call's wall
// time and the time the box's shell waited in the run queue — and the
// same `sh -c` started plainly on the host, outside any box. It prints
// the medians per weight and the ratios. It writes the weight of the
// machine's shared quro/ group while it runs, and puts back the weight it
// found when it ends.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/quro-dev/quro/bench/internal/benchbed"
	"github.com/quro-dev/quro/bench/internal/procs"
	"github.com/quro-dev/quro/internal/app"
	"github.com/quro-dev/quro/internal/runcode"
	"github.com/quro-dev/quro/internal/sandbox"
)

var (
	rounds = flag.Int("n", 10, "rounds; each runs both weights")
	calls  = flag.Int("calls", 10, "calls per weight and round")
	wa     = flag.Int("a", sandbox.CPUWeightDefault, "first weight (cpu.weight's scale; 100, the kernel's default, is the old behaviour)")
	wb     = flag.Int("b", sandbox.MachineBoxCPUWeight(), "second weight (default: the machine's, quro serve's default)")
)

func main() {
	flag.Parse()
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "boxcpu:", err)
		os.Exit(1)
	}
}

// sample is one call: its wall time and the shell's run-queue wait, ms.
type sample struct{ wall, wait float64 }

func run() error {
	if os.Geteuid() != 0 {
		return fmt.Errorf("run as root: the weight is written to the cgroup that holds the boxes")
	}
	for _, w := range []int{*wa, *wb} {
		if err := sandbox.CheckCPUWeight(w); err != nil {
			return err
		}
	}
	ctx := context.Background()
	data, err := os.MkdirTemp("", "quro-bench-boxcpu-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(data)
	a, err := app.New(ctx, data, &app.Options{AutoPause: -1,
		Limits: app.Limits{SessionsPerTenant: -1, Tenant: app.TenantLimits{Sessions: -1, Tasks: -1, Memory: -1}}})
	if err != nil {
		return err
	}
	now, _, ok := a.Sandbox.BoxCPUWeight()
	if !ok {
		return fmt.Errorf("no cpu cgroup controller here")
	}
	defer restore(now)
	b, err := benchbed.Serve(ctx, a, false)
	if err != nil {
		return err
	}
	defer b.Close()
	id, err := b.CreateSession(ctx)
	if err != nil {
		return err
	}
	body := benchbed.RunBody(id, "sh", "cat /proc/$$/schedstat")
	box := func() (sample, error) {
		var r runcode.Result
		t := time.Now()
		if err := b.Post(ctx, "run_code", body, &r); err != nil {
			return sample{}, err
		}
		d := time.Since(t)
		if r.ExitCode != 0 || r.Error != "" {
			return sample{}, fmt.Errorf("run_code sh: exit %d, %q %q", r.ExitCode, r.Error, r.Stderr)
		}
		return parse(d, r.Stdout)
	}
	host := func() (sample, error) {
		t := time.Now()
		out, err := exec.Command("sh", "-c", "cat /proc/$$/schedstat").Output()
		if err != nil {
			return sample{}, err
		}
		return parse(time.Since(t), string(out))
	}
	if _, err := box(); err != nil { // the session's box is warm from here on
		return err
	}
	got := map[string][]sample{}
	key := func(w int, where string) string { return fmt.Sprintf("%s at weight %d", where, w) }
	load0 := procs.LoadAvg()
	for i := range *rounds {
		order := []int{*wa, *wb}
		if i%2 == 1 {
			slices.Reverse(order)
		}
		for _, w := range order {
			if err := write(now, w); err != nil {
				return err
			}
			for range *calls {
				s, err := box()
				if err != nil {
					return err
				}
				got[key(w, "box")] = append(got[key(w, "box")], s)
				if s, err = host(); err != nil {
					return err
				}
				got[key(w, "host")] = append(got[key(w, "host")], s)
			}
		}
		fmt.Fprintf(os.Stderr, "round %d, load %s\n", i+1, procs.LoadAvg())
	}
	fmt.Printf("%d rounds × %d calls per weight, weights %d and %d (cpu.weight's scale) on %s, load average %s → %s\n",
		*rounds, *calls, *wa, *wb, now.File, load0, procs.LoadAvg())
	med := func(xs []sample, f func(sample) float64) float64 {
		v := make([]float64, len(xs))
		for i, x := range xs {
			v[i] = f(x)
		}
		slices.Sort(v)
		return v[len(v)/2]
	}
	wall := func(s sample) float64 { return s.wall }
	wait := func(s sample) float64 { return s.wait }
	for _, where := range []string{"box", "host"} {
		for _, w := range []int{*wa, *wb} {
			xs := got[key(w, where)]
			fmt.Printf("  %-22s wall median %7.1f ms, run-queue wait median %7.1f ms\n", key(w, where), med(xs, wall), med(xs, wait))
		}
	}
	ba, bb := got[key(*wa, "box")], got[key(*wb, "box")]
	fmt.Printf("  box: wall %d/%d %.2f, run-queue wait %d/%d %.2f\n", *wb, *wa, med(bb, wall)/med(ba, wall), *wb, *wa, med(bb, wait)/med(ba, wait))
	return nil
}

// parse reads /proc/PID/schedstat's second field (ns waiting on a run
// queue).
func parse(d time.Duration, out string) (sample, error) {
	f := strings.Fields(out)
	if len(f) != 3 {
		return sample{}, fmt.Errorf("schedstat: %q", out)
	}
	ns, err := strconv.ParseUint(f[1], 10, 64)
	if err != nil {
		return sample{}, err
	}
	return sample{wall: float64(d.Microseconds()) / 1e3, wait: float64(ns) / 1e6}, nil
}

// write sets the weight of the group that holds the boxes.
func write(now sandbox.CPUWeight, w int) error {
	v := strconv.Itoa(w)
	if now.Shares != 0 {
		v = strconv.FormatUint((uint64(w)*1024+50)/100, 10)
	}
	return os.WriteFile(now.File, []byte(v), 0)
}

// restore puts back the weight found at the start.
func restore(was sandbox.CPUWeight) {
	v := was.Weight
	if was.Shares != 0 {
		v = was.Shares
	}
	_ = os.WriteFile(was.File, []byte(strconv.FormatUint(v, 10)), 0)
}
