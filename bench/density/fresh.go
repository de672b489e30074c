package main

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"time"

	"github.com/quro-dev/quro/bench/internal/benchbed"
	"github.com/quro-dev/quro/internal/app"
)

// bwrapTrue is `bwrap --unshare-all --ro-bind / / true`, exec'd by the
// bench itself: what a one-shot run costs with nothing of Quro's.
func bwrapTrue() error {
	out, err := exec.Command("bwrap", "--unshare-all", "--ro-bind", "/", "/", "true").CombinedOutput()
	if err != nil {
		return fmt.Errorf("%w: %s", err, strings.TrimSpace(string(out)))
	}
	return nil
}

// freshRuns times -fresh new Apps, each on an empty data directory (the
// embedded Python extracted into it, in the background from the start as
// quro serve does), from app.New until the first run_code print(1) in
// the default session answers over REST; then as many Jupyter cold starts.
func freshRuns(r *results) error {
	f := &freshResult{Quro: &series{Name: "fresh data directory: app.New → first print(1)"}}
	r.Fresh = f
	for i := range *fresh {
		fmt.Fprintf(os.Stderr, "fresh data directory %d of %d ...\n", i+1, *fresh)
		d, err := freshOnce()
		if err != nil {
			return fmt.Errorf("fresh data directory: %w", err)
		}
		f.Quro.D = append(f.Quro.D, d)
	}
	if *jupyter == "" {
		f.Skip = "-jupyter-python is empty"
		return nil
	}
	if f.Skip = lacksJupyter(); f.Skip != "" {
		return nil
	}
	f.Jupyter = &series{Name: "Jupyter cold start: start_new_kernel → execute print(1) reply"}
	for range *fresh {
		d, err := jupyterOnce()
		if err != nil {
			return fmt.Errorf("jupyter cold start: %w", err)
		}
		f.Jupyter.D = append(f.Jupyter.D, d)
	}
	return nil
}

// lacksJupyter says why -jupyter-python cannot start a kernel ("": it can).
func lacksJupyter() string {
	out, err := exec.Command(*jupyter, "-c", "import ipykernel, jupyter_client").CombinedOutput()
	if err == nil {
		return ""
	}
	return fmt.Sprintf("%s has no ipykernel and jupyter_client: %s (apt-get install python3-ipykernel python3-jupyter-client)",
		*jupyter, strings.TrimSpace(lastLine(string(out))))
}

func freshOnce() (time.Duration, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	dir, err := os.MkdirTemp("", "quro-bench-fresh-")
	if err != nil {
		return 0, err
	}
	defer os.RemoveAll(dir)
	start := time.Now()
	a, err := app.New(ctx, dir, appOptions("", *shipped, *disk))
	if err != nil {
		return 0, err
	}
	go a.PreparePython(ctx)
	b, err := benchbed.ServeCold(ctx, a)
	if err != nil {
		return 0, err
	}
	defer b.Close()
	bb := &bed{b}
	if err := bb.Run(ctx, benchbed.RunBody("", "", "print(1)"), "1\n"); err != nil {
		return 0, err
	}
	return time.Since(start), nil
}

// jupyterScript starts a kernel, runs print(1), prints "done" once the
// reply and its output came, then shuts the kernel down.
const jupyterScript = `
from jupyter_client.manager import start_new_kernel
km, kc = start_new_kernel(kernel_name="python3")
mid = kc.execute("print(1)")
while True:
    m = kc.get_iopub_msg(timeout=60)
    if m["parent_header"].get("msg_id") == mid and m["msg_type"] == "stream" and "1" in m["content"].get("text", ""):
        break
print("done", flush=True)
kc.stop_channels()
km.shutdown_kernel(now=True)
`

// jupyterOnce is the time from the spawn of the driver to its "done":
// the interpreter's and jupyter_client's start included, as a server's
// start is included in freshOnce.
func jupyterOnce() (time.Duration, error) {
	cmd := exec.Command(*jupyter, "-c", jupyterScript)
	out, err := cmd.StdoutPipe()
	if err != nil {
		return 0, err
	}
	cmd.Stderr = os.Stderr
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return 0, err
	}
	sc := bufio.NewScanner(out)
	var d time.Duration
	for sc.Scan() {
		if strings.TrimSpace(sc.Text()) == "done" && d == 0 {
			d = time.Since(start)
		}
	}
	if err := cmd.Wait(); err != nil {
		return 0, err
	}
	if d == 0 {
		return 0, fmt.Errorf("the kernel's print(1) never came")
	}
	return d, nil
}

func lastLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		return s[i+1:]
	}
	return s
}
