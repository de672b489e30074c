package app

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/quro-dev/quro/internal/capability"
	"github.com/quro-dev/quro/internal/controller"
	"github.com/quro-dev/quro/internal/rootfs"
	"github.com/quro-dev/quro/internal/runcode"
	"github.com/quro-dev/quro/internal/sandbox"
)

// install_packages' limits.
const (
	packagesDefaultTimeout = 10 * time.Minute
	packagesMinTimeout     = 10 * time.Second
	packagesMaxTimeout     = 30 * time.Minute
	packagesMax            = 64
	// aptOutputMax is how much of apt's output the result keeps in memory
	// (head and tail; the whole is in the output file).
	aptOutputMax = 16 << 10
)

// InstallPackagesInput is install_packages' input.
type InstallPackagesInput struct {
	Session string `json:"session,omitempty" jsonschema:"session id or name; the default session when omitted. For apt it must run on a rootfs (create_session rootfs=NAME) with network internet; pip works in any session"`
	// Manager is "apt" (the default) or "pip".
	Manager   string   `json:"manager,omitempty" jsonschema:"apt (default: Debian packages into the session's rootfs) or pip (Python packages into the session's user site, ~/.local, from the tenant's wheel cache, fetched by the server first when missing; works with network none)"`
	Packages  []string `json:"packages" jsonschema:"apt: Debian package names (e.g. jq, cowsay, python3-numpy), each optionally NAME=VERSION; pip: NAME[extras] with optional version specifiers (e.g. requests==2.32.3), no URLs or paths; at most 64"`
	TimeoutMS int64    `json:"timeout_ms,omitempty" jsonschema:"time budget in milliseconds for waiting, apt-get update and apt-get install, 10000..1800000; default 600000"`
}

// InstallPackagesResult is install_packages' output.
type InstallPackagesResult struct {
	Manager  string   `json:"manager,omitempty"` // "pip"; apt when empty
	Rootfs   string   `json:"rootfs"`
	Packages []string `json:"packages"`
	// Installed are the packages dpkg newly lists (dependencies too), as
	// "name version"; Upgraded those whose version changed.
	Installed []string `json:"installed"`
	Upgraded  []string `json:"upgraded,omitempty"`
	// Updated says `apt-get update` ran first (the lists were missing or
	// older than a day, or the install could not find a package and they
	// were older than rootfs.ListsFreshFor).
	Updated bool `json:"updated"`
	// Unsettled are the packages dpkg left not fully installed (as "name
	// (state)"): the rootfs needs `quro rootfs repair` before the next
	// install.
	Unsettled  []string `json:"unsettled,omitempty"`
	ExitCode   int      `json:"exit_code"`
	Output     string   `json:"output" jsonschema:"apt's output (stdout and stderr merged; head and tail when long)"`
	OutputFile string   `json:"output_file,omitempty"`
	TimedOut   bool     `json:"timed_out,omitempty"`
	WaitedMS   float64  `json:"waited_ms,omitempty"` // waiting for another change of the same rootfs
	// pip: Wheels are the wheels the server fetched into the tenant's
	// cache for this call; FromCache says the cache had everything (no
	// fetch ran).
	Wheels     []string `json:"wheels,omitempty"`
	FromCache  bool     `json:"from_cache,omitempty"`
	DurationMS float64  `json:"duration_ms"`
}

