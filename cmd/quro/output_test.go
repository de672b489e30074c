package main

import (
	"bytes"
	"strings"
	"syscall"
	"testing"
)

// fullWriter is a stdout on a full disk: every write fails.
type fullWriter struct{}

func (fullWriter) Write([]byte) (int, error) { return 0, syscall.ENOSPC }

// TestOutputThatDidNotReachStdoutFails: a result that could not be written
// to stdout (a full disk, a closed pipe) is a failed command (status 1 and
// the reason on stderr), never a silent success.
func TestOutputThatDidNotReachStdoutFails(t *testing.T) {
	data := t.TempDir()
	for _, args := range [][]string{
		{"call", "--data", data, "run_code", `{"lang":"sh","code":"echo 42"}`},
		{"call", "--data", data, "--json", "run_code", `{"lang":"sh","code":"echo 42"}`},
		{"run", "--data", data, "-l", "sh", "-c", "echo 42"},
		{"run", "--data", data, "--json", "-l", "sh", "-c", "echo 42"},
	} {
		t.Run(strings.Join(args[3:], " "), func(t *testing.T) {
			var errb bytes.Buffer
			root := newRoot(strings.NewReader(""), fullWriter{}, &errb)
			root.SetArgs(args)
			err := root.Execute()
			if err == nil || !strings.Contains(err.Error(), "no space left on device") {
				t.Fatalf("err %v (stderr %q), want the failed write", err, errb.String())
			}
		})
	}
}
