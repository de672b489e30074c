package main

import (
	"bytes"
	"errors"
	"os/exec"
	"strings"
	"testing"
)

// cliIn is cli with stdin piped to quro.
func cliIn(t *testing.T, stdin string, args ...string) (string, string, int) {
	t.Helper()
	cmd := exec.Command(quroBin(t), args...)
	cmd.Env = cliEnv()
	cmd.Stdin = strings.NewReader(stdin)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		t.Fatal(err)
	}
	return out.String(), errb.String(), cmd.ProcessState.ExitCode()
}

// TestExecInput: quro exec hands what is piped to it, or --input, to the
// command, byte for byte and then end of input; with neither the command
// reads end of input at once, so one that asks for input ends and leaves
// the session free for the next call. The shell's directory still carries
// over from one call to the next.
func TestExecInput(t *testing.T) {
	t.Parallel()
	data := t.TempDir()
	if out, errs, code := cliIn(t, "a\x00b\n", "exec", "--data", data, "--", "cd /tmp; wc -c"); code != 0 || strings.TrimSpace(out) != "4" {
		t.Fatalf("piped input: %d %q %q", code, out, errs)
	}
	if out, errs, code := cliIn(t, "first\nsecond\n", "exec", "--data", data, "--", "read a; read b; echo \"$b $a\"; pwd"); code != 0 || out != "second first\n/tmp\n" {
		t.Fatalf("piped lines: %d %q %q", code, out, errs)
	}
	if out, errs, code := cli(t, "exec", "--data", data, "--input", "41", "--", "read n; echo $((n + 1))"); code != 0 || out != "42\n" {
		t.Fatalf("--input: %d %q %q", code, out, errs)
	}
	// No input (stdin is /dev/null): the command reads end of input.
	if out, errs, code := cli(t, "exec", "--data", data, "--", "read x || echo 'no input'; cat"); code != 0 || out != "no input\n" {
		t.Fatalf("no input: %d %q %q", code, out, errs)
	}
	// -n: what is piped is not read.
	if out, errs, code := cliIn(t, "ignored\n", "exec", "--data", data, "-n", "--", "cat; echo done"); code != 0 || out != "done\n" {
		t.Fatalf("-n: %d %q %q", code, out, errs)
	}
	// The session is free, and still in /tmp.
	if out, errs, code := cli(t, "exec", "--data", data, "--", "pwd"); code != 0 || out != "/tmp\n" {
		t.Fatalf("the next call: %d %q %q", code, out, errs)
	}
}
