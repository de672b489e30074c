package app

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"net/url"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/quro-dev/quro/internal/capability"
	"github.com/quro-dev/quro/internal/egress"
	"github.com/quro-dev/quro/internal/engine/python"
	"github.com/quro-dev/quro/internal/pip"
	"github.com/quro-dev/quro/internal/runcode"
	"github.com/quro-dev/quro/internal/sandbox"
	"github.com/quro-dev/quro/internal/session"
)

// PipOptions configure pip for the sessions.
type PipOptions struct {
	// IndexURL is the index pip uses in sessions with network, and the
	// only one (with ExtraIndexURLs) the server fetches from for
	// install_packages {manager: pip}; "" is pip's default (PyPI).
	IndexURL       string
	ExtraIndexURLs []string
	// FetchRetries is how many times the server's fetch retries a
	// connection to an index that failed or an index's server error
	// (pip.Fetch.Retries): 0 is pip's default (5); negative, none.
	FetchRetries int
}

// CheckIndexURL checks an index URL of the server's configuration: http
// or https, with a host.
func CheckIndexURL(s string) error {
	u, err := url.Parse(s)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || strings.ContainsAny(s, " \t\n") {
		return fmt.Errorf("pip index URL %q: want an http:// or https:// URL with a host (e.g. https://pypi.org/simple)", s)
	}
	return nil
}

// withoutUserinfo is an index URL (checked by CheckIndexURL) without the
// user and password it may carry.
func withoutUserinfo(s string) string {
	u, err := url.Parse(s)
	if err != nil {
		return ""
	}
	u.User = nil
	return u.String()
}

// pipSetup is pip for the sessions of an App: what every run of a session
// gets (sandbox.Options.RunEnv) and the tenants' wheel caches.
type pipSetup struct {
	opts     PipOptions
	cache    *pip.Cache
	tenants  *tenants
	basePath string // the sandbox's PATH
	pyRoot   string // where the embedded Python and pip are extracted
	// emb is the embedded Python engine, once the App has made it: its
	// BoxDirs are what of pyRoot/python a box shows.
	emb atomic.Pointer[python.Embedded]
	// sb is the Sandbox whose runs get runEnv, set before its first run:
	// the directories above are named where its boxes show them.
	sb      *sandbox.Sandbox
	hostBin string // python3, python, pip, pip3 of the embedded Python
	rootBin string // pip, pip3 run by a rootfs's python3
	ensured sync.Map
}

func newPipSetup(dataDir, pyRoot, basePath string, tl *tenants, o PipOptions) *pipSetup {
	p := &pipSetup{opts: o, cache: &pip.Cache{Root: filepath.Join(dataDir, "pip")}, tenants: tl, basePath: basePath,
		pyRoot: pyRoot}
	p.hostBin, p.rootBin = python.ShimDirs(pyRoot)
	if p.basePath == "" {
		p.basePath = sandbox.DefaultPath
	}
	return p
}

// withFirst puts dir first on PATH, after quro's own bin directory.
func (p *pipSetup) withFirst(dir string) string {
	if dir == "" {
		return p.basePath
	}
	if rest, ok := strings.CutPrefix(p.basePath, sandbox.BinDir+":"); ok {
		return sandbox.BinDir + ":" + dir + ":" + rest
	}
	return dir + ":" + p.basePath
}

// boxDirs are the directories of pyRoot/python that boxes show read-only
// (sandbox.Options.BoxReadOnlyNow, and each run's RunEnv): the ready ones
// of python.Embedded.BoxDirs, never the rest of pyRoot/python.
func (p *pipSetup) boxDirs() []string {
	if e := p.emb.Load(); e != nil {
		return e.BoxDirs()
	}
	return nil
}

// WheelsInBox is where a box shows the tenants' wheel caches
// (<data>/pip: sandbox.Options.Places), of which it binds only its
// tenant's wheels directory.
const WheelsInBox = sandbox.RunDir + "/wheels"

// inBox is where the runs of p.sb see the host path d (one of the
// interpreter's directories, a tenant's wheels): its box path
// (sandbox.Options.Places) when they start in a box, else d.
func (p *pipSetup) inBox(d string) string {
	if p.sb == nil || d == "" {
		return d
	}
	at, _ := p.sb.BoxPath(d)
	return at
}

