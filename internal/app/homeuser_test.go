package app

import (
	"encoding/json"
	"strings"
	"testing"
)

// TestOneNameForTheWorkspace: what a model reads names the workspace
// /home/user, never the server's data directory, and every path it sends
// may be /home/user/x or x.
func TestOneNameForTheWorkspace(t *testing.T) {
	t.Parallel()
	a := newApp(t, nil)
	needBoxes(t, a)
	s := newSession(t, a, "home", "")
	seen := func(what string, args any) string {
		t.Helper()
		reply, err := call(t, a, what, args)
		var text string
		if err != nil {
			text = err.Error()
		} else {
			b, jerr := json.Marshal(reply.Output)
			if jerr != nil {
				t.Fatal(jerr)
			}
			text = reply.Text + "\n" + string(b)
		}
		if strings.Contains(text, a.DataDir) {
			t.Errorf("%s %+v names the data directory %s:\n%s", what, args, a.DataDir, text)
		}
		return text
	}

	// The terminal works in /home/user: its result, pwd, $HOME.
	txt := seen("terminal_exec", TerminalExecInput{Session: s.ID, Command: "mkdir -p stats && cd stats && pwd && echo $HOME"})
	if !strings.Contains(txt, "/home/user/stats\n/home/user\n[exit 0] ~/stats") {
		t.Errorf("terminal_exec:\n%s", txt)
	}
	if txt := seen("terminal_exec", TerminalExecInput{Session: s.ID, Command: "cd /home/user/stats && echo ok"}); !strings.Contains(txt, "ok\n[exit 0] ~/stats") {
		t.Errorf("cd /home/user/stats:\n%s", txt)
	}
	seen("terminal_exec", TerminalExecInput{Session: s.ID, Command: "cd"})
	if st := status(t, a, s.ID); st.Cwd != "/home/user" {
		t.Errorf("get_session_status cwd %q", st.Cwd)
	}
	seen("get_session_status", SessionRef{Session: s.ID})
	seen("list_sessions", struct{}{})

	// Code that asks for its directory.
	if txt := seen("run_code", RunCodeInput{Session: s.ID, Code: "import os; print(os.getcwd())"}); !strings.Contains(txt, "/home/user\n") {
		t.Errorf("python's cwd:\n%s", txt)
	}
	if txt := seen("run_code", RunCodeInput{Session: s.ID, Lang: "bash", Code: "pwd; ls nope"}); !strings.Contains(txt, "/home/user\n") {
		t.Errorf("bash's cwd:\n%s", txt)
	}

	// Files: both names, in and out.
	for _, p := range []string{"/home/user/stats/a.txt", "stats/a.txt"} {
		seen("write_file", WriteFileInput{Session: s.ID, Path: p, Content: "x" + p})
		if txt := seen("read_file", ReadFileInput{Session: s.ID, Path: p}); !strings.Contains(txt, "x"+p) {
			t.Errorf("read_file %s:\n%s", p, txt)
		}
		seen("stat_file", PathInput{Session: s.ID, Path: p})
	}
	for _, p := range []string{"/home/user", "/home/user/stats", "stats", ""} {
		if txt := seen("list_files", ListFilesInput{Session: s.ID, Path: p}); strings.Contains(txt, "error") && !strings.Contains(txt, "a.txt") {
			t.Errorf("list_files %q:\n%s", p, txt)
		}
	}
	// Refusals name /home/user, not the host path.
	if txt := seen("read_file", ReadFileInput{Session: s.ID, Path: "/etc/passwd"}); !strings.Contains(txt, "/home/user") {
		t.Errorf("read_file /etc/passwd: %s", txt)
	}
	seen("read_file", ReadFileInput{Session: s.ID, Path: "/home/user/nope"})
	seen("create_project", CreateProjectInput{Session: s.ID, Template: "python", Name: "proj"})
	seen("terminal_exec", TerminalExecInput{Session: s.ID, Command: "cd stats"})
	if txt := seen("terminal_exec", TerminalExecInput{Session: s.ID, Command: "cd ~/'proj' && python3 main.py"}); !strings.Contains(txt, "Hello, proj!\n[exit 0] ~/proj") {
		t.Errorf("create_project's hint:\n%s", txt)
	}
	if st := status(t, a, s.ID); st.Home != "/home/user" {
		t.Errorf("get_session_status workspace %q", st.Home)
	}
}
