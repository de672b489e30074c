package app

import (
	"context"
	"fmt"
	"time"

	"github.com/quro-dev/quro/internal/capability"
	"github.com/quro-dev/quro/internal/controller"
	"github.com/quro-dev/quro/internal/hostpath"
	"github.com/quro-dev/quro/internal/rootfs"
	"github.com/quro-dev/quro/internal/runcode"
)

// The rootfs changes an operator makes from the command line (quro rootfs
// install, remove, install-packages) are capabilities, so that they are
// audited like every other call and reachable the same way from REST and
// MCP.

// InstallRootfsInput is install_rootfs' input.
type InstallRootfsInput struct {
	Rootfs string `json:"rootfs,omitempty" jsonschema:"the rootfs name (letters, digits, '.', '_', '-'); default: default"`
	Suite  string `json:"suite,omitempty" jsonschema:"the Debian suite; default: the one quro was built for (scope admin to choose another)"`
	Mirror string `json:"mirror,omitempty" jsonschema:"the Debian mirror URL; default: the host's apt sources, else deb.debian.org (scope admin to choose another)"`
}

// RootfsRef names a rootfs.
type RootfsRef struct {
	Rootfs string `json:"rootfs" jsonschema:"the rootfs name, as quro rootfs status lists them"`
}

// InstallRootfsPackagesInput is install_rootfs_packages' input.
type InstallRootfsPackagesInput struct {
	Rootfs    string   `json:"rootfs" jsonschema:"the installed rootfs to install into"`
	Packages  []string `json:"packages" jsonschema:"Debian package names, each optionally NAME=VERSION; at most 64"`
	TimeoutMS int64    `json:"timeout_ms,omitempty" jsonschema:"time budget in milliseconds for waiting, apt-get update and apt-get install, 10000..1800000; default 600000"`
}

// rootfsName maps a bad rootfs name to invalid_argument.
func rootfsName(name string) (string, error) {
	if name == "" {
		name = rootfs.DefaultName
	}
	if err := rootfs.CheckName(name); err != nil {
		return "", capability.Errorf(capability.InvalidArgument, "%v", err)
	}
	return name, nil
}

// progressLines sends each progress line of a rootfs install to the
// call's output observer (the CLI prints it; the WebSocket streams it).
// Anyone but the operator reads them without host paths (debootstrap's
// command line and messages name the data directory).
func progressLines(ctx context.Context) func(string) {
	out := runcode.OutputFrom(ctx)
	c, ok := controller.CallerFrom(ctx)
	hide := !ok || !operator(c)
	start := time.Now()
	return func(line string) {
		if hide {
			line = hostpath.Names(line)
		}
		if out != nil {
			out("stdout", fmt.Appendf(nil, "[%5.1fs] %s\n", time.Since(start).Seconds(), line))
		}
	}
}

func (a *App) registerRootfs(reg *capability.Registry) {
	manager := rootfs.New(rootfs.DirIn(a.DataDir))
	reg.Register(capability.New("install_rootfs",
		"Build a Debian rootfs (debootstrap --variant=minbase, with python3, python3-pip and ca-certificates) under the data directory, "+
			"for sessions created with rootfs=NAME. Needs the server to run as root and the network; takes a minute or two; "+
			"an interrupted install resumes; an installed one is left as it is. Progress streams as output. Needs scope install (or admin); "+
			"choosing the suite or the mirror is the operator's (an admin of the local tenant).",
		capability.ScopeInstall, func(ctx context.Context, in InstallRootfsInput) (*rootfs.Status, error) {
			name, err := rootfsName(in.Rootfs)
			if err != nil {
				return nil, err
			}
			// What every tenant on the rootfs will run comes from the
			// suite and the mirror: choosing them is the operator's.
			if c, ok := controller.CallerFrom(ctx); (in.Suite != "" || in.Mirror != "") && (!ok || !operator(c)) {
				return nil, capability.Errorf(capability.PermissionDenied,
					"choosing the suite or the mirror is the operator's (an admin of the local tenant); leave them out for the defaults")
			}
			if _, err := manager.Install(ctx, name, rootfs.InstallOptions{Suite: in.Suite, Mirror: in.Mirror}, progressLines(ctx)); err != nil {
				return nil, err
			}
			return manager.Status(name)
		}).Streaming())
	reg.Register(capability.New("remove_rootfs",
		"Delete a rootfs, ready or partial: every session on it, of every tenant, stops working. "+
			"Only the operator (an admin of the local tenant) may.",
		capability.ScopeAdmin, func(ctx context.Context, in RootfsRef) (*Done, error) {
			if c, ok := controller.CallerFrom(ctx); !ok || !operator(c) {
				return nil, capability.Errorf(capability.PermissionDenied,
					"a rootfs is shared by every tenant: only the operator (an admin of the local tenant) removes one")
			}
			name, err := rootfsName(in.Rootfs)
			if err != nil {
				return nil, err
			}
			st, err := manager.Status(name)
			if err != nil {
				return nil, err
			}
			if st.State == rootfs.Absent {
				return nil, missingRootfs(manager, name)
			}
			if err := manager.Remove(name); err != nil {
				return nil, err
			}
			return &Done{Message: "removed rootfs " + name}, nil
		}))
	reg.Register(capability.New("install_rootfs_packages",
		"Install Debian packages into a named rootfs with apt, as install_packages does for a session's rootfs "+
			"(apt-get update when the lists are older than a day, then apt-get install -y --no-install-recommends --no-remove), "+
			"in a box where the rootfs is writable and the network is the host's. The packages are shared by every session on the rootfs. "+
			"apt's output streams as output. Needs scope admin.",
		capability.ScopeAdmin, func(ctx context.Context, in InstallRootfsPackagesInput) (*InstallPackagesResult, error) {
			name, err := rootfsName(in.Rootfs)
			if err != nil {
				return nil, err
			}
			timeout, err := runcode.MillisTimeout(in.TimeoutMS, packagesMinTimeout, packagesMaxTimeout)
			if err != nil {
				return nil, err
			}
			if timeout == 0 {
				timeout = packagesDefaultTimeout
			}
			return a.installPackages(ctx, name, in.Packages, timeout, nil)
		}).Streaming())
}