// wheels makes tenant's cache (once per App) and returns its wheels
// directory.
func (p *pipSetup) wheels(tenant string) (string, error) {
	if d, ok := p.ensured.Load(tenant); ok {
		return d.(string), nil
	}
	d, err := p.cache.Ensure(tenant)
	if err != nil {
		return "", err
	}
	p.ensured.Store(tenant, d)
	return d, nil
}

// runEnv is sandbox.Options.RunEnv: for a run of a session, the
// session's Python first on PATH (the embedded one on the host userland;
// pip of the rootfs's python3 on a rootfs), pip's user scheme (installs go
// to $HOME/.local: the workspace), its cache in the session's tmp
// directory, the tenant's wheels (read-only) as a source, and the index:
// none under network none (PIP_NO_INDEX: pip fails at once instead of
// retrying an unreachable index), else the server's: under internet pip
// reaches it through the session's egress, as the session's policy
// allows. The session's own variables (PIP_INDEX_URL…) come after these
// and win.
func (p *pipSetup) runEnv(spec *sandbox.Spec, network string) sandbox.RunEnv {
	id, sdir, ok := p.tenants.sessionDir(spec.Dir)
	if !ok {
		return sandbox.RunEnv{}
	}
	tenant, ok := p.tenants.tenantOf(id)
	if !ok {
		return sandbox.RunEnv{}
	}
	env := map[string]string{
		"PIP_USER":                      "1",
		"PIP_DISABLE_PIP_VERSION_CHECK": "1",
		"PIP_ROOT_USER_ACTION":          "ignore",
		// PEP 668: a rootfs's Debian python3 is "externally managed", and
		// pip refuses even --user installs there. With PIP_USER pip
		// writes only the user site (the system directories are
		// read-only in the box anyway).
		"PIP_BREAK_SYSTEM_PACKAGES": "1",
	}
	// In the session's temporary directory, named where the box shows it
	// (sandbox.BoxTmp), never at its host path.
	tmp := cmp.Or(spec.TmpDir, filepath.Join(sdir, "tmp"))
	env["PIP_CACHE_DIR"] = p.sb.TmpPath(tmp, filepath.Join(tmp, "pip-cache"))
	if d := python.PipDir(p.pyRoot); d != "" {
		env["QURO_PIP_DIR"] = p.inBox(d)
	}
	// The interpreter's tree (the shims), pip's and the worker module's
	// directories, once ready: every session box made since shows them
	// (Options.BoxReadOnlyNow), and so does a run that gets a box of its
	// own.
	ro := p.boxDirs()
	if w, err := p.wheels(tenant); err == nil {
		env["PIP_FIND_LINKS"] = p.inBox(w)
		ro = append(ro, w)
	}
	if network == sandbox.NetworkNone || network == sandbox.NetworkInternet && indexOffTheInternet(p.opts.IndexURL) {
		// No network, or (under internet) an operator's index on its own loopback or
		// private network, which a box's egress never reaches: pip asks
		// the server to fetch (install_packages), as without network.
		env["PIP_NO_INDEX"] = "1"
		env["QURO_PIP_OFFLINE"] = "1"
	} else {
		// Without their userinfo: credentials in the server's index URLs
		// are for the server's own fetch (install_packages), never shown
		// to a session.
		if p.opts.IndexURL != "" {
			env["PIP_INDEX_URL"] = withoutUserinfo(p.opts.IndexURL)
		}
		if len(p.opts.ExtraIndexURLs) > 0 {
			extra := make([]string, len(p.opts.ExtraIndexURLs))
			for i, u := range p.opts.ExtraIndexURLs {
				extra[i] = withoutUserinfo(u)
			}
			env["PIP_EXTRA_INDEX_URL"] = strings.Join(extra, " ")
		}
	}
	if spec.Rootfs == "" {
		env["PATH"] = p.withFirst(p.inBox(p.hostBin))
	} else {
		env["PATH"] = p.withFirst(p.inBox(p.rootBin))
		// `python3 -m pip` is Quro's pip too, not the rootfs's own (Debian
		// 12's 23.0.1, if installed, or none): one pip in the session. The
		// resident worker runs -E (it ignores this); what it starts does not.
		if d := python.PipDir(p.pyRoot); d != "" {
			env["PYTHONPATH"] = p.inBox(d)
		}
	}
	return sandbox.RunEnv{Env: env, ReadOnly: ro}
}

