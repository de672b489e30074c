package app

import (
	"context"
	"encoding/json"
	"os/exec"
	"testing"

	"github.com/quro-dev/quro/internal/runcode"
)

// Each run_code benchmark sits beside the bare spawn it wraps, so that one
// `go test -bench` run gives the ratio on the same machine at the same time:
//
//	go test -run '^$' -bench . -benchtime 200x -count 5 ./internal/app/

func benchRun(b *testing.B, lang, code string) {
	a := newApp(b, nil)
	args, _ := json.Marshal(RunCodeInput{Code: code, Lang: lang})
	ctx := context.Background()
	b.ResetTimer()
	for b.Loop() {
		reply, err := a.Controller.Call(ctx, admin, "run_code", args)
		if err != nil {
			b.Fatal(err)
		}
		if res := reply.Output.(*runcode.Result); res.ExitCode != 0 || res.Error != "" {
			b.Fatalf("%+v", res)
		}
	}
}

func benchSpawn(b *testing.B, name string, args ...string) {
	a := newApp(b, nil)
	path, err := a.Sandbox.LookPath(name)
	if err != nil {
		b.Skip(err)
	}
	b.ResetTimer()
	for b.Loop() {
		if out, err := exec.Command(path, args...).CombinedOutput(); err != nil {
			b.Fatalf("%v: %s", err, out)
		}
	}
}

func BenchmarkRunCodeShellTrue(b *testing.B)   { benchRun(b, "sh", "true") }
func BenchmarkBareShTrue(b *testing.B)         { benchSpawn(b, "sh", "-c", "true") }
func BenchmarkRunCodePythonPrint(b *testing.B) { benchRun(b, "python", "print(1)") }
func BenchmarkBarePythonPrint(b *testing.B)    { benchSpawn(b, "python3", "-c", "print(1)") }