// Text says what was installed, then apt's output.
func (r *InstallPackagesResult) Text() string {
	var b strings.Builder
	if r.Manager == "pip" {
		from := "fetched into the tenant's wheel cache: " + strings.Join(r.Wheels, ", ")
		if r.FromCache {
			from = "from the tenant's wheel cache (no download)"
		} else if len(r.Wheels) == 0 {
			from = "the tenant's wheel cache had the wheels after the fetch"
		}
		fmt.Fprintf(&b, "pip installed %s into the session's user site (~/.local); %s\nimport it in run_code (no restart needed) or in the session's python3\nduration=%.1fs\n--- pip output ---\n%s",
			strings.Join(r.Packages, " "), from, r.DurationMS/1000, r.Output)
		return strings.TrimRight(b.String(), "\n")
	}
	switch {
	case r.TimedOut:
		fmt.Fprintf(&b, "apt timed out after %.1fs in rootfs %s; nothing was recorded as installed (what dpkg finished may remain)", r.DurationMS/1000, r.Rootfs)
	case r.ExitCode != 0:
		fmt.Fprintf(&b, "apt-get failed in rootfs %s (exit_code=%d): see its output below", r.Rootfs, r.ExitCode)
	case len(r.Installed)+len(r.Upgraded) == 0:
		fmt.Fprintf(&b, "already installed in rootfs %s: %s", r.Rootfs, strings.Join(r.Packages, " "))
	default:
		fmt.Fprintf(&b, "installed into rootfs %s: %s", r.Rootfs, strings.Join(append(slices.Clone(r.Installed), r.Upgraded...), ", "))
		b.WriteString("\nevery session on this rootfs has them from its next command on")
	}
	if len(r.Unsettled) > 0 {
		fmt.Fprintf(&b, "\nWARNING: dpkg left packages not fully installed in rootfs %s: %s; the next install will be refused until an admin runs `quro rootfs repair %s` (repair_rootfs)",
			r.Rootfs, strings.Join(r.Unsettled, ", "), r.Rootfs)
	}
	fmt.Fprintf(&b, "\nexit_code=%d updated=%v duration=%.1fs\n--- apt output ---\n%s", r.ExitCode, r.Updated, r.DurationMS/1000, r.Output)
	return strings.TrimRight(b.String(), "\n")
}

func (a *App) registerPackages(reg *capability.Registry) {
	reg.Register(capability.New("install_packages",
		"Install Debian packages into the session's rootfs with apt: `apt-get install -y --no-install-recommends --no-remove PACKAGES` "+
			"(after `apt-get update` when the package lists are missing or older than a day). "+
			"The packages persist in the rootfs and are shared: every session on that rootfs, now and later, can use them. "+
			"This is the way system packages are installed: the rootfs is read-only to a session's own code, and `apt-get install` typed in a session is refused (code in a session calls with scope exec), saying to ask for this capability. "+
			"The session must run on a rootfs (create_session rootfs=NAME) and have network internet (create_session network=internet); with network none nothing is started. "+
			"Installs into one rootfs run one at a time: a call waits for the one before. apt's progress streams as output; the result lists what dpkg newly installed and apt's output. "+
			"With manager pip: Python packages are installed into the session's user site (~/.local/lib/pythonX.Y/site-packages of the session's Python: the embedded 3.14 on the host userland, the rootfs's python3 on a rootfs) by pip in the session's box from the tenant's wheel cache; wheels the cache lacks are fetched first by the server from its configured index (wheels only, never a session's index), whatever the session's network. A session without network can then `pip install` them too. "+
			"Packages are exact Debian package names (matched literally against the rootfs's apt lists: no patterns), optionally NAME:ARCH and NAME=VERSION; an unknown name is refused before apt runs. apt's plan is simulated first: an install that would remove or downgrade anything is refused. apt needs scope install (or admin): a rootfs is shared by every session on it. pip needs only scope exec (it changes only the session's own workspace), so code in a session can call it too: `pip install` typed in a session without network does. timeout_ms 10000..1800000, default 600000.",
		capability.ScopeExec, a.installPackagesCap).Streaming().InSession(capability.UseBusy))
	a.registerRepair(reg)
}

func (a *App) installPackagesCap(ctx context.Context, in InstallPackagesInput) (*InstallPackagesResult, error) {
	timeout, err := runcode.MillisTimeout(in.TimeoutMS, packagesMinTimeout, packagesMaxTimeout)
	if err != nil {
		return nil, err
	}
	if timeout == 0 {
		timeout = packagesDefaultTimeout
	}
	switch in.Manager {
	case "", "apt":
		// The capability is declared with exec (for pip); apt changes a
		// rootfs every session on it shares and keeps needing install,
		// refused in the controller's words (cmd/quro's apt stand-in
		// matches on them).
		if c, ok := controller.CallerFrom(ctx); !ok || !c.Scope.Covers(capability.ScopeInstall) {
			return nil, capability.Errorf(capability.PermissionDenied, "install_packages needs scope %q (apt, the default manager); for Python packages give manager pip", capability.ScopeInstall)
		}
	case "pip":
		sess, err := entered(ctx)
		if err != nil {
			return nil, err
		}
		return a.installPip(ctx, sess, in.Packages, timeout)
	default:
		return nil, capability.Errorf(capability.InvalidArgument, "manager %q: want apt (Debian packages into a rootfs) or pip (Python packages)", in.Manager)
	}
	if err := checkPackages(in.Packages); err != nil {
		return nil, err
	}
	sess, err := entered(ctx)
	if err != nil {
		return nil, err
	}
	if sess.Rootfs == "" {
		return nil, capability.Errorf(capability.InvalidArgument,
			"session %s runs on the host userland, which install_packages does not change: create a session on a rootfs (create_session rootfs=NAME network=internet)", sess.Name)
	}
	if sess.Network == sandbox.NetworkNone {
		return nil, capability.Errorf(capability.PermissionDenied,
			"session %s has network %q, and apt needs the network: create a session with network internet (create_session rootfs=%s network=internet) to install packages; apt was not started",
			sess.Name, sess.Network, sess.Rootfs)
	}
	return a.installPackages(ctx, sess.Rootfs, in.Packages, timeout, &spillTo{
		Dir:  sess.Workspace(),
		File: filepath.Join(sess.OutputsDir(), "install_packages-"+time.Now().UTC().Format("20060102T150405.000000000")+".log"),
	})
}

