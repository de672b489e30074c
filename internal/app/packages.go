package app

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
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
	// aptSimulateMax bounds the output of `apt-get -s install` kept to
	// read its plan.
	aptSimulateMax = 8 << 20
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
	DurationMS float64  `json:"duration_ms"`
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
			"The session must run on a rootfs (create_session rootfs=NAME) and have network full (create_session network=full); with network none nothing is started. "+
			"Installs into one rootfs run one at a time: a call waits for the one before. apt's progress streams as output; the result lists what dpkg newly installed and apt's output. "+
			"Packages are exact Debian package names (matched literally against the rootfs's apt lists: no patterns), optionally NAME:ARCH and NAME=VERSION; an unknown name is refused before apt runs. apt's plan is simulated first: an install that would remove or downgrade anything is refused. Needs scope install (or admin). timeout_ms 10000..1800000, default 600000.",
		capability.ScopeInstall, a.installPackagesCap))
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
	ctx, release, err := a.useSession(ctx, sess)
	if err != nil {
		return nil, err
	}
	defer release()
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
		// apt-get install reads a trailing - as "remove this" and a
		// trailing + as "install this" (after an architecture or version
		// it would cut those): only a bare name that exists may end in +
		// (g++), which the check against the lists settles.
		n, arch, ver := rootfs.SplitPackage(p)
		switch {
		case strings.HasSuffix(p, "-"):
			return capability.Errorf(capability.InvalidArgument, "%q ends in '-', which apt-get reads as \"remove this package\": install_packages only installs; name packages exactly; nothing was installed", p)
		case strings.HasSuffix(p, "+") && (arch != "" || ver != ""):
			return capability.Errorf(capability.InvalidArgument, "%q ends in '+', which apt-get reads as a marker, not part of the version or architecture: name packages exactly; nothing was installed", p)
		case n == "":
			return capability.Errorf(capability.InvalidArgument, "%q has no package name", p)
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
	m, ctx, lk, err := a.lockRootfs(ctx, name, timeout, "installed")
	if err != nil {
		return nil, err
	}
	defer lk.done()
	start := lk.start
	res := &InstallPackagesResult{Rootfs: name, Packages: pkgs, Installed: []string{}, WaitedMS: millis(time.Since(start))}
	info, err := m.Info(name)
	if err != nil {
		return nil, err
	}
	root := m.Path(name)
	// A rootfs left half-configured (by an earlier install, or anything
	// else) fails every install: say so and how to settle it instead.
	if bad, err := rootfs.Unsettled(root); err != nil {
		return nil, capability.Errorf(capability.Unavailable, "rootfs %q: dpkg's status cannot be read (%v); nothing was installed", name, err)
	} else if len(bad) > 0 {
		return nil, capability.Errorf(capability.Unavailable,
			"rootfs %q has packages dpkg did not finish installing: %s. Nothing was installed: an admin settles it with `quro rootfs repair %s` (or repair_rootfs rootfs=%s)",
			name, strings.Join(bad, ", "), name, name)
	}
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
		return a.aptInBox(ctx, root, scratch, out, nil, "apt-get", args...)
	}
	opts := []string{"-y", "--no-install-recommends",
		"-o", "Dpkg::Options::=--force-confdef", "-o", "Dpkg::Options::=--force-confold"}
	install := append(append(slices.Clone(opts), "--no-remove", "install"), pkgs...)
	var updated time.Time
	update := func() (sandbox.Exit, error) {
		res.Updated = true
		e, err := apt("update")
		if err == nil && e.Code == 0 {
			updated = time.Now()
		}
		return e, err
	}
	ok := func(e sandbox.Exit) bool { return e.Code == 0 && !e.TimedOut && !e.Canceled }
	// refuse ends the call before the install; lists fetched on the way
	// are recorded, so the next call does not fetch them again.
	refuse := func(err error) (*InstallPackagesResult, error) {
		if !updated.IsZero() {
			if merr := m.AddPackages(name, nil, updated); merr != nil {
				a.Log.Warn("install_packages: could not update the rootfs marker", "rootfs", name, "err", merr)
			}
		}
		return nil, err
	}
	var exit sandbox.Exit
	if time.Since(info.ListsUpdated) > aptListsMaxAge {
		exit, err = update()
	}
	for err == nil && ok(exit) {
		// Names are matched literally, against the lists apt has: an
		// unknown one never reaches apt, where it could be read as a
		// pattern (cowsa. is a regex for a hundred packages).
		if refusal, unknown := checkAvailable(root, name, pkgs); refusal != nil {
			if unknown && !res.Updated && ctx.Err() == nil {
				// Lists a day old can miss a package or a version.
				if exit, err = update(); err == nil && ok(exit) {
					continue
				}
				break
			}
			return refuse(refusal)
		}
		// What apt would do, before it does it: nothing may be removed,
		// and apt must install exactly the packages named (and their
		// dependencies), never a match of a pattern.
		sim := &limitedBuffer{max: aptSimulateMax}
		fmt.Fprintf(out, "$ apt-get -s install %s\n", strings.Join(pkgs, " "))
		exit, err = a.aptInBox(ctx, root, scratch, io.Discard, sim, "apt-get", append(append(slices.Clone(opts), "-s", "install"), pkgs...)...)
		if err != nil {
			break
		}
		if !ok(exit) {
			out.Write(sim.Bytes())
			if !res.Updated && ctx.Err() == nil {
				if exit, err = update(); err == nil && ok(exit) {
					continue
				}
			}
			break
		}
		plan, perr := parseAptPlan(sim.String(), sim.over)
		if perr == nil {
			perr = plan.check(pkgs, before)
		}
		if perr != nil {
			return refuse(capability.Errorf(capability.InvalidArgument, "install_packages into rootfs %q refused: %v; nothing was installed", name, perr))
		}
		fmt.Fprintf(out, "apt would install %d packages and remove none\n", len(plan.Inst))
		exit, err = apt(install...)
		if err == nil && exit.Code != 0 && !res.Updated && ctx.Err() == nil {
			// A version the mirror no longer has: update once and try
			// again, from the check of the names.
			if exit, err = update(); err == nil && ok(exit) {
				continue
			}
		}
		break
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
	if bad, uerr := rootfs.Unsettled(root); uerr != nil || len(bad) > 0 {
		if uerr != nil {
			bad = []string{"dpkg's status cannot be read: " + uerr.Error()}
		}
		res.Unsettled = bad
		a.Log.Warn("install_packages left packages not fully installed", "rootfs", name, "unsettled", bad)
	}
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

// aptInBox runs prog (apt-get, dpkg) with args in the install box of the
// rootfs root: writable rootfs, host network, working directory scratch.
// Its output goes to out, and to tee as well when not nil.
func (a *App) aptInBox(ctx context.Context, root, scratch string, out io.Writer, tee io.Writer, prog string, args ...string) (sandbox.Exit, error) {
	if prog == "apt-get" {
		args = append([]string{"-q", "-o", "APT::Color=0", "-o", "Dpkg::Use-Pty=0"}, args...)
	}
	if out != io.Discard {
		fmt.Fprintf(out, "$ %s %s\n", prog, strings.Join(args, " "))
	}
	w := out
	if tee != nil {
		w = io.MultiWriter(out, tee)
	}
	return a.Sandbox.Run(ctx, &sandbox.Spec{
		Args:        append([]string{prog}, args...),
		Dir:         scratch,
		Env:         map[string]string{"DEBIAN_FRONTEND": "noninteractive", "DEBCONF_NONINTERACTIVE_SEEN": "true"},
		Network:     sandbox.NetworkFull,
		Rootfs:      root,
		RootfsAdmin: true,
		Stdout:      w,
		Stderr:      w,
	})
}

// limitedBuffer keeps the first max bytes written to it and notes that
// more came.
type limitedBuffer struct {
	bytes.Buffer
	max  int
	over bool
}

func (b *limitedBuffer) Write(p []byte) (int, error) {
	if room := b.max - b.Len(); len(p) > room {
		b.over = true
		b.Buffer.Write(p[:max(room, 0)])
		return len(p), nil
	}
	return b.Buffer.Write(p)
}

// checkAvailable checks each package argument against the apt lists of
// the rootfs root (and dpkg's status): its name must be offered exactly,
// its architecture and version too when given. It returns the refusal, and
// whether it is only that something is unknown (fresher lists may know it).
func checkAvailable(root, rootfsName string, pkgs []string) (refusal error, unknown bool) {
	av, files, err := rootfs.AptLists(root)
	if err != nil {
		return capability.Errorf(capability.Unavailable, "rootfs %q: its apt lists cannot be read (%v); nothing was installed", rootfsName, err), false
	}
	// Installed packages count as offered: apt knows them from dpkg's
	// status even when no list does.
	if st, err := rootfs.DpkgStatus(root); err == nil {
		for k, o := range st {
			if av[k] == nil {
				av[k] = o
			} else {
				av[k].Archs = append(av[k].Archs, o.Archs...)
				av[k].Versions = append(av[k].Versions, o.Versions...)
			}
		}
	}
	var problems []string
	for _, p := range pkgs {
		n, arch, ver := rootfs.SplitPackage(p)
		o := av[n]
		switch {
		case o == nil:
			msg := fmt.Sprintf("%q is not a package in rootfs %s's apt lists", n, rootfsName)
			if near := av.Closest(n, 3); len(near) > 0 {
				msg += " (did you mean " + strings.Join(near, ", ") + "?)"
			}
			problems = append(problems, msg)
			unknown = true
		case arch != "" && !slices.Contains(o.Archs, arch) && !slices.Contains(o.Archs, "all"):
			problems = append(problems, fmt.Sprintf("%q: package %s is not offered for architecture %s (offered: %s)", p, n, arch, strings.Join(o.Archs, ", ")))
			unknown = true
		case ver != "" && !slices.Contains(o.Versions, ver):
			problems = append(problems, fmt.Sprintf("%q: package %s has no version %s in the lists (known: %s)", p, n, ver, strings.Join(firstN(o.Versions, 5), ", ")))
			unknown = true
		}
	}
	if len(problems) == 0 {
		return nil, false
	}
	hint := "names are matched literally (no patterns, globs or +/- suffixes): use exact Debian package names"
	if files == 0 {
		hint = "rootfs " + rootfsName + " has no apt lists yet (apt-get update found none)"
	}
	return capability.Errorf(capability.InvalidArgument, "%s; %s; nothing was installed", strings.Join(problems, "; "), hint), unknown
}

func firstN(s []string, n int) []string { return s[:min(n, len(s))] }

// aptPlan is what `apt-get -s install` says apt would do.
type aptPlan struct {
	Inst, Remv, Conf []string // package names (without :arch)
	Notes            []string // "Note, selecting …" lines: apt read a name as something else
}

// parseAptPlan reads the simulation's output. over says it was cut, and
// then it is not trusted.
func parseAptPlan(out string, over bool) (*aptPlan, error) {
	if over {
		return nil, fmt.Errorf("apt's simulated plan is longer than %d bytes", aptSimulateMax)
	}
	p := &aptPlan{}
	for line := range strings.Lines(out) {
		line = strings.TrimRight(line, "\r\n")
		verb, rest, _ := strings.Cut(line, " ")
		pkg, _, _ := strings.Cut(rest, " ")
		pkg, _, _ = strings.Cut(pkg, ":")
		switch verb {
		case "Inst":
			p.Inst = append(p.Inst, pkg)
		case "Conf":
			p.Conf = append(p.Conf, pkg)
		case "Remv", "Purg":
			p.Remv = append(p.Remv, pkg)
		case "Note,":
			p.Notes = append(p.Notes, line)
		}
	}
	return p, nil
}

// check refuses a plan that removes anything, that apt reached by reading
// a name as a pattern or as another package, or that leaves out a
// package asked for that is not installed yet.
func (p *aptPlan) check(pkgs []string, installed map[string]string) error {
	if len(p.Remv) > 0 {
		return fmt.Errorf("apt would remove %s, which other sessions of this rootfs may use", strings.Join(p.Remv, ", "))
	}
	if len(p.Notes) > 0 {
		return fmt.Errorf("apt read a name as something else (%s)", strings.Join(p.Notes, "; "))
	}
	for _, a := range pkgs {
		n, _, ver := rootfs.SplitPackage(a)
		if slices.Contains(p.Inst, n) {
			continue
		}
		if v, ok := installed[n]; ok && (ver == "" || ver == v) {
			continue
		}
		return fmt.Errorf("apt would not install %s as named", a)
	}
	if len(p.Inst) > 0 && len(p.Conf) == 0 {
		return fmt.Errorf("apt's plan installs %d packages but configures none", len(p.Inst))
	}
	return nil
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
			return a.RepairRootfs(ctx, in.Rootfs, timeout)
		}))
}

