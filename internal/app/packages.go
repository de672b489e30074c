package app

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/quro-dev/quro/internal/capability"
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
	// aptListsMaxAge is how old the apt lists may be before an install
	// runs `apt-get update` first.
	aptListsMaxAge = 24 * time.Hour
	// aptOutputMax is how much of apt's output the result keeps in memory
	// (head and tail; the whole is in the output file).
	aptOutputMax = 16 << 10
)

// InstallPackagesInput is install_packages' input.
type InstallPackagesInput struct {
	Session   string   `json:"session,omitempty" jsonschema:"session id or name; the default session when omitted. It must run on a rootfs (create_session rootfs=NAME) with network full"`
	Packages  []string `json:"packages" jsonschema:"Debian package names (e.g. jq, cowsay, python3-numpy), each optionally NAME=VERSION; at most 64"`
	TimeoutMS int64    `json:"timeout_ms,omitempty" jsonschema:"time budget in milliseconds for waiting, apt-get update and apt-get install, 10000..1800000; default 600000"`
}

// InstallPackagesResult is install_packages' output.
type InstallPackagesResult struct {
	Rootfs   string   `json:"rootfs"`
	Packages []string `json:"packages"`
	// Installed are the packages dpkg newly lists (dependencies too), as
	// "name version"; Upgraded those whose version changed.
	Installed []string `json:"installed"`
	Upgraded  []string `json:"upgraded,omitempty"`
	// Updated says `apt-get update` ran first (the lists were missing or
	// older than a day, or the install could not find a package).
	Updated    bool    `json:"updated"`
	ExitCode   int     `json:"exit_code"`
	Output     string  `json:"output" jsonschema:"apt's output (stdout and stderr merged; head and tail when long)"`
	OutputFile string  `json:"output_file,omitempty"`
	TimedOut   bool    `json:"timed_out,omitempty"`
	WaitedMS   float64 `json:"waited_ms,omitempty"` // waiting for another change of the same rootfs
	DurationMS float64 `json:"duration_ms"`
}

// Text says what was installed, then apt's output.
func (r *InstallPackagesResult) Text() string {
	var b strings.Builder
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
	fmt.Fprintf(&b, "\nexit_code=%d updated=%v duration=%.1fs\n--- apt output ---\n%s", r.ExitCode, r.Updated, r.DurationMS/1000, r.Output)
	return strings.TrimRight(b.String(), "\n")
}

func (a *App) registerPackages(reg *capability.Registry) {
	reg.Register(capability.New("install_packages",
		"Install Debian packages into the session's rootfs with apt: `apt-get install -y --no-install-recommends --no-remove PACKAGES` "+
			"(after `apt-get update` when the package lists are missing or older than a day). "+
			"The packages persist in the rootfs and are shared: every session on that rootfs, now and later, can use them. "+
			"This is the way system packages are installed: the rootfs is read-only to a session's own code, and `apt-get install`/`apt install` typed in a session of quro serve asks for this same capability. "+
			"The session must run on a rootfs (create_session rootfs=NAME) and have network full (create_session network=full); with network none nothing is started. "+
			"Installs into one rootfs run one at a time: a call waits for the one before. apt's progress streams as output; the result lists what dpkg newly installed and apt's output. "+
			"Packages are Debian names, optionally NAME=VERSION; nothing already installed is removed or downgraded. timeout_ms 10000..1800000, default 600000.",
		capability.ScopeExec, a.installPackagesCap))
}

