package terminal

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/quro-dev/quro/internal/sandbox"
	"github.com/quro-dev/quro/internal/session"
)

// TestHeldShellCannotForgeCompletion: while a person holds a session's
// shell the agent's commands and input are refused, saying a person holds
// it; the person's own commands — the forgery attack, and a forged record
// typed into a command that reads its input — get their true exit codes;
// after the hand back the agent's command runs and gets its own result.
func TestHeldShellCannotForgeCompletion(t *testing.T) {
	sb, err := sandbox.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	s := &session.Session{ID: "fedcba9876543210fedcba9876543210", Name: "held", Dir: t.TempDir()}
	os.MkdirAll(s.Workspace(), 0o755)
	os.MkdirAll(s.TmpDir(), 0o755)
	m := NewManager(sb, nil)
	t.Cleanup(m.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	run := func(ctx context.Context, cmd string) *Result {
		t.Helper()
		res, err := m.Exec(ctx, s, cmd, ExecOptions{Timeout: time.Minute})
		if err != nil {
			t.Fatalf("Exec(%.40q): %v", cmd, err)
		}
		return res
	}
	if res := run(ctx, "echo before"); res.ExitCode != 0 || res.Output != "before\n" {
		t.Fatalf("before the take: %+v", res)
	}

	if err := m.Take(s, "person-key"); err != nil {
		t.Fatal(err)
	}
	if !m.Held(s) {
		t.Fatal("Held is false after Take")
	}
	// The agent (any call without the key) runs nothing.
	_, err = m.Exec(ctx, s, "touch agent-ran", ExecOptions{})
	var he *HeldError
	if !errors.As(err, &he) || !errors.Is(err, ErrHeld) || !strings.Contains(err.Error(), "a person holds this session") ||
		!strings.Contains(err.Error(), "hand it back") {
		t.Fatalf("agent's command while held: %v", err)
	}
	if _, err := os.Stat(s.Workspace() + "/agent-ran"); err == nil {
		t.Fatal("the agent's refused command ran")
	}
	if err := m.CheckHold(ctx, s); !errors.Is(err, ErrHeld) {
		t.Fatalf("agent's input while held: %v", err)
	}
	// A key is not a guessable value: another key (another person, or a
	// caller that made one up) is refused too.
	if err := m.Take(s, "other"); !errors.Is(err, ErrHeld) {
		t.Fatalf("a second take: %v", err)
	}
	if _, err := m.Exec(WithHolder(ctx, "other"), s, "true", ExecOptions{}); !errors.Is(err, ErrHeld) {
		t.Fatalf("a command under another key: %v", err)
	}

	person := WithHolder(ctx, "person-key")
	// The person's command is framed as any command: the forgery attack
	// gets its true exit code and directory.
	res := run(person, attackScript)
	if res.ExitCode != 42 || res.Cwd != "/home/user/real" || res.ShellRestarted {
		t.Fatalf("the person's attack forged its result: exit %d cwd %q restarted %v\n%s", res.ExitCode, res.Cwd, res.ShellRestarted, reportLines(res.Output))
	}
	run(person, "touch stop; cd ..")
	// What a person types into a running command goes to its stdin, not
	// to the protocol: a forged record typed as input ends nothing.
	sh, err := m.Shell(s)
	if err != nil {
		t.Fatal(err)
	}
	res = run(person, `read -r a; printf 'got %s\n' "$a"; read -r b; (exit 5)`)
	if !res.Running {
		t.Fatalf("a command reading its input did not wait for it: %+v", res)
	}
	forged := "00000000000000000000000000000000:0:end\x00\n"
	for i := 0; i < 2; i++ {
		if err := sh.SendInput(forged); err != nil {
			t.Fatal(err)
		}
		if res, err = sh.Wait(person, time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	if res.Running || res.ExitCode != 5 || !strings.Contains(res.Output, "got 00000000000000000000000000000000:0:end") {
		t.Fatalf("typed forgery: running %v exit %d output %q", res.Running, res.ExitCode, res.Output)
	}

	if m.HandBack(s, "other") || !m.HandBack(s, "person-key") || m.Held(s) {
		t.Fatal("hand back: only the holder's key ends the hold")
	}
	if res := run(ctx, "echo agent; (exit 3)"); res.ExitCode != 3 || !strings.Contains(res.Output, "agent\n") || res.Cwd != "/home/user" {
		t.Fatalf("the agent's command after the hand back: %+v", res)
	}
}
