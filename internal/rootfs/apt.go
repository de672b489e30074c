package rootfs

// This file drives apt inside a ready rootfs: installing packages into it
// and settling what an interrupted install left. install_packages and
// repair_rootfs (internal/app/packages.go) and `quro rootfs
// install-packages` come here; they check their inputs and shape the
// results.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/quro-dev/quro/internal/limitbuf"
	"github.com/quro-dev/quro/internal/sandbox"
)

const (
	// ListsMaxAge is how old the apt lists may be before an install runs
	// `apt-get update` first.
	ListsMaxAge = 24 * time.Hour
	// ListsFreshFor is how long after an `apt-get update` the lists are
	// taken as the mirror's: a name they lack (or a step that fails for
	// what stale lists would explain) updates them only when they are
	// older. The mirror changes a few times a day; a model that misspells
	// three names in three calls fetches them once, not three times.
	ListsFreshFor = 5 * time.Minute
	// simulateMax bounds the output of `apt-get -s install` kept to read
	// its plan.
	simulateMax = 8 << 20
)

var (
	// ErrRefused reports an install refused for what it asked: a name,
	// architecture or version the apt lists do not have, or an apt plan
	// that would remove a package, read a name as another or leave one
	// out. apt changed nothing; the caller changes the request.
	ErrRefused = errors.New("rootfs: install refused")
	// ErrUnsettled reports a rootfs where dpkg left packages not fully
	// installed: installs are refused until Apt.Repair settles it.
	ErrUnsettled = errors.New("rootfs: packages not fully installed")
	// ErrUnreadable reports a rootfs whose dpkg status or apt lists cannot
	// be read.
	ErrUnreadable = errors.New("rootfs: dpkg's status or apt's lists cannot be read")
)

// kindError is an error of a kind (ErrRefused, ErrBadPackage, …) with its
// own message.
type kindError struct {
	kind error
	msg  string
}

func (e *kindError) Error() string        { return e.msg }
func (e *kindError) Is(target error) bool { return target == e.kind }

func errorf(kind error, format string, a ...any) error {
	return &kindError{kind, fmt.Sprintf(format, a...)}
}

// WaitError reports that waiting for the lock of a rootfs another
// install, repair or removal held ended first: the call's timeout passed,
// or it was canceled. It is ErrBusy.
type WaitError struct {
	Name     string
	Timeout  time.Duration
	Canceled bool // canceled by the caller; else the timeout passed
}

func (e *WaitError) Error() string {
	if e.Canceled {
		return fmt.Sprintf("canceled while waiting for another change of rootfs %q", e.Name)
	}
	return fmt.Sprintf("rootfs %q was still being changed by another install (or repair, or removal) after %s, this call's timeout", e.Name, e.Timeout)
}

func (e *WaitError) Unwrap() error { return ErrBusy }

// CheckAptArg validates one package argument of Apt.Install: CheckPackage,
// and none of apt-get install's suffix markers. apt-get reads a trailing
// '-' as "remove this" and a trailing '+' as "install this" (after an
// architecture or version it would cut those): only a bare name that
// exists may end in '+' (g++), which the check against the lists settles.
// The error is ErrBadPackage.
func CheckAptArg(p string) error {
	if err := CheckPackage(p); err != nil {
		return err
	}
	n, arch, ver := SplitPackage(p)
	switch {
	case strings.HasSuffix(p, "-"):
		return errorf(ErrBadPackage, "%q ends in '-', which apt-get reads as \"remove this package\": packages are only installed here; name packages exactly; nothing was installed", p)
	case strings.HasSuffix(p, "+") && (arch != "" || ver != ""):
		return errorf(ErrBadPackage, "%q ends in '+', which apt-get reads as a marker, not part of the version or architecture: name packages exactly; nothing was installed", p)
	case n == "":
		return errorf(ErrBadPackage, "%q has no package name", p)
	}
	return nil
}

// Apt runs apt-get and dpkg in the install box of the ready rootfses of
// M: the rootfs writable (sandbox.Spec.RootfsAdmin), the host's network,
// and a scratch working directory beside the rootfs (never in it, never a
// session's). Every change holds the rootfs's lock (Manager.Lock), so that
// changes of one rootfs run one at a time and never during an install or a
// removal. Whoever calls it has checked that the caller may use the
// network: this is the server fetching Debian packages, like Install.
type Apt struct {
	M  *Manager
	SB *sandbox.Sandbox
	// Log is told what cannot be reported otherwise (a marker that could
	// not be updated, packages left unsettled); nil: slog.Default().
	Log *slog.Logger
}

