package app

import (
	"testing"

	"github.com/quro-dev/quro/internal/capability"
	"github.com/quro-dev/quro/internal/controller"
)

// The rootfs capabilities refuse before anything runs: a bad name, a
// rootfs that is not there, a scope too narrow — and choosing the suite
// or mirror every tenant on the rootfs will run is the admin's alone.
func TestRootfsCapabilitiesRefuseFast(t *testing.T) {
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

	_, err = call(t, a, "install_rootfs", InstallRootfsInput{Rootfs: "a.b"})
	wantCode(t, err, capability.InvalidArgument)
	_, err = call(t, a, "remove_rootfs", RootfsRef{Rootfs: "none-here"})
	wantCode(t, err, capability.NotFound)
	_, err = call(t, a, "install_rootfs_packages", InstallRootfsPackagesInput{Rootfs: "none-here", Packages: []string{"jq"}})
	wantCode(t, err, capability.NotFound)
	_, err = call(t, a, "install_rootfs_packages", InstallRootfsPackagesInput{Rootfs: "none-here", Packages: []string{"jq"}, TimeoutMS: 5})
	wantCode(t, err, capability.InvalidArgument)
}
