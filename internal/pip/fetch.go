package pip

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/quro-dev/quro/internal/egress"
	"github.com/quro-dev/quro/internal/sandbox"
)

// Fetch says how to fetch wheels for one tenant.
type Fetch struct {
	SB *sandbox.Sandbox
	// Python is the program of the session's Python, as the box sees it
	// (the wheels' tags are its own): the embedded interpreter for the
	// host userland, /usr/bin/python3 with Rootfs set.
	Python string
	// PipDir holds the pip package (python.PipDir), named as the box
	// shows it; HostPipDir is its host path, bound into the box (where
	// the Sandbox's places show it), when that differs.
	PipDir     string
	HostPipDir string
	// Rootfs is the rootfs directory the box shows, or "" for the host's
	// userland.
	Rootfs string
	// ReadOnly are further host paths the box needs (the interpreter tree).
	ReadOnly []string
	// Index and Extra are the server's configured indexes ("" is pip's
	// default). Never a session's: a tenant does not choose where the
	// server connects.
	Index string
	Extra []string
	Reqs  []string
	// Retries is how many times pip retries a connection that failed or
	// an index's server error (pip's --retries, each after a back-off
	// that doubles from half a second): 0 is pip's default (5, some 7.5 s
	// of back-off before a fetch from an index that is down fails);
	// negative, none.
	Retries int
	Out     io.Writer // pip's output as it comes
	// TenantDir is a directory of the tenant's (the session's workspace):
	// the fetch box runs in the tenant's cgroup, under its ceilings, as a
	// run there would (sandbox.Spec.TenantDir).
	TenantDir string
	// Egress serves the way out of the fetch box's own network namespace
	// (sandbox.Spec.Egress): the server's egress under Policy(Index,
	// Extra). Required.
	Egress func(*egress.Policy) FetchEgress
	// Resolve resolves the names pip's proxy connects to, as the server's
	// egress does (NetworkOptions.Resolve); nil is the system's.
	Resolve func(ctx context.Context, host string) ([]netip.Addr, error)
}

// FetchEgress is the server's egress for one fetch box: it serves the
// box's namespace (sandbox.Egress) and tells what it refused.
type FetchEgress interface {
	sandbox.Egress
	// Denied are the destinations refused to the box, "dest (reason)".
	Denied() []string
}

// ProxyPort is the port of the fetch's egress proxy on the fetch box's
// loopback: the namespace is the fetch's alone, so the port is fixed.
const ProxyPort = 3128

// FetchResult is what a fetch added to the cache.
type FetchResult struct {
	Added   []Added
	Skipped []string // files pip left that are not wheels, or refused (with why)
	// Refused are the destinations the fetch's egress proxy refused to
	// connect pip to (a URL a package named elsewhere than on the
	// configured indexes), each with its class of address.
	Refused []egress.Refusal
	// Denied are the connections and DNS names the fetch box's egress
	// refused to anything in the box that did not go through the proxy
	// (git, a build backend), "dest (reason)".
	Denied []string
	// Unreached are the destinations (host:port) pip could not reach
	// through the proxy, or that answered with a server error.
	Unreached []string
	Exit      sandbox.Exit
	ExitCode  int
}

// DownloadArgs is the command line of the fetch after the interpreter:
// pip download of wheels only (a direct-URL dependency on a source
// archive still has its build backend run for its metadata), into dest,
// with the tenant's wheels as a local source, through proxy (pip then
// ignores the environment's proxy variables and no_proxy, and with
// --isolated PIP_* variables and configuration files), retrying as
// Fetch.Retries says.
func DownloadArgs(pipDir, dest, wheels, proxy, index string, retries int, extra, reqs []string) []string {
	args := []string{"-I", "-S", filepath.Join(pipDir, "pip"), "download", "--only-binary=:all:", "--dest", dest,
		"--isolated", "--no-input", "--progress-bar", "off", "--disable-pip-version-check", "--no-cache-dir",
		"--proxy", proxy, "--find-links", wheels}
	if retries != 0 {
		args = append(args, "--retries", strconv.Itoa(max(retries, 0)))
	}
	if index != "" {
		args = append(args, "--index-url", index)
	}
	for _, e := range extra {
		args = append(args, "--extra-index-url", e)
	}
	return append(append(args, "--"), reqs...)
}

