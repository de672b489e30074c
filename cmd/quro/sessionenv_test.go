package main

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/quro-dev/quro/internal/sandbox"
)

// TestInSessionEnvCannotReachTheLoader: the attack of the security issue,
// end to end — code in a network-none session writes a library into its
// workspace and, with quro call over the in-session socket, sets
// LD_PRELOAD (or any other name the loader, libc or a shell obey) for the
// next run. Each is refused with invalid_argument naming the variable,
// nothing is stored, and the library never loads, in or out of a box.
func TestInSessionEnvCannotReachTheLoader(t *testing.T) {
	t.Parallel()
	if os.Geteuid() != 0 {
		t.Skip("in-session calls need the server to run as root (a uid per session); this test runs as uid", os.Geteuid())
	}
	srv := startServer(t)
	admin := []string{"Authorization", "Bearer " + srv.token}
	const js = "application/json"
	run := innerSession(t, srv)
	// A first Python run waits for the server's interpreter extraction,
	// which must not be cut short by the end of the test.
	body, _ := json.Marshal(map[string]any{"lang": "python", "session": "inner", "code": "print(6*7)"})
	if r := do(t, "POST", srv.url+"/v1/run_code", js, string(body), append([]string{"Accept", "text/plain"}, admin...)...); !strings.Contains(r.body, "42") {
		t.Fatalf("%d %s", r.status, r.body)
	}
	// The box names its workspace /home/user; the host writes the
	// library into the session's directory under the data directory.
	ws := strings.TrimSpace(run("pwd"))
	var info struct {
		ID string `json:"id"`
	}
	if r := do(t, "GET", srv.url+"/v1/sessions/inner", "", "", admin...); r.status != 200 || json.Unmarshal([]byte(r.body), &info) != nil || info.ID == "" {
		t.Fatalf("the session: %d %s", r.status, r.body)
	}
	hostWS := filepath.Join(srv.data, "sessions", info.ID, "workspace")
	marker := filepath.Join(ws, "loaded")
	so := filepath.Join(ws, "x.so")
	if gcc, err := exec.LookPath("gcc"); err == nil {
		src := filepath.Join(t.TempDir(), "x.c")
		os.WriteFile(src, []byte(`#include <stdio.h>
#include <unistd.h>
__attribute__((constructor)) static void f(void) { FILE *m = fopen("`+marker+`", "a"); if (m) { fprintf(m, "euid %d\n", (int)geteuid()); fclose(m); } }
`), 0o644)
		if out, err := exec.Command(gcc, "-shared", "-fPIC", "-o", filepath.Join(hostWS, "x.so"), src).CombinedOutput(); err != nil {
			t.Fatalf("gcc: %v\n%s", err, out)
		}
		os.Chmod(filepath.Join(hostWS, "x.so"), 0o755)
	}
	var script strings.Builder
	for _, name := range sandbox.RefusedEnvExamples {
		script.WriteString(`quro call set_session_env '{"env":{"` + name + `":"` + so + `"}}' 2>&1; echo "` + name + ` exit=$?"` + "\n")
	}
	out := run(script.String())
	for _, name := range sandbox.RefusedEnvExamples {
		if !strings.Contains(out, "invalid_argument: variable "+name+" cannot be set") || !strings.Contains(out, name+" exit=1") {
			t.Errorf("%s was not refused clearly:\n%s", name, out)
		}
	}
	if out := run(`quro call get_session_env`); !strings.Contains(out, "(no session variables)") {
		t.Fatalf("stored: %s", out)
	}
	run("true")
	if b, err := os.ReadFile(filepath.Join(hostWS, "loaded")); err == nil {
		t.Fatalf("the workspace library was loaded: %s", b)
	}
	// Through REST, with an admin token, the same.
	r := do(t, "POST", srv.url+"/v1/set_session_env", js, `{"session":"inner","env":{"LD_PRELOAD":"`+so+`"}}`, admin...)
	if r.status != 400 || !strings.Contains(r.body, "LD_PRELOAD cannot be set") {
		t.Fatalf("REST: %d %s", r.status, r.body)
	}
}