func (a *Apt) log() *slog.Logger {
	if a.Log == nil {
		return slog.Default()
	}
	return a.Log
}

// InstallResult is what Apt.Install did.
type InstallResult struct {
	// Installed are the packages dpkg newly lists (dependencies too), as
	// "name version", sorted; Upgraded those whose version changed, as
	// "name old -> new".
	Installed, Upgraded []string
	// Updated says `apt-get update` ran (the lists were missing or older
	// than ListsMaxAge, or the install could not find a package and they
	// were older than ListsFreshFor).
	Updated bool
	// Unsettled are the packages dpkg left not fully installed, as "name
	// (state)": the rootfs needs Repair before the next install.
	Unsettled []string
	// Exit is how the last apt-get ended: a timeout or a cancel is here,
	// not an error.
	Exit sandbox.Exit
	// Waited is how long the call waited for the rootfs's lock; Duration
	// the whole call, the wait included.
	Waited, Duration time.Duration
}

// Install installs pkgs (each accepted by CheckAptArg) into the ready
// rootfs name: `apt-get update` when the lists are older than ListsMaxAge
// (or were never updated since the build), or when a package is not found
// and they are older than ListsFreshFor (at most once a call); then each name is matched literally against the lists, apt's plan is
// simulated and must remove nothing and install exactly what was named;
// then `apt-get install --no-remove`. The lock is waited for, and all of it
// runs, within timeout. apt's output goes to out as it runs.
//
// Errors: ErrBadName, ErrBadPackage, ErrNotInstalled, a *WaitError,
// ErrUnsettled, ErrUnreadable, ErrRefused (apt changed nothing), or the
// sandbox's (a *sandbox.StartError when apt cannot start).
func (a *Apt) Install(ctx context.Context, name string, pkgs []string, timeout time.Duration, out io.Writer) (*InstallResult, error) {
	if len(pkgs) == 0 {
		return nil, errorf(ErrBadPackage, "name at least one package")
	}
	for _, p := range pkgs {
		if err := CheckAptArg(p); err != nil {
			return nil, err
		}
	}
	ctx, l, err := a.lock(ctx, name, timeout, out)
	if err != nil {
		return nil, err
	}
	defer l.done()
	res := &InstallResult{Installed: []string{}, Waited: time.Since(l.start)}
	info, err := a.M.Info(name)
	if err != nil {
		return nil, err
	}
	root := a.M.Path(name)
	if err := checkSettled(root, name); err != nil {
		return nil, err
	}
	scratch, err := os.MkdirTemp(a.M.Dir, ".apt-"+name+"-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(scratch)
	c := &aptInstall{a: a, ctx: ctx, name: name, root: root, scratch: scratch, out: out,
		pkgs: pkgs, before: Installed(root), res: res, listsAt: info.ListsUpdated}
	var exit sandbox.Exit
	if age := time.Since(info.ListsUpdated); age > ListsMaxAge || age < 0 { // a date ahead of the clock: updated too
		exit, err = c.update()
	}
	if exit, err = c.install(exit, err); err != nil {
		return nil, err
	}
	c.record(exit)
	res.Duration = time.Since(l.start)
	return res, nil
}

// checkSettled refuses a rootfs left half-configured (by an earlier
// install, or anything else): it fails every install, so say so and how
// to settle it instead.
func checkSettled(root, name string) error {
	if bad, err := Unsettled(root); err != nil {
		return errorf(ErrUnreadable, "rootfs %q: dpkg's status cannot be read (%v); nothing was installed", name, err)
	} else if len(bad) > 0 {
		return errorf(ErrUnsettled,
			"rootfs %q has packages dpkg did not finish installing: %s. Nothing was installed: an admin settles it with `quro rootfs repair %s` (or repair_rootfs rootfs=%s)",
			name, strings.Join(bad, ", "), name, name)
	}
	return nil
}

// aptInstall is one Install call, locked and checked: the steps it runs
// and what they found.
type aptInstall struct {
	a       *Apt
	ctx     context.Context
	name    string // of the rootfs
	root    string
	scratch string
	out     io.Writer
	pkgs    []string
	before  map[string]string // Installed(root) before the call
	res     *InstallResult
	updated time.Time // when this call's `apt-get update` succeeded
	listsAt time.Time // when the lists were last updated (zero: never since the build)
}

// aptOpts are the options of both the simulated and the real install.
var aptOpts = []string{"-y", "--no-install-recommends",
	"-o", "Dpkg::Options::=--force-confdef", "-o", "Dpkg::Options::=--force-confold"}

func aptOK(e sandbox.Exit) bool { return e.Code == 0 && !e.TimedOut && !e.Canceled }

func (c *aptInstall) apt(args ...string) (sandbox.Exit, error) {
	return c.a.inBox(c.ctx, c.root, c.scratch, c.out, nil, "apt-get", args...)
}

func (c *aptInstall) update() (sandbox.Exit, error) {
	c.res.Updated = true
	var failed fetchFailures
	e, err := c.a.inBox(c.ctx, c.root, c.scratch, c.out, &failed, "apt-get", "update")
	// apt-get update exits 0 when an index could not be fetched (a
	// warning): such lists are not fresh, or a network blip would hold
	// off every update for ListsFreshFor and refuse names as unknown.
	if err == nil && e.Code == 0 && !failed.seen() {
		c.updated = time.Now()
		c.listsAt = c.updated
	}
	return e, err
}

// fetchFailures watches apt-get update's output for a list it could not
// fetch ("W: Failed to fetch …", "Some index files failed to download").
type fetchFailures struct {
	mu     sync.Mutex
	tail   []byte // the end of the output so far, for a line split across writes
	failed bool
}

func (f *fetchFailures) Write(p []byte) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	buf := append(append([]byte(nil), f.tail...), p...)
	if bytes.Contains(buf, []byte("Failed to fetch")) || bytes.Contains(buf, []byte("index files failed to download")) {
		f.failed = true
	}
	if len(buf) > 64 {
		buf = buf[len(buf)-64:]
	}
	f.tail = buf
	return len(p), nil
}