// TrustedDestinations are the host:port pairs of the configured indexes
// (pip's default, PyPI, when index is "", with the host of its files,
// files.pythonhosted.org:443): the operator's choice, and the only
// destinations of a fetch, even on loopback or a private network.
// Unparsable URLs add nothing (the server checked them at start).
func TrustedDestinations(index string, extra []string) []string {
	var out []string
	for _, s := range append([]string{cmp.Or(index, pypiSimple)}, extra...) {
		u, err := url.Parse(s)
		if err != nil || u.Hostname() == "" {
			continue
		}
		port := u.Port()
		if port == "" {
			port = map[string]string{"http": "80", "https": "443"}[u.Scheme]
		}
		if hp := net.JoinHostPort(u.Hostname(), port); port != "" && !slices.Contains(out, hp) {
			out = append(out, hp)
		}
	}
	if index == "" {
		out = append(out, pypiFiles)
	}
	return out
}

const (
	pypiSimple = "https://pypi.org/simple"
	pypiFiles  = "files.pythonhosted.org:443" // where PyPI's pages link its files
)

// Policy is the egress policy of a fetch box: the configured indexes'
// host:port pairs alone (TrustedDestinations), on whatever address they
// resolve to. Nothing else: no other name resolves in the box, no other
// connection leaves it.
func Policy(index string, extra []string) *egress.Policy {
	dests := TrustedDestinations(index, extra)
	p, err := egress.ParsePolicy(egress.ModeRules, dests, nil)
	if err != nil || len(dests) == 0 {
		return &egress.Policy{Mode: egress.ModeNone}
	}
	p.Trusted = dests
	return p
}

// Fetch downloads f.Reqs (and their dependencies) as wheels in a helper
// box that sees no session directory: its own scratch directory
// (writable), the tenant's wheels and the interpreter (read-only). What
// it leaves is checked and added to the cache by the server (Add).
//
// The box has a network namespace of its own whose only ways out are
// sockets the server holds in it: pip goes through an egress proxy of
// this fetch on the box's loopback (ProxyPort), which connects to the
// configured indexes' host:port alone (a URL a package names elsewhere,
// a direct-URL dependency, is refused); anything else in the box (git
// for a git+ dependency, a source archive's build backend) meets the
// server's egress under Policy: DNS answers the indexes' names only, a
// TCP connection reaches an index's host:port only, and UDP is dropped.
func (c *Cache) Fetch(ctx context.Context, tenant string, f *Fetch) (*FetchResult, error) {
	if err := CheckRequirements(f.Reqs); err != nil {
		return nil, err
	}
	if f.Egress == nil {
		return nil, errors.New("pip fetch: no egress (the server's way out of the fetch box)")
	}
	wheels, err := c.Ensure(tenant)
	if err != nil {
		return nil, err
	}
	out := f.Out
	if out == nil {
		out = io.Discard
	}
	// One fetch at a time per tenant: a tenant's calls cannot open any
	// number of network boxes at once.
	unlock, err := c.lockFetch(ctx, tenant, out)
	if err != nil {
		return nil, err
	}
	defer unlock()
	scratch, err := c.Scratch(tenant)
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(scratch)
	dest := filepath.Join(scratch, "dl")
	if err := os.Mkdir(dest, 0o700); err != nil {
		return nil, err
	}
	trusted := TrustedDestinations(f.Index, f.Extra)
	eg := &fetchNet{egress: f.Egress(Policy(f.Index, f.Extra)), trusted: trusted, resolve: f.Resolve}
	proxyURL := "http://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(ProxyPort))
	wheelsAt, _ := f.SB.BoxPath(wheels) // where the box shows it (sandbox.Options.Places)
	spec := &sandbox.Spec{
		Args:      append([]string{f.Python}, DownloadArgs(f.PipDir, dest, wheelsAt, proxyURL, f.Index, f.Retries, f.Extra, f.Reqs)...),
		Dir:       scratch,
		Home:      scratch,
		TmpDir:    scratch,
		TenantDir: f.TenantDir,
		Network:   sandbox.NetworkInternet,
		Egress:    eg,
		Rootfs:    f.Rootfs,
		ReadOnly:  append([]string{cmp.Or(f.HostPipDir, f.PipDir), wheels}, f.ReadOnly...),
		Stdout:    out,
		Stderr:    out,
	}
	exit, err := f.SB.Run(ctx, spec)
	if err != nil {
		return nil, err
	}
	res := &FetchResult{Exit: exit, ExitCode: exit.Code, Denied: eg.egress.Denied()}
	if p := eg.proxy(); p != nil {
		res.Refused, res.Unreached = p.Refused(), p.Failed()
	}
	ents, err := os.ReadDir(dest)
	if err != nil {
		return res, err
	}
	for i, e := range ents {
		if i >= MaxFetchedWheels {
			res.Skipped = append(res.Skipped, fmt.Sprintf("%d more files: at most %d wheels in one fetch", len(ents)-i, MaxFetchedWheels))
			break
		}
		if !ValidWheelName(e.Name()) {
			res.Skipped = append(res.Skipped, fmt.Sprintf("%q: not a wheel", e.Name()))
			continue
		}
		a, err := c.Add(tenant, filepath.Join(dest, e.Name()))
		if err != nil {
			res.Skipped = append(res.Skipped, err.Error())
			continue
		}
		res.Added = append(res.Added, *a)
	}
	slices.SortFunc(res.Added, func(a, b Added) int { return strings.Compare(a.Name, b.Name) })
	return res, nil
}