func (a *App) installPackagesCap(ctx context.Context, in InstallPackagesInput) (*InstallPackagesResult, error) {
	timeout, err := runcode.MillisTimeout(in.TimeoutMS, packagesMinTimeout, packagesMaxTimeout)
	if err != nil {
		return nil, err
	}
	if timeout == 0 {
		timeout = packagesDefaultTimeout
	}
	if err := checkPackages(in.Packages); err != nil {
		return nil, err
	}
	sess, err := a.Sessions.Get(ctx, in.Session)
	if err != nil {
		return nil, err
	}
	if sess.Rootfs == "" {
		return nil, capability.Errorf(capability.InvalidArgument,
			"session %s runs on the host userland, which install_packages does not change: create a session on a rootfs (create_session rootfs=NAME network=full)", sess.Name)
	}
	if sess.Network != sandbox.NetworkFull {
		return nil, capability.Errorf(capability.PermissionDenied,
			"session %s has network %q, and apt needs the network: create a session with network full (create_session rootfs=%s network=full) to install packages; apt was not started",
			sess.Name, sess.Network, sess.Rootfs)
	}
	if err := a.Sessions.Touch(ctx, sess); err != nil {
		return nil, err
	}
	return a.InstallPackages(ctx, sess.Rootfs, in.Packages, timeout, &SpillTo{
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
		if err := rootfs.CheckPackage(p); err != nil {
			return capability.Errorf(capability.InvalidArgument, "%v", err)
		}
	}
	return nil
}

// SpillTo is where apt's whole output goes when the result has to cut it:
// File, confined to the directory Dir (a session workspace).
type SpillTo struct{ Dir, File string }

// InstallPackages installs pkgs into the ready rootfs name with apt, in a
// box where the rootfs is writable (sandbox.Spec.RootfsAdmin) and the
// network is the host's: `apt-get update` when the lists are older than a
// day (or were never updated since the build, or a package is not found),
// then `apt-get install`. Changes of one rootfs are serialized by its lock
// (rootfs.Manager.Lock); a call waits for it within timeout. apt's output
// goes to the context's observer (runcode.WithOutput) as it runs, and into
// the result; when it is too long for the result, the whole of it goes to
// spill (nil: it is only cut).
//
// The caller checks that the network policy allows it: this is the server
// fetching Debian packages for a rootfs, like `quro rootfs install`.
func (a *App) InstallPackages(ctx context.Context, name string, pkgs []string, timeout time.Duration, spill *SpillTo) (*InstallPackagesResult, error) {
	if err := checkPackages(pkgs); err != nil {
		return nil, err
	}
	if err := rootfs.CheckName(name); err != nil {
		return nil, capability.Errorf(capability.InvalidArgument, "%v", err)
	}
	m := rootfs.New(rootfs.DirIn(a.DataDir))
	if !m.Ready(name) {
		return nil, capability.Errorf(capability.Unavailable, "rootfs %q is not installed: `quro rootfs install %s` builds it", name, name)
	}
	start := time.Now()
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	unlock, err := m.Lock(ctx, name)
	if err != nil {
		if errors.Is(err, rootfs.ErrBusy) {
			if errors.Is(ctx.Err(), context.Canceled) {
				return nil, capability.Errorf(capability.Canceled, "canceled while waiting for another change of rootfs %q", name)
			}
			return nil, capability.Errorf(capability.DeadlineExceeded,
				"rootfs %q was still being changed by another install (or installed, or removed) after %s, this call's timeout; nothing was installed: try again", name, timeout)
		}
		return nil, err
	}
	defer unlock()
	if !m.Ready(name) { // removed while this call waited
		return nil, capability.Errorf(capability.Unavailable, "rootfs %q is not installed: `quro rootfs install %s` builds it", name, name)
	}
	res := &InstallPackagesResult{Rootfs: name, Packages: pkgs, Installed: []string{}, WaitedMS: millis(time.Since(start))}
	info, err := m.Info(name)
	if err != nil {
		return nil, err
	}
	root := m.Path(name)
	before := rootfs.Installed(root)

	// The box's working directory: a scratch directory of the install,
	// beside the rootfs (never inside it, never a session's).
	scratch, err := os.MkdirTemp(m.Dir, ".apt-"+name+"-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(scratch)
	var out *runcode.Capture
	if spill != nil {
		out = runcode.NewCapture(aptOutputMax, spill.File, a.Runner.Options().SpillLimit).Within(spill.Dir)
	} else {
		out = runcode.NewCapture(aptOutputMax, "", 0)
	}
	out.Observed(ctx, "stdout")
	apt := func(args ...string) (sandbox.Exit, error) {
		fmt.Fprintf(out, "$ apt-get %s\n", strings.Join(args, " "))
		return a.Sandbox.Run(ctx, &sandbox.Spec{
			Args:        append([]string{"apt-get", "-q", "-o", "APT::Color=0", "-o", "Dpkg::Use-Pty=0"}, args...),
			Dir:         scratch,
			Env:         map[string]string{"DEBIAN_FRONTEND": "noninteractive", "DEBCONF_NONINTERACTIVE_SEEN": "true"},
			Network:     sandbox.NetworkFull,
			Rootfs:      root,
			RootfsAdmin: true,
			Stdout:      out,
			Stderr:      out,
		})
	}
	install := append([]string{"-y", "--no-install-recommends", "--no-remove",
		"-o", "Dpkg::Options::=--force-confdef", "-o", "Dpkg::Options::=--force-confold", "install"}, pkgs...)
	var updated time.Time
	update := func() (sandbox.Exit, error) {
		res.Updated = true
		e, err := apt("update")
		if err == nil && e.Code == 0 {
			updated = time.Now()
		}
		return e, err
	}
	var exit sandbox.Exit
	if time.Since(info.ListsUpdated) > aptListsMaxAge {
		exit, err = update()
	}
	if err == nil && exit.Code == 0 && !exit.TimedOut && !exit.Canceled {
		exit, err = apt(install...)
		if err == nil && exit.Code != 0 && !res.Updated && ctx.Err() == nil {
			// Lists a day old can miss a package or name a version the
			// mirror no longer has: update once and try again.
			if exit, err = update(); err == nil && exit.Code == 0 {
				exit, err = apt(install...)
			}
		}
	}
	if err != nil {
		var se *sandbox.StartError
		if errors.As(err, &se) {
			return nil, capability.Errorf(capability.Unavailable, "install_packages in rootfs %q: %v", name, err)
		}
		return nil, err
	}
	view := out.Finish()
	res.ExitCode, res.TimedOut, res.Output, res.OutputFile = exit.Code, exit.TimedOut, view.Text, view.File
	after := rootfs.Installed(root)
	for _, p := range slices.Sorted(maps.Keys(after)) {
		switch old, ok := before[p]; {
		case !ok:
			res.Installed = append(res.Installed, p+" "+after[p])
		case old != after[p]:
			res.Upgraded = append(res.Upgraded, p+" "+old+" -> "+after[p])
		}
	}
	var added []string
	if exit.Code == 0 && !exit.TimedOut {
		added = pkgs
	}
	if err := m.AddPackages(name, added, updated); err != nil {
		a.Log.Warn("install_packages: could not update the rootfs marker", "rootfs", name, "err", err)
	}
	res.DurationMS = millis(time.Since(start))
	switch {
	case exit.TimedOut:
		return res, nil
	case exit.Canceled:
		return nil, capability.Errorf(capability.Canceled, "install_packages in rootfs %q was canceled; apt was killed", name)
	}
	return res, nil
}

func millis(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
