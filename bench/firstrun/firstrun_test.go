package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/quro-dev/quro/bench/internal/benchbed"
	"github.com/quro-dev/quro/internal/app"
	"github.com/quro-dev/quro/internal/runcode"
)

// BenchmarkFirstRunFreshDataDir is this tree's code alone, in-process: for
// each iteration an App on an empty data directory (the embedded
// interpreter extracted into it), served over REST by benchbed (which
// waits for the preparation), then run_code print(1) in the default
// session. It reports the medians of the preparation (App and extraction)
// and of the run, as prep-ms and run-ms:
//
//	go test -run '^$' -bench . -benchtime 5x ./bench/firstrun/
//
// The program (main.go) compares built binaries, started as `quro serve`.
func BenchmarkFirstRunFreshDataDir(b *testing.B) {
	ctx := context.Background()
	body, _ := json.Marshal(app.RunCodeInput{Code: "print(1)"})
	var preps, runs []time.Duration
	for b.Loop() {
		dir, err := os.MkdirTemp("", "quro-bench-firstrun-")
		if err != nil {
			b.Fatal(err)
		}
		t0 := time.Now()
		a, err := app.New(ctx, dir, nil)
		if err != nil {
			b.Fatal(err)
		}
		bed, err := benchbed.Serve(ctx, a, false)
		if err != nil {
			os.RemoveAll(dir)
			b.Fatal(err)
		}
		// The runs' tenant is one of their own, as in main.go (-tenant).
		iss, err := a.CreateToken(ctx, "bench", "bench-firstrun", []string{"exec"}, "bench")
		if err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		var res runcode.Result
		err = post(ctx, bed, iss.Token, body, &res)
		t2 := time.Now()
		bed.Close()
		os.RemoveAll(dir)
		if err != nil || res.Stdout != "1\n" {
			b.Fatalf("run_code: %v %+v", err, res)
		}
		preps, runs = append(preps, t1.Sub(t0)), append(runs, t2.Sub(t1))
	}
	b.ReportMetric(medianMS(preps), "prep-ms")
	b.ReportMetric(medianMS(runs), "run-ms")
}

// post is POST /v1/run_code with token, decoded into out.
func post(ctx context.Context, bed *benchbed.Bed, token string, body []byte, out *runcode.Result) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, bed.URL+"/v1/run_code", bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("HTTP %d: %s", resp.StatusCode, bytes.TrimSpace(data))
	}
	return json.Unmarshal(data, out)
}

func medianMS(ds []time.Duration) float64 {
	slices.Sort(ds)
	return ms1(ds[len(ds)/2])
}
