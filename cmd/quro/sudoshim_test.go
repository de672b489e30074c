package main

import (
	"encoding/json"
	"os"
	"slices"
	"strings"
	"testing"
)

func TestSudoCommand(t *testing.T) {
	for _, tc := range []struct {
		args []string
		user string
		cmd  []string
		ok   bool
	}{
		{[]string{"id"}, "root", []string{"id"}, true},
		{[]string{"-E", "-H", "apt-get", "install", "-y", "jq"}, "root", []string{"apt-get", "install", "-y", "jq"}, true},
		{[]string{"-u", "user", "id", "-u"}, "user", []string{"id", "-u"}, true},
		{[]string{"--user=root", "--", "-weird"}, "root", []string{"-weird"}, true},
		{[]string{"-uuser", "-n", "true"}, "user", []string{"true"}, true},
		{[]string{"-p", "pw:", "ls"}, "root", []string{"ls"}, true},
		{[]string{"-i"}, "root", nil, false},
		{[]string{"-s", "id"}, "root", nil, false},
		{nil, "root", nil, true},
	} {
		user, cmd, ok := sudoCommand(tc.args)
		if user != tc.user || !slices.Equal(cmd, tc.cmd) || ok != tc.ok {
			t.Errorf("sudo %q: %q %q %v; want %q %q %v", tc.args, user, cmd, ok, tc.user, cmd, tc.ok)
		}
	}
}

// TestSudoInTheBox: in a session of quro serve, sudo is the stand-in
// (first on PATH, in a login shell too): a command as root is refused
// with why and what to use instead, sudo -u user runs the command as it
// is, and sudo apt-get is the apt stand-in's.
func TestSudoInTheBox(t *testing.T) {
	t.Parallel()
	if os.Geteuid() != 0 {
		t.Skip("session boxes with the stand-ins need the server to run as root; this test runs as uid", os.Geteuid())
	}
	srv := startServer(t)
	admin := []string{"Authorization", "Bearer " + srv.token}
	const js = "application/json"
	if r := do(t, "POST", srv.url+"/v1/sessions", js, `{"name":"sudo"}`, admin...); r.status != 201 {
		t.Fatalf("%d %s", r.status, r.body)
	}
	body, _ := json.Marshal(map[string]any{"lang": "bash", "session": "sudo", "timeout_ms": 120000, "code": `sudo id 2>&1; echo "rc=$?"
sudo -u user id -un; echo "rc=$?"
bash -l -c 'command -v sudo'
sudo -E apt-get install -y jq 2>&1; echo "rc=$?"`})
	r := do(t, "POST", srv.url+"/v1/run_code", js, string(body), append([]string{"Accept", "text/plain"}, admin...)...)
	if r.status != 200 {
		t.Fatalf("%d %s", r.status, r.body)
	}
	out := r.body
	refusal := strings.Index(out, SudoRefusal)
	if refusal < 0 || !strings.Contains(out[refusal:], "rc=1\nuser\nrc=0\n/run/quro/bin/sudo\n") {
		t.Fatalf("sudo id, sudo -u user, the login shell's sudo:\n%s", out)
	}
	_, apt, _ := strings.Cut(out, "/run/quro/bin/sudo\n")
	if strings.Contains(apt, SudoRefusal) || !strings.Contains(apt, "install_packages") || strings.Contains(apt, "rc=0") {
		t.Fatalf("sudo apt-get install is not the apt stand-in's:\n%s", apt)
	}
}