// rootfsLock is what lockRootfs holds: call it to let go.
type rootfsLock struct {
	unlock, cancel func()
	start          time.Time // when the wait for the lock began
}

func (l *rootfsLock) done() { l.unlock(); l.cancel() }

// lockRootfs checks the rootfs name, waits for its lock within timeout
// (ctx gets that deadline) and checks again that it is ready: the one way
// install_packages and repair_rootfs start changing a shared rootfs. what
// says, in a refusal, what did not happen ("installed", "repaired").
func (a *App) lockRootfs(ctx context.Context, name string, timeout time.Duration, what string) (*rootfs.Manager, context.Context, *rootfsLock, error) {
	if err := rootfs.CheckName(name); err != nil {
		return nil, nil, nil, capability.Errorf(capability.InvalidArgument, "%v", err)
	}
	m := rootfs.New(rootfs.DirIn(a.DataDir))
	if !m.Ready(name) {
		return nil, nil, nil, missingRootfs(m, name)
	}
	l := &rootfsLock{start: time.Now()}
	ctx, l.cancel = context.WithTimeout(ctx, timeout)
	unlock, err := m.Lock(ctx, name)
	if err != nil {
		l.cancel()
		if errors.Is(err, rootfs.ErrBusy) {
			if errors.Is(ctx.Err(), context.Canceled) {
				return nil, nil, nil, capability.Errorf(capability.Canceled, "canceled while waiting for another change of rootfs %q", name)
			}
			return nil, nil, nil, capability.Errorf(capability.DeadlineExceeded,
				"rootfs %q was still being changed by another install (or repair, or removal) after %s, this call's timeout; nothing was %s: try again", name, timeout, what)
		}
		return nil, nil, nil, err
	}
	l.unlock = unlock
	if !m.Ready(name) { // removed while this call waited
		l.done()
		return nil, nil, nil, missingRootfs(m, name)
	}
	return m, ctx, l, nil
}

