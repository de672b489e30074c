package app

import (
	"strings"
	"testing"

	"github.com/quro-dev/quro/internal/capability"
	"github.com/quro-dev/quro/internal/controller"
)

// TestPipInstallNeedsOnlyExec: install_packages {manager: pip} changes
// only the session's own user site, so scope exec (what code in a session
// calls with) does it; apt, which changes a rootfs every session on it
// shares, is refused to exec in the controller's words, before anything
// about the session is looked at.
func TestPipInstallNeedsOnlyExec(t *testing.T) {
	t.Parallel()
	ix := newTestIndex(t, pureWheel(t, "quroexec", "1.0", "exec"))
	a := pipApp(t, ix)
	execer := controller.Caller{Path: "test", Tenant: "alice", Scope: capability.ScopeExec, TokenID: "te"}
	s := sessionAs(t, a, execer, "execpip", "", nil)
	res, err := installPip(t, a, execer, s.ID, "quroexec")
	if err != nil {
		t.Fatalf("install_packages manager pip with scope exec: %v", err)
	}
	if len(res.Wheels) != 1 || res.ExitCode != 0 {
		t.Fatalf("%+v", res)
	}
	if r := runIn(t, a, execer, RunCodeInput{Session: s.ID, Code: "import quroexec; print(quroexec.VALUE)"}); r.Stdout != "exec\n" {
		t.Fatalf("import: %+v", r)
	}
	for _, manager := range []string{"", "apt"} {
		_, err := callAs(t, a, execer, "install_packages", InstallPackagesInput{Session: s.ID, Manager: manager, Packages: []string{"jq"}})
		if capCode(err) != capability.PermissionDenied || !strings.Contains(err.Error(), `install_packages needs scope "install"`) {
			t.Fatalf("manager %q with scope exec: %v", manager, err)
		}
	}
}
