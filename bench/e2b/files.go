package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"text/tabwriter"
	"time"
)

// filesBench runs bench/e2b/files.mjs: a -files-mb file written and read
// through the SDK beside curl on the same /files URL, -files rounds.
func filesBench(ctx context.Context, env []string) error {
	fmt.Fprintf(os.Stderr, "files: %d rounds of a %d MB file ...\n", *nFiles, *filesMB)
	cmd := exec.CommandContext(ctx, nodeBin, "bench/e2b/files.mjs", fmt.Sprint(*nFiles), fmt.Sprint(*filesMB), *filesDir)
	cmd.Env = env
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return fmt.Errorf("node bench/e2b/files.mjs: %v\n%s", err, stderr.String())
	}
	var r struct{ SdkWrite, SdkRead, CurlRead, CurlReadGzip, CurlWrite []int64 }
	if err := json.Unmarshal(out, &r); err != nil {
		return fmt.Errorf("files.mjs: %v: %s", err, out)
	}
	mk := func(name string, us []int64) series {
		s := series{name: name}
		for _, u := range us {
			s.ds = append(s.ds, time.Duration(u)*time.Microsecond)
		}
		return s
	}
	read, write := mk("SDK files.read (bytes)", r.SdkRead), mk("SDK files.write", r.SdkWrite)
	curlRead, curlGzip, curlWrite := mk("curl GET /files", r.CurlRead), mk("curl --compressed GET /files", r.CurlReadGzip), mk("curl POST /files (octet-stream)", r.CurlWrite)
	fmt.Printf("Quro E2B files benchmark: a %d MB file through E2B's SDK (e2b 2.51.0, node %s) beside curl on the same URL;\n%s/%s, %d CPUs, %s, %s\n\n",
		*filesMB, nodeVersion(), runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), runtime.Version(), time.Now().UTC().Format(time.RFC3339))
	tw := tabwriter.NewWriter(os.Stdout, 2, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "step\tn\tmedian\tmax\tSDK/curl (median)\t")
	for _, row := range []struct {
		s, base series
	}{{read, curlRead}, {read, curlGzip}, {write, curlWrite}} {
		fmt.Fprintf(tw, "%s | %s\t%d\t%s | %s\t%s | %s\t%.2fx\t\n", row.s.name, row.base.name, len(row.s.ds),
			fmtD(row.s.q(0.5)), fmtD(row.base.q(0.5)), fmtD(row.s.q(1)), fmtD(row.base.q(1)), float64(row.s.q(0.5))/float64(row.base.q(0.5)))
	}
	tw.Flush()
	verdict := "met"
	if read.q(0.5) > 2*curlRead.q(0.5) {
		verdict = "NOT met"
	}
	fmt.Printf("\ngoal SDK files.read ≤ 2× curl: %s (%s against %s)\n", verdict, fmtD(read.q(0.5)), fmtD(curlRead.q(0.5)))
	return nil
}