func (f *fetchFailures) seen() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.failed
}

// mayUpdate says whether a failure may be retried after `apt-get update`:
// once per call, not once the call is over, and not while the lists are
// fresh (updated less than ListsFreshFor ago, by this call or another).
func (c *aptInstall) mayUpdate() bool {
	return !c.res.Updated && c.ctx.Err() == nil && !c.fresh()
}

// fresh says the lists were updated less than ListsFreshFor ago. A time
// in the future (a marker written under another clock) is not fresh: it
// would hold off every update until the clock reached it.
func (c *aptInstall) fresh() bool {
	age := time.Since(c.listsAt)
	return age >= 0 && age <= ListsFreshFor
}

// listsNote says, in a refusal of an unknown name, that the lists it was
// checked against are fresh (so the name is not the lists' fault), or ""
// when they are not.
func (c *aptInstall) listsNote() string {
	if !c.fresh() {
		return ""
	}
	return fmt.Sprintf("the apt lists are fresh (updated %s ago)", time.Since(c.listsAt).Round(time.Second))
}

// refuse ends the call before the install with err; lists fetched on the
// way are recorded, so the next call does not fetch them again.
func (c *aptInstall) refuse(err error) error {
	if !c.updated.IsZero() {
		if merr := c.a.M.AddPackages(c.name, nil, c.updated); merr != nil {
			c.a.log().Warn("apt install: could not update the rootfs marker", "rootfs", c.name, "err", merr)
		}
	}
	return err
}

// install checks the names, simulates and installs, updating the lists
// once when a step fails for what stale lists would explain. It starts
// from the exit and error of the update run before it, if any, and
// returns the last step's exit, or an error that ends the call (a refusal
// included).
func (c *aptInstall) install(exit sandbox.Exit, err error) (sandbox.Exit, error) {
	for err == nil && aptOK(exit) {
		// Names are matched literally, against the lists apt has: an
		// unknown one never reaches apt, where it could be read as a
		// pattern (cowsa. is a regex for a hundred packages).
		if refusal, unknown := checkAvailable(c.root, c.name, c.pkgs, c.listsNote()); refusal != nil {
			if unknown && c.mayUpdate() {
				// Lists a day old can miss a package or a version.
				if exit, err = c.update(); err == nil && aptOK(exit) {
					continue
				}
				break
			}
			return exit, c.refuse(refusal)
		}
		var sim *limitbuf.Buffer
		if exit, sim, err = c.simulate(); err != nil {
			break
		}
		if !aptOK(exit) {
			_, _ = c.out.Write(sim.Bytes()) // progress for the caller, as the lines printed to out above
			if c.mayUpdate() {
				if exit, err = c.update(); err == nil && aptOK(exit) {
					continue
				}
			}
			break
		}
		plan, perr := parseAptPlan(sim.String(), sim.Over())
		if perr == nil {
			perr = plan.check(c.pkgs, c.before)
		}
		if perr != nil {
			return exit, c.refuse(errorf(ErrRefused, "the install into rootfs %q was refused: %v; nothing was installed", c.name, perr))
		}
		fmt.Fprintf(c.out, "apt would install %d packages and remove none\n", len(plan.Inst))
		exit, err = c.apt(append(append(slices.Clone(aptOpts), "--no-remove", "install"), c.pkgs...)...)
		if err == nil && exit.Code != 0 && c.mayUpdate() {
			// A version the mirror no longer has: update once and try
			// again, from the check of the names.
			if exit, err = c.update(); err == nil && aptOK(exit) {
				continue
			}
		}
		break
	}
	return exit, err
}