func checkPackages(pkgs []string) error {
	if len(pkgs) == 0 {
		return capability.Errorf(capability.InvalidArgument, "name at least one package")
	}
	if len(pkgs) > packagesMax {
		return capability.Errorf(capability.InvalidArgument, "%d packages: at most %d in one call", len(pkgs), packagesMax)
	}
	for _, p := range pkgs {
		if err := rootfs.CheckAptArg(p); err != nil {
			return capability.Errorf(capability.InvalidArgument, "%v", err)
		}
	}
	return nil
}

// spillTo is where apt's whole output goes when the result has to cut it:
// File, confined to the directory Dir (a session workspace).
type spillTo struct{ Dir, File string }

// installPackages installs pkgs into the ready rootfs name with apt
// (rootfs.Apt.Install: literal names, a simulated plan that removes
// nothing, the rootfs's lock waited for within timeout). apt's output goes
// to the context's observer (runcode.WithOutput) as it runs, and into the
// result; when it is too long for the result, the whole of it goes to
// spill (nil: it is only cut).
//
// The caller checks that the network policy allows it: this is the server
// fetching Debian packages for a rootfs, like `quro rootfs install`.
func (a *App) installPackages(ctx context.Context, name string, pkgs []string, timeout time.Duration, spill *spillTo) (*InstallPackagesResult, error) {
	if err := checkPackages(pkgs); err != nil {
		return nil, err
	}
	var out *runcode.Capture
	if spill != nil {
		out = runcode.NewCapture(aptOutputMax, spill.File, a.Runner.Options().SpillLimit).Within(spill.Dir)
	} else {
		out = runcode.NewCapture(aptOutputMax, "", 0)
	}
	out.Observed(ctx, "stdout")
	r, err := a.apt().Install(ctx, name, pkgs, timeout, out)
	if err != nil {
		return nil, a.aptError(err, name, "install_packages in rootfs %q")
	}
	view := out.Finish()
	if r.Exit.Canceled {
		return nil, capability.Errorf(capability.Canceled, "install_packages in rootfs %q was canceled; apt was killed", name)
	}
	return &InstallPackagesResult{
		Rootfs: name, Packages: pkgs, Installed: r.Installed, Upgraded: r.Upgraded, Updated: r.Updated, Unsettled: r.Unsettled,
		ExitCode: r.Exit.Code, TimedOut: r.Exit.TimedOut, Output: view.Text, OutputFile: view.File,
		WaitedMS: millis(r.Waited), DurationMS: millis(r.Duration),
	}, nil
}