// installPip is install_packages {manager: pip}: the requirements are
// installed into the session's user site by pip in the session's own box
// from the tenant's wheel cache only (--no-index); what the cache lacks is
// fetched first by the server (pip.Cache.Fetch: a helper box with a
// network namespace of its own and no session directory, from the
// server's indexes only), whatever the session's network.
func (a *App) installPip(ctx context.Context, sess *session.Session, reqs []string, timeout time.Duration) (*InstallPackagesResult, error) {
	if err := pip.CheckRequirements(reqs); err != nil {
		return nil, capability.Errorf(capability.InvalidArgument, "%v", err)
	}
	start := time.Now()
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if _, _, err := a.Python.Installed(ctx); err != nil {
		return nil, fmt.Errorf("pip needs the embedded Python's preparation (pip comes with it): %w", err)
	}
	p := a.pip
	wheels, err := p.wheels(sess.Tenant)
	if err != nil {
		return nil, err
	}
	out := runcode.NewCapture(aptOutputMax, "", 0)
	out.Observed(ctx, "stdout")
	res := &InstallPackagesResult{Manager: "pip", Packages: reqs, Rootfs: sess.Rootfs}

	// First from the cache alone, quietly: a wheel any session of the
	// tenant fetched before is a local read. Its output is bounded as the
	// second pass's is: pip runs in the session's box with its user site,
	// whose .pth files the session wrote and which run in pip.
	first := runcode.NewCapture(aptOutputMax, "", 0)
	code, err := a.pipInSession(ctx, sess, wheels, reqs, first)
	if err != nil {
		return nil, err
	}
	if code == 0 {
		out.Write([]byte(first.Finish().Text))
		res.FromCache = true
	} else {
		fmt.Fprintf(out, "quro: fetching %s with pip download (wheels only) from the server's index into the tenant's cache\n", strings.Join(reqs, " "))
		// pip in the fetch box works in host paths under the data
		// directory (its scratch and temporary directories), which its
		// output names: the tenant reads them as $QURO_DATA.
		fetchOut := &dataDirWriter{w: out, dir: a.DataDir}
		// PipDir and Python as the fetch box shows them (BoxPlaces);
		// HostPipDir is what it binds there.
		f := &pip.Fetch{SB: a.Sandbox, PipDir: p.inBox(python.PipDir(p.pyRoot)), HostPipDir: python.PipDir(p.pyRoot), Index: p.opts.IndexURL, Extra: p.opts.ExtraIndexURLs, Retries: p.opts.FetchRetries, Reqs: reqs, Out: fetchOut, TenantDir: sess.Workspace(),
			Egress: func(pol *egress.Policy) pip.FetchEgress { return a.egress.helper(pol) }, Resolve: a.network.Resolve}
		if sess.Rootfs != "" {
			dir, err := RootfsDir(a.DataDir)(sess.Rootfs)
			if err != nil {
				return nil, err
			}
			f.Python, f.Rootfs = "/usr/bin/python3", dir
		} else {
			f.Python, f.ReadOnly = p.inBox(filepath.Join(p.hostBin, "python3")), p.boxDirs()
		}
		fr, err := p.cache.Fetch(ctx, sess.Tenant, f)
		fetchOut.Flush()
		if err != nil {
			return nil, a.pipError(err, reqs)
		}
		for _, w := range fr.Added {
			res.Wheels = append(res.Wheels, w.Name)
		}
		for _, s := range fr.Skipped {
			fmt.Fprintf(out, "quro: not cached: %s\n", s)
		}
		refused := refusedOf(fr.Refused, fr.Denied)
		if refused != "" {
			fmt.Fprintf(out, "quro: %s\n", refused)
		}
		if fr.ExitCode != 0 {
			view := out.Finish()
			if refused != "" {
				return nil, capability.Errorf(capability.PermissionDenied, "pip could not fetch %s (pip download exit_code=%d%s): %s; pip said: %s",
					strings.Join(reqs, " "), fr.ExitCode, timedOut(fr.Exit), refused, pipReason(view.Text))
			}
			return nil, p.fetchError(reqs, fr, view.Text)
		}
		code, err = a.pipInSession(ctx, sess, wheels, reqs, out)
		if err != nil {
			return nil, err
		}
	}
	view := out.Finish()
	res.ExitCode, res.Output, res.DurationMS = code, view.Text, millis(time.Since(start))
	if code != 0 {
		return nil, capability.Errorf(capability.NotFound, "pip could not install %s in session %s (exit_code=%d): %s",
			strings.Join(reqs, " "), sess.Name, code, pipReason(view.Text))
	}
	return res, nil
}