// simulate runs `apt-get -s install`: what apt would do, before it does
// it. Nothing may be removed, and apt must install exactly the packages
// named (and their dependencies), never a match of a pattern; the plan is
// in the buffer returned.
func (c *aptInstall) simulate() (sandbox.Exit, *limitbuf.Buffer, error) {
	sim := &limitbuf.Buffer{Max: simulateMax}
	fmt.Fprintf(c.out, "$ apt-get -s install %s\n", strings.Join(c.pkgs, " "))
	exit, err := c.a.inBox(c.ctx, c.root, c.scratch, io.Discard, sim, "apt-get", append(append(slices.Clone(aptOpts), "-s", "install"), c.pkgs...)...)
	return exit, sim, err
}

// record fills the result from the install's exit and what it changed in
// the rootfs, and records the packages (and lists update) in its marker.
func (c *aptInstall) record(exit sandbox.Exit) {
	res := c.res
	res.Exit = exit
	after := Installed(c.root)
	if bad, uerr := Unsettled(c.root); uerr != nil || len(bad) > 0 {
		if uerr != nil {
			bad = []string{"dpkg's status cannot be read: " + uerr.Error()}
		}
		res.Unsettled = bad
		c.a.log().Warn("apt install left packages not fully installed", "rootfs", c.name, "unsettled", bad)
	}
	for _, p := range slices.Sorted(maps.Keys(after)) {
		switch old, ok := c.before[p]; {
		case !ok:
			res.Installed = append(res.Installed, p+" "+after[p])
		case old != after[p]:
			res.Upgraded = append(res.Upgraded, p+" "+old+" -> "+after[p])
		}
	}
	var added []string
	if exit.Code == 0 && !exit.TimedOut {
		added = c.pkgs
	}
	if err := c.a.M.AddPackages(c.name, added, c.updated); err != nil {
		c.a.log().Warn("apt install: could not update the rootfs marker", "rootfs", c.name, "err", err)
	}
}

// RepairResult is what Apt.Repair did.
type RepairResult struct {
	// Before and After are the packages dpkg shows as not fully
	// installed, as "name (state)", before and after the repair.
	Before, After []string
	Exit          sandbox.Exit // of the last step that ran
	Duration      time.Duration
}