// fetchNet is the fetch box's way out (sandbox.Spec.Egress): the
// server's egress, and the fetch's proxy listening in the box's
// namespace.
type fetchNet struct {
	egress  FetchEgress
	trusted []string
	resolve func(ctx context.Context, host string) ([]netip.Addr, error)

	mu sync.Mutex
	p  *egress.Proxy
}

// Attach serves ns with the server's egress and opens the proxy on the
// box's loopback.
func (n *fetchNet) Attach(session string, ns *sandbox.Netns) (io.Closer, error) {
	c, err := n.egress.Attach(session, ns)
	if err != nil {
		return nil, err
	}
	ln, err := ns.Listen("tcp4", net.JoinHostPort("127.0.0.1", strconv.Itoa(ProxyPort)))
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("pip fetch proxy: %w", err)
	}
	p, err := egress.Start(egress.Options{Trusted: n.trusted, OnlyTrusted: true, Listener: ln, Resolve: n.resolve})
	if err != nil {
		ln.Close()
		c.Close()
		return nil, err
	}
	n.mu.Lock()
	n.p = p
	n.mu.Unlock()
	return closerFunc(func() error { return errors.Join(p.Close(), c.Close()) }), nil
}

func (n *fetchNet) proxy() *egress.Proxy {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.p
}

type closerFunc func() error

func (f closerFunc) Close() error { return f() }

// FetchWaitLine is what a fetch writes on its output when it finds
// another fetch of its tenant running and begins to wait for it (as an
// apt install says it waits for its rootfs's lock): a caller sees why
// its install has not started.
const FetchWaitLine = "# waiting for another pip fetch of this tenant to finish (one at a time per tenant)"

// lockFetch waits (bounded by ctx) until no other fetch of tenant runs in
// this process: each tenant's share of the fetch boxes is one, and there
// is no pool shared between tenants, so one tenant's fetches never make
// another's wait. A wait is said on out first (FetchWaitLine).
func (c *Cache) lockFetch(ctx context.Context, tenant string, out io.Writer) (unlock func(), err error) {
	c.mu.Lock()
	if c.fetching == nil {
		c.fetching = map[string]chan struct{}{}
	}
	ch := c.fetching[tenant]
	if ch == nil {
		ch = make(chan struct{}, 1)
		c.fetching[tenant] = ch
	}
	c.mu.Unlock()
	select {
	case ch <- struct{}{}:
		return func() { <-ch }, nil
	default:
	}
	fmt.Fprintln(out, FetchWaitLine)
	select {
	case ch <- struct{}{}:
		return func() { <-ch }, nil
	case <-ctx.Done():
		return nil, fmt.Errorf("waiting for another pip fetch of the tenant to end (a tenant's share is one fetch at a time): %w", context.Cause(ctx))
	}
}