func millis(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// apt is the apt driver over the App's rootfses and sandbox.
func (a *App) apt() *rootfs.Apt {
	return &rootfs.Apt{M: rootfs.New(rootfs.DirIn(a.DataDir)), SB: a.Sandbox, Log: a.Log}
}

// aptError adds what the caller needs to an error of rootfs.Apt; its code
// comes from the controller's table. prefix names the call (with the
// rootfs name) before a sandbox start failure.
func (a *App) aptError(err error, name, prefix string) error {
	var se *sandbox.StartError
	switch {
	case errors.Is(err, rootfs.ErrNotInstalled):
		return missingRootfs(rootfs.New(rootfs.DirIn(a.DataDir)), name)
	case errors.As(err, &se):
		return fmt.Errorf(prefix+": %w", name, err)
	}
	return err
}

// RepairRootfsInput is repair_rootfs' input.
type RepairRootfsInput struct {
	Rootfs    string `json:"rootfs" jsonschema:"the installed rootfs to repair (quro rootfs status lists them)"`
	TimeoutMS int64  `json:"timeout_ms,omitempty" jsonschema:"time budget in milliseconds, 10000..1800000; default 600000"`
}

// RepairRootfsResult is repair_rootfs' output.
type RepairRootfsResult struct {
	Rootfs string `json:"rootfs"`
	// Before and After are the packages dpkg shows as not fully
	// installed, as "name (state)", before and after the repair.
	Before     []string `json:"before"`
	After      []string `json:"after"`
	ExitCode   int      `json:"exit_code"` // of the last step that ran
	TimedOut   bool     `json:"timed_out,omitempty"`
	Output     string   `json:"output"`
	DurationMS float64  `json:"duration_ms"`
}

// Text says what was settled, then the output.
func (r *RepairRootfsResult) Text() string {
	var b strings.Builder
	switch {
	case len(r.After) > 0:
		fmt.Fprintf(&b, "rootfs %s still has packages not fully installed: %s (exit_code=%d)", r.Rootfs, strings.Join(r.After, ", "), r.ExitCode)
	case len(r.Before) == 0 && r.ExitCode == 0:
		fmt.Fprintf(&b, "rootfs %s had nothing to settle", r.Rootfs)
	case r.ExitCode == 0:
		fmt.Fprintf(&b, "rootfs %s repaired: %s now installed", r.Rootfs, strings.Join(r.Before, ", "))
	default:
		fmt.Fprintf(&b, "repairing rootfs %s failed (exit_code=%d)", r.Rootfs, r.ExitCode)
	}
	fmt.Fprintf(&b, "\nduration=%.1fs\n--- output ---\n%s", r.DurationMS/1000, r.Output)
	return strings.TrimRight(b.String(), "\n")
}

func (a *App) registerRepair(reg *capability.Registry) {
	reg.Register(capability.New("repair_rootfs",
		"Settle a rootfs that an interrupted or failed install left half-configured (every later install_packages on it is refused until then): "+
			"runs `dpkg --configure -a`, then `apt-get -f install -y --no-remove` in the rootfs's install box, holding the rootfs's lock. "+
			"Nothing is removed. Returns the packages not fully installed before and after. Needs scope admin.",
		capability.ScopeAdmin, func(ctx context.Context, in RepairRootfsInput) (*RepairRootfsResult, error) {
			timeout := time.Duration(in.TimeoutMS) * time.Millisecond
			switch {
			case in.TimeoutMS == 0:
				timeout = packagesDefaultTimeout
			case timeout < packagesMinTimeout || timeout > packagesMaxTimeout:
				return nil, capability.Errorf(capability.InvalidArgument, "timeout_ms %d is outside 10000..1800000", in.TimeoutMS)
			}
			return a.repairRootfs(ctx, in.Rootfs, timeout)
		}).Streaming())
}

// repairRootfs runs `dpkg --configure -a` and `apt-get -f install -y
// --no-remove` in the install box of the ready rootfs name, under its
// lock (rootfs.Apt.Repair), and reports what dpkg shows unsettled before
// and after.
func (a *App) repairRootfs(ctx context.Context, name string, timeout time.Duration) (*RepairRootfsResult, error) {
	out := runcode.NewCapture(aptOutputMax, "", 0)
	out.Observed(ctx, "stdout")
	r, err := a.apt().Repair(ctx, name, timeout, out)
	if err != nil {
		return nil, a.aptError(err, name, "repair_rootfs %q")
	}
	return &RepairRootfsResult{
		Rootfs: name, Before: r.Before, After: r.After, ExitCode: r.Exit.Code, TimedOut: r.Exit.TimedOut,
		Output: out.Finish().Text, DurationMS: millis(r.Duration),
	}, nil
}

// missingRootfs is the error for a rootfs name that is not installed: it
// lists the installed ones and says how to install it.
func missingRootfs(m *rootfs.Manager, name string) error {
	var ready []string
	if list, err := m.List(); err == nil {
		for _, st := range list {
			if m.Ready(st.Name) {
				ready = append(ready, st.Name)
			}
		}
	}
	have := "none is installed"
	if len(ready) > 0 {
		have = "installed: " + strings.Join(ready, ", ")
	}
	return capability.Errorf(capability.NotFound,
		"rootfs %q is not installed (%s); an operator installs it with `quro rootfs install %s` (root, network), or name an installed one", name, have, name)
}