// Repair runs `dpkg --configure -a` and `apt-get -f install -y
// --no-remove` in the install box of the ready rootfs name, under its lock
// (waited for within timeout, like all of it), and reports what dpkg shows
// unsettled before and after. Nothing is removed. Output goes to out.
//
// Errors: ErrBadName, ErrNotInstalled, a *WaitError, ErrUnreadable, or the
// sandbox's.
func (a *Apt) Repair(ctx context.Context, name string, timeout time.Duration, out io.Writer) (*RepairResult, error) {
	ctx, l, err := a.lock(ctx, name, timeout, out)
	if err != nil {
		return nil, err
	}
	defer l.done()
	root := a.M.Path(name)
	res := &RepairResult{}
	if res.Before, err = Unsettled(root); err != nil {
		return nil, errorf(ErrUnreadable, "rootfs %q: dpkg's status cannot be read: %v", name, err)
	}
	scratch, err := os.MkdirTemp(a.M.Dir, ".repair-"+name+"-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(scratch)
	exit, err := a.inBox(ctx, root, scratch, out, nil, "dpkg", "--force-confdef", "--force-confold", "--configure", "-a")
	if err == nil && exit.Code == 0 && !exit.TimedOut {
		exit, err = a.inBox(ctx, root, scratch, out, nil, "apt-get", "-f", "-y", "--no-install-recommends", "--no-remove",
			"-o", "Dpkg::Options::=--force-confdef", "-o", "Dpkg::Options::=--force-confold", "install")
	}
	if err != nil {
		return nil, err
	}
	res.Exit = exit
	if res.After, err = Unsettled(root); err != nil {
		res.After = []string{"dpkg's status cannot be read: " + err.Error()}
	}
	if res.Before == nil {
		res.Before = []string{}
	}
	if res.After == nil {
		res.After = []string{}
	}
	res.Duration = time.Since(l.start)
	return res, nil
}

// aptLock is what lock holds: call done to let go.
type aptLock struct {
	unlock, cancel func()
	start          time.Time // when the wait for the lock began
}

func (l *aptLock) done() { l.unlock(); l.cancel() }

// lock checks the rootfs name, waits for its lock within timeout (the
// context returned has that deadline) and checks again that it is ready:
// the one way Install and Repair start changing a shared rootfs. A wait
// begins with a line on out saying so.
func (a *Apt) lock(ctx context.Context, name string, timeout time.Duration, out io.Writer) (context.Context, *aptLock, error) {
	if err := CheckName(name); err != nil {
		return nil, nil, err
	}
	if !a.M.Ready(name) {
		return nil, nil, fmt.Errorf("%w: %q", ErrNotInstalled, name)
	}
	l := &aptLock{start: time.Now()}
	ctx, l.cancel = context.WithTimeout(ctx, timeout)
	unlock, err := a.M.tryLock(name)
	if errors.Is(err, ErrBusy) {
		// Said on the output as the wait begins: the caller (a model
		// watching the stream) learns why nothing happens yet.
		if out != nil {
			fmt.Fprintf(out, "# waiting for another change of rootfs %q to finish (at most %v)\n", name, timeout)
		}
		unlock, err = a.M.Lock(ctx, name)
	}
	if err != nil {
		l.cancel()
		if errors.Is(err, ErrBusy) {
			return nil, nil, &WaitError{Name: name, Timeout: timeout, Canceled: errors.Is(ctx.Err(), context.Canceled)}
		}
		return nil, nil, err
	}
	l.unlock = unlock
	if !a.M.Ready(name) { // removed while this call waited
		l.done()
		return nil, nil, fmt.Errorf("%w: %q", ErrNotInstalled, name)
	}
	return ctx, l, nil
}

// inBox runs prog (apt-get, dpkg) with args in the install box of the
// rootfs root: writable rootfs, host network, working directory scratch.
// Its output goes to out, and to tee as well when not nil.
func (a *Apt) inBox(ctx context.Context, root, scratch string, out io.Writer, tee io.Writer, prog string, args ...string) (sandbox.Exit, error) {
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
	return a.SB.Run(ctx, &sandbox.Spec{
		Args:        append([]string{prog}, args...),
		Dir:         scratch,
		Env:         map[string]string{"DEBIAN_FRONTEND": "noninteractive", "DEBCONF_NONINTERACTIVE_SEEN": "true"},
		Network:     sandbox.NetworkHost,
		Rootfs:      root,
		RootfsAdmin: true,
		Stdout:      w,
		Stderr:      w,
	})
}

// checkAvailable checks each package argument against the apt lists of
// the rootfs root (and dpkg's status): its name must be offered exactly,
// its architecture and version too when given. It returns the refusal
// (ErrRefused, or ErrUnreadable), and whether it is only that something is
// unknown (fresher lists may know it). lists, when not "", says how fresh
// the lists are, in the refusal.
func checkAvailable(root, rootfsName string, pkgs []string, lists string) (refusal error, unknown bool) {
	av, files, err := AptLists(root)
	if err != nil {
		return errorf(ErrUnreadable, "rootfs %q: its apt lists cannot be read (%v); nothing was installed", rootfsName, err), false
	}
	// Installed packages count as offered: apt knows them from dpkg's
	// status even when no list does.
	if st, err := DpkgStatus(root); err == nil {
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
		n, arch, ver := SplitPackage(p)
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
			problems = append(problems, fmt.Sprintf("%q: package %s has no version %s in the lists (known: %s)", p, n, ver, strings.Join(o.Versions[:min(5, len(o.Versions))], ", ")))
			unknown = true
		}
	}
	if len(problems) == 0 {
		return nil, false
	}
	hint := "names are matched literally (no patterns, globs or +/- suffixes): use exact Debian package names"
	if files == 0 {
		hint = "rootfs " + rootfsName + " has no apt lists yet (apt-get update found none)"
	} else if lists != "" {
		hint += "; " + lists
	}
	return errorf(ErrRefused, "%s; %s; nothing was installed", strings.Join(problems, "; "), hint), unknown
}

// aptPlan is what `apt-get -s install` says apt would do.
type aptPlan struct {
	Inst, Remv, Conf []string // package names (without :arch)
	Notes            []string // "Note, selecting …" lines: apt read a name as something else
}

// parseAptPlan reads the simulation's output. over says it was cut, and
// then it is not trusted.
func parseAptPlan(out string, over bool) (*aptPlan, error) {
	if over {
		return nil, fmt.Errorf("apt's simulated plan is longer than %d bytes", simulateMax)
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
		n, _, ver := SplitPackage(a)
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