// fetchError is the error of a fetch that pip failed: whether the
// server's index could not be reached (its setting or the server's
// network) or it answered without the package, which pip words alike
// ("from versions: none").
func (p *pipSetup) fetchError(reqs []string, fr *pip.FetchResult, out string) error {
	what := strings.Join(reqs, " ")
	index := "the package index " + p.indexName()
	why := pip.Diagnose(out)
	if len(fr.Unreached) > 0 {
		why = pip.Unreachable
	}
	switch why {
	case pip.Unreachable:
		return capability.Errorf(capability.Unavailable,
			"pip could not fetch %s: %s could not be reached%s (pip download exit_code=%d%s), so whether it has the package is unknown; "+
				"the server's index setting (quro serve --pip-index-url) or the server's network is why, not the name; pip said: %s",
			what, index, unreached(fr.Unreached), fr.ExitCode, timedOut(fr.Exit), pipReason(out))
	case pip.NotOnIndex:
		return capability.Errorf(capability.NotFound,
			"%s: not found on %s, which answered: it has no version of it for this Python and platform as a wheel; check the name and version (pip said: %s)",
			what, index, pipReason(out))
	}
	return capability.Errorf(capability.NotFound, "pip could not fetch %s (pip download exit_code=%d%s): %s",
		what, fr.ExitCode, timedOut(fr.Exit), pipReason(out))
}

// unreached is " (no answer from host:port, …)" or "".
func unreached(dests []string) string {
	if len(dests) == 0 {
		return ""
	}
	return " (no answer from " + strings.Join(dests, ", ") + ")"
}

// indexName is the server's index (and extra indexes) as a caller may
// read it: without the userinfo.
func (p *pipSetup) indexName() string {
	name := "https://pypi.org/simple (pip's default)"
	if p.opts.IndexURL != "" {
		name = withoutUserinfo(p.opts.IndexURL)
	}
	for _, e := range p.opts.ExtraIndexURLs {
		name += ", " + withoutUserinfo(e)
	}
	return name
}

// refusedOf says which destinations the fetch's egress refused, or is
// "": those of pip's proxy (the host:port the package's URL named and its
// class of address, nothing a name resolved to), then those of anything
// else in the fetch box (git, a build backend: a connection or a DNS
// name), at most 5 in all.
func refusedOf(rs []egress.Refusal, denied []string) string {
	ds := make([]string, 0, len(rs)+len(denied))
	for _, r := range rs {
		ds = append(ds, r.String())
	}
	ds = append(ds, denied...)
	if len(ds) == 0 {
		return ""
	}
	if len(ds) > 5 {
		ds = append(ds[:5], fmt.Sprintf("%d more", len(ds)-5))
	}
	return "the server's fetch refused to connect to " + strings.Join(ds, ", ") +
		": a package on the index named it, and the fetch reaches the configured indexes (quro serve --pip-index-url, --pip-extra-index-url) alone"
}

func timedOut(e sandbox.Exit) string {
	if e.TimedOut || e.Canceled {
		return ", timed out or canceled"
	}
	return ""
}

// pipReason is the gist of pip's output for an error: its ERROR lines,
// else its last lines.
func pipReason(out string) string {
	var errs []string
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, "ERROR:") {
			errs = append(errs, strings.TrimSpace(l))
		}
	}
	if len(errs) == 0 {
		return lastLinesOf(out, 5)
	}
	return strings.Join(errs, "; ")
}

