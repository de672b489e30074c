package app

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/quro-dev/quro/internal/capability"
	"github.com/quro-dev/quro/internal/controller"
)

// The rootfs capabilities refuse before anything runs: a bad name, a
// rootfs that is not there, a scope too narrow — and choosing the suite
// or mirror every tenant on the rootfs will run is the operator's alone.
func TestRootfsCapabilitiesRefuseFast(t *testing.T) {
	t.Parallel()
	a := newApp(t, nil)
	installer := controller.Caller{Path: "test", Tenant: "acme", Scope: capability.ScopeInstall}
	runner := controller.Caller{Path: "test", Tenant: "acme", Scope: capability.ScopeExec}

	_, err := callAs(t, a, installer, "install_rootfs", InstallRootfsInput{Rootfs: "x", Mirror: "http://mirror.example/debian"})
	wantCode(t, err, capability.PermissionDenied)
	_, err = callAs(t, a, installer, "install_rootfs", InstallRootfsInput{Rootfs: "x", Suite: "sid"})
	wantCode(t, err, capability.PermissionDenied)
	_, err = callAs(t, a, runner, "install_rootfs", InstallRootfsInput{Rootfs: "x"})
	wantCode(t, err, capability.PermissionDenied)
	_, err = callAs(t, a, installer, "install_rootfs_packages", InstallRootfsPackagesInput{Rootfs: "x", Packages: []string{"jq"}})
	wantCode(t, err, capability.PermissionDenied)
	_, err = callAs(t, a, installer, "remove_rootfs", RootfsRef{Rootfs: "x"})
	wantCode(t, err, capability.PermissionDenied)

	// Another tenant's admin is not the operator: the rootfs is every
	// tenant's, so it neither picks what it runs nor removes it.
	tenantAdmin := controller.Caller{Path: "test", Tenant: "acme", Scope: capability.ScopeAdmin}
	_, err = callAs(t, a, tenantAdmin, "install_rootfs", InstallRootfsInput{Rootfs: "x", Suite: "sid"})
	wantCode(t, err, capability.PermissionDenied)
	_, err = callAs(t, a, tenantAdmin, "remove_rootfs", RootfsRef{Rootfs: "x"})
	wantCode(t, err, capability.PermissionDenied)

	// debootstrap sources the script named by the suite, as root: a suite
	// that is a path (to a file a session wrote) never reaches it, not even
	// the operator's.
	evil := filepath.Join(t.TempDir(), "evil.sh")
	if err := os.WriteFile(evil, []byte("touch "+evil+".ran\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, in := range []InstallRootfsInput{
		{Rootfs: "x", Suite: "../../../../.." + evil},
		{Rootfs: "x", Suite: "--help"},
		{Rootfs: "x", Mirror: "--keyring=/etc/shadow"},
		{Rootfs: "x", Mirror: "file:///etc"},
	} {
		_, err = call(t, a, "install_rootfs", in)
		wantCode(t, err, capability.InvalidArgument)
	}
	if _, err := os.Stat(evil + ".ran"); err == nil {
		t.Fatal("the suite's path was sourced")
	}
	if _, err := os.Stat(filepath.Join(a.DataDir, "rootfs", "x.partial")); err == nil {
		t.Error("a refused install left a partial rootfs")
	}

	_, err = call(t, a, "install_rootfs", InstallRootfsInput{Rootfs: "a.b"})
	wantCode(t, err, capability.InvalidArgument)
	_, err = call(t, a, "remove_rootfs", RootfsRef{Rootfs: "none-here"})
	wantCode(t, err, capability.NotFound)
	_, err = call(t, a, "install_rootfs_packages", InstallRootfsPackagesInput{Rootfs: "none-here", Packages: []string{"jq"}})
	wantCode(t, err, capability.NotFound)
	_, err = call(t, a, "install_rootfs_packages", InstallRootfsPackagesInput{Rootfs: "none-here", Packages: []string{"jq"}, TimeoutMS: 5})
	wantCode(t, err, capability.InvalidArgument)
}
