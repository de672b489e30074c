package e2b_test

import (
	"context"
	"encoding/base64"
	"strings"
	"testing"

	"connectrpc.com/connect"

	"github.com/quro-dev/quro/internal/api/e2b/gen/process"
)

// envd's process errors, each as E2B's envd answers it (its Connect
// code, which the SDKs map to their error classes: invalid_argument to
// InvalidArgumentError, not_found to NotFoundError and kill() false,
// unauthenticated to AuthenticationError; unavailable would read as the
// sandbox timing out), with a message that names the sandbox's paths
// only. docs/e2b.md lists where Quro answers otherwise, and why.
func TestEnvdErrorsAsEnvd(t *testing.T) {
	e := newEnv(t, nil)
	id := e.newSession(t)
	c := e.procClient(id)
	ctx := context.Background()

	// Starts that must start nothing.
	start := func(req *process.StartRequest, user string) error {
		r := connect.NewRequest(req)
		r.Header().Set("Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte(user+":")))
		s, err := c.Start(ctx, r)
		if err != nil {
			return err
		}
		for s.Receive() {
			t.Errorf("%v as %q: an event %v", req.GetProcess(), user, s.Msg())
		}
		return s.Err()
	}
	program := func(cmd, cwd string, args ...string) *process.StartRequest {
		cfg := &process.ProcessConfig{Cmd: cmd, Args: args}
		if cwd != "" {
			cfg.Cwd = &cwd
		}
		return &process.StartRequest{Process: cfg}
	}
	// An ended process, and a running one with stdin, one without.
	ev := e.start(t, id, bash("exit 0", false), nil)
	ended := ev.startPid(t)
	ev.end(t)
	withStdin := e.start(t, id, bash("echo up; exec sleep 100000", true), nil)
	reading := withStdin.startPid(t)
	withStdin.until(t, "stdout", "up\n")
	noStdin := e.start(t, id, bash("echo up; exec sleep 100000", false), nil)
	deaf := noStdin.startPid(t)
	noStdin.until(t, "stdout", "up\n")
	for _, pid := range []uint32{reading, deaf} {
		t.Cleanup(func() {
			_, _ = c.SendSignal(ctx, connect.NewRequest(&process.SendSignalRequest{Process: pidSel(pid), Signal: process.Signal_SIGNAL_SIGKILL}))
		})
	}
	stdin := func(b string) *process.ProcessInput {
		return &process.ProcessInput{Input: &process.ProcessInput_Stdin{Stdin: []byte(b)}}
	}
	connectTo := func(sel *process.ProcessSelector) error {
		s, err := c.Connect(ctx, connect.NewRequest(&process.ConnectRequest{Process: sel}))
		if err != nil {
			return err
		}
		for s.Receive() {
			if s.Msg().GetEvent().GetStart() != nil {
				t.Errorf("connect to %v: a start event", sel)
			}
		}
		return s.Err()
	}
	tagSel := func(tag string) *process.ProcessSelector {
		return &process.ProcessSelector{Selector: &process.ProcessSelector_Tag{Tag: tag}}
	}

	for _, tc := range []struct {
		name string
		call func() error
		code connect.Code // 0: no error, as envd
		msg  string
	}{
		// Start: the program or its directory is the caller's mistake
		// (envd: invalid_argument), never an outage (unavailable).
		{"start: no such program in PATH", func() error { return start(program("quro-no-such-program", ""), "user") },
			connect.CodeInvalidArgument, "cannot start quro-no-such-program: quro-no-such-program: executable file not found"},
		{"start: no such file", func() error { return start(program("/home/user/no-such-file", ""), "user") },
			connect.CodeInvalidArgument, "/home/user/no-such-file: no such file or directory"},
		{"start: not executable", func() error { return start(program("/etc/passwd", ""), "user") },
			connect.CodeInvalidArgument, "/etc/passwd: not an executable file"},
		{"start: cwd missing", func() error { return start(program("/bin/pwd", "/home/user/no-such-dir"), "user") },
			connect.CodeInvalidArgument, "cwd /home/user/no-such-dir does not exist"},
		{"start: relative cwd missing", func() error { return start(program("/bin/pwd", "no-such-dir"), "user") },
			connect.CodeInvalidArgument, "cwd /home/user/no-such-dir does not exist"},
		{"start: cwd missing outside the workspace", func() error { return start(program("/bin/pwd", "/no-such-dir/x"), "user") },
			connect.CodeInvalidArgument, "cwd /no-such-dir/x does not exist"},
		{"start: cwd a file", func() error { return start(program("/bin/pwd", "/etc/passwd"), "user") },
			connect.CodeInvalidArgument, "cwd /etc/passwd is a file"},
		{"start: no such user", func() error { return start(program("/bin/true", ""), "quro-no-such-user") },
			connect.CodeUnauthenticated, `user "quro-no-such-user"`},
		{"start: root (Quro's refusal)", func() error { return start(program("/bin/true", ""), "root") },
			connect.CodePermissionDenied, "has no root"},

		// A process that has ended, or never was: not_found everywhere.
		{"signal: ended", func() error {
			_, err := c.SendSignal(ctx, connect.NewRequest(&process.SendSignalRequest{Process: pidSel(ended), Signal: process.Signal_SIGNAL_SIGKILL}))
			return err
		}, connect.CodeNotFound, "no running process with pid"},
		{"signal: pid 0", func() error {
			_, err := c.SendSignal(ctx, connect.NewRequest(&process.SendSignalRequest{Process: pidSel(0), Signal: process.Signal_SIGNAL_SIGKILL}))
			return err
		}, connect.CodeNotFound, "pid 0"},
		{"signal: empty tag", func() error {
			_, err := c.SendSignal(ctx, connect.NewRequest(&process.SendSignalRequest{Process: tagSel(""), Signal: process.Signal_SIGNAL_SIGTERM}))
			return err
		}, connect.CodeNotFound, "empty tag"},
		{"signal: unknown tag", func() error {
			_, err := c.SendSignal(ctx, connect.NewRequest(&process.SendSignalRequest{Process: tagSel("quro-none"), Signal: process.Signal_SIGNAL_SIGTERM}))
			return err
		}, connect.CodeNotFound, `tag "quro-none"`},
		{"input: ended", func() error {
			_, err := c.SendInput(ctx, connect.NewRequest(&process.SendInputRequest{Process: pidSel(ended), Input: stdin("x")}))
			return err
		}, connect.CodeNotFound, "no running process with pid"},
		{"close stdin: ended", func() error {
			_, err := c.CloseStdin(ctx, connect.NewRequest(&process.CloseStdinRequest{Process: pidSel(ended)}))
			return err
		}, connect.CodeNotFound, "no running process with pid"},
		{"resize: ended", func() error {
			_, err := c.Update(ctx, connect.NewRequest(&process.UpdateRequest{Process: pidSel(ended), Pty: &process.PTY{Size: &process.PTY_Size{Cols: 80, Rows: 24}}}))
			return err
		}, connect.CodeNotFound, "no running process with pid"},
		{"connect: ended", func() error { return connectTo(pidSel(ended)) }, connect.CodeNotFound, "no running process with pid"},

		// Requests no SDK sends: envd's unimplemented.
		{"signal: no selector", func() error {
			_, err := c.SendSignal(ctx, connect.NewRequest(&process.SendSignalRequest{Signal: process.Signal_SIGNAL_SIGKILL}))
			return err
		}, connect.CodeUnimplemented, "process.pid or process.tag"},
		{"signal: unspecified", func() error {
			_, err := c.SendSignal(ctx, connect.NewRequest(&process.SendSignalRequest{Process: pidSel(reading)}))
			return err
		}, connect.CodeUnimplemented, "SIGNAL_UNSPECIFIED"},
		{"input: empty", func() error {
			_, err := c.SendInput(ctx, connect.NewRequest(&process.SendInputRequest{Process: pidSel(reading), Input: &process.ProcessInput{}}))
			return err
		}, connect.CodeUnimplemented, "input is empty"},

		// stdin: closing one closed already, or never opened, does
		// nothing (envd); input without stdin is Quro's
		// invalid_argument (envd's internal: docs/e2b.md).
		{"close stdin: open", func() error {
			_, err := c.CloseStdin(ctx, connect.NewRequest(&process.CloseStdinRequest{Process: pidSel(reading)}))
			return err
		}, 0, ""},
		{"close stdin: closed already", func() error {
			_, err := c.CloseStdin(ctx, connect.NewRequest(&process.CloseStdinRequest{Process: pidSel(reading)}))
			return err
		}, 0, ""},
		{"close stdin: never opened", func() error {
			_, err := c.CloseStdin(ctx, connect.NewRequest(&process.CloseStdinRequest{Process: pidSel(deaf)}))
			return err
		}, 0, ""},
		{"input: no stdin", func() error {
			_, err := c.SendInput(ctx, connect.NewRequest(&process.SendInputRequest{Process: pidSel(deaf), Input: stdin("x")}))
			return err
		}, connect.CodeInvalidArgument, "has no stdin"},
	} {
		err := tc.call()
		switch {
		case tc.code == 0 && err != nil:
			t.Errorf("%s: %v, want no error", tc.name, err)
		case tc.code != 0 && (connect.CodeOf(err) != tc.code || !strings.Contains(err.Error(), tc.msg)):
			t.Errorf("%s: %v, want %v with %q", tc.name, err, tc.code, tc.msg)
		case err != nil && strings.Contains(err.Error(), strings.SplitN(t.Name(), "/", 2)[0]):
			t.Errorf("%s: the message names the data directory: %v", tc.name, err)
		}
	}

	// With a cwd, the box's sh enters it and then runs the program: a
	// missing one is the process's exit 127, as envd (which starts every
	// program through sh) answers every missing program.
	ev = e.start(t, id, program("quro-no-such-program", "/tmp"), nil)
	ev.startPid(t)
	if end, _, stderr := ev.end(t); end.GetExitCode() != 127 || !strings.Contains(stderr, "quro-no-such-program: not found") {
		t.Errorf("a missing program with a cwd: %v, stderr %q", end, stderr)
	}
}