// RepairRootfs runs `dpkg --configure -a` and `apt-get -f install -y
// --no-remove` in the install box of the ready rootfs name, under its
// lock, and reports what dpkg shows unsettled before and after.
func (a *App) RepairRootfs(ctx context.Context, name string, timeout time.Duration) (*RepairRootfsResult, error) {
	m, ctx, lk, err := a.lockRootfs(ctx, name, timeout, "repaired")
	if err != nil {
		return nil, err
	}
	defer lk.done()
	start := lk.start
	root := m.Path(name)
	res := &RepairRootfsResult{Rootfs: name, Before: []string{}, After: []string{}}
	if res.Before, err = rootfs.Unsettled(root); err != nil {
		return nil, capability.Errorf(capability.Unavailable, "rootfs %q: dpkg's status cannot be read: %v", name, err)
	}
	scratch, err := os.MkdirTemp(m.Dir, ".repair-"+name+"-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(scratch)
	out := runcode.NewCapture(aptOutputMax, "", 0)
	out.Observed(ctx, "stdout")
	exit, err := a.aptInBox(ctx, root, scratch, out, nil, "dpkg", "--force-confdef", "--force-confold", "--configure", "-a")
	if err == nil && exit.Code == 0 && !exit.TimedOut {
		exit, err = a.aptInBox(ctx, root, scratch, out, nil, "apt-get", "-f", "-y", "--no-install-recommends", "--no-remove",
			"-o", "Dpkg::Options::=--force-confdef", "-o", "Dpkg::Options::=--force-confold", "install")
	}
	if err != nil {
		var se *sandbox.StartError
		if errors.As(err, &se) {
			return nil, capability.Errorf(capability.Unavailable, "repair_rootfs %q: %v", name, err)
		}
		return nil, err
	}
	res.ExitCode, res.TimedOut, res.Output = exit.Code, exit.TimedOut, out.Finish().Text
	if res.After, err = rootfs.Unsettled(root); err != nil {
		res.After = []string{"dpkg's status cannot be read: " + err.Error()}
	}
	if res.Before == nil {
		res.Before = []string{}
	}
	if res.After == nil {
		res.After = []string{}
	}
	res.DurationMS = millis(time.Since(start))
	return res, nil
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