func lastLinesOf(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// pipError is an error of the fetch for the caller.
func (a *App) pipError(err error, reqs []string) error {
	if errors.Is(err, pip.ErrBadRequirement) {
		return capability.Errorf(capability.InvalidArgument, "%v", err)
	}
	var se *sandbox.StartError
	if errors.As(err, &se) {
		return fmt.Errorf("fetching %s with pip: %w", strings.Join(reqs, " "), err)
	}
	return err
}

// pipInSession runs pip install --no-index from the tenant's wheels in the
// session's own box (its network, its uid), into its user site.
func (a *App) pipInSession(ctx context.Context, s *session.Session, wheels string, reqs []string, out io.Writer) (int, error) {
	return a.pipRun(ctx, s, append([]string{"install", "--no-index", "--find-links", a.pip.inBox(wheels), "--"}, reqs...), out)
}

func (a *App) pipRun(ctx context.Context, s *session.Session, args []string, out io.Writer) (int, error) {
	p := a.pip
	prog := p.inBox(filepath.Join(p.hostBin, "pip"))
	env := map[string]string{}
	for k, v := range s.Env {
		env[k] = v
	}
	env["QURO_PIP_OFFLINE"] = "0" // this is install_packages: no hint to call it
	// As run_code's processes (runcode.ProcessSpec): the session's box
	// holds them.
	spec := s.Spec(append([]string{prog}, args...)...)
	spec.Env, spec.ReadOnly = env, p.boxDirs()
	spec.Stdout, spec.Stderr = out, out
	if s.Rootfs != "" {
		dir, err := RootfsDir(a.DataDir)(s.Rootfs)
		if err != nil {
			return 0, err
		}
		spec.Rootfs = dir
		spec.Args[0] = p.inBox(filepath.Join(p.rootBin, "pip"))
	}
	exit, err := a.Sandbox.Run(ctx, spec)
	if err != nil {
		return 0, err
	}
	if exit.TimedOut || exit.Canceled {
		return 0, capability.Errorf(capability.DeadlineExceeded, "pip in session %s was stopped (timed out or canceled); what it installed so far stays", s.Name)
	}
	return exit.Code, nil
}

// dataDirWriter writes to w what is written to it, line by line, with the
// data directory dir named $QURO_DATA. Flush writes a last partial line.
type dataDirWriter struct {
	w    io.Writer
	dir  string
	line []byte
}

func (d *dataDirWriter) Write(b []byte) (int, error) {
	d.line = append(d.line, b...)
	if i := bytes.LastIndexByte(d.line, '\n'); i >= 0 {
		d.emit(d.line[:i+1])
		d.line = append(d.line[:0], d.line[i+1:]...)
	}
	if len(d.line) > 64<<10 {
		// No newline in 64 KiB: written as it is (a path split there
		// keeps its host form, which the bounded output cuts anyway).
		d.Flush()
	}
	return len(b), nil
}

// Flush writes the partial line held back, if any.
func (d *dataDirWriter) Flush() {
	if len(d.line) > 0 {
		d.emit(d.line)
		d.line = d.line[:0]
	}
}

func (d *dataDirWriter) emit(b []byte) {
	if d.dir != "" && d.dir != "/" {
		b = bytes.ReplaceAll(b, []byte(d.dir), []byte("$QURO_DATA"))
	}
	// The capture bounds what it keeps and never fails a write.
	_, _ = d.w.Write(b)
}

// indexOffTheInternet reports whether the index URL names localhost or an
// address the egress refuses to a box (loopback, private, link-local …):
// the server's own fetch reaches it (its policy trusts the index's
// host:port), a session's pip through the egress would not.
func indexOffTheInternet(index string) bool {
	u, err := url.Parse(index)
	if err != nil || u.Hostname() == "" {
		return false
	}
	h := u.Hostname()
	if h == "localhost" || strings.HasSuffix(h, ".localhost") {
		return true
	}
	a, err := netip.ParseAddr(h)
	return err == nil && egress.Class(a) != ""
}
