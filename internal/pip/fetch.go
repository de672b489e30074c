package pip

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"

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
	// PipDir holds the pip package (python.PipDir).
	PipDir string
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
	Out   io.Writer // pip's output as it comes
	// TenantDir is a directory of the tenant's (the session's workspace):
	// the fetch box runs in the tenant's cgroup, under its ceilings, as a
	// run there would (sandbox.Spec.TenantDir).
	TenantDir string
}

// FetchResult is what a fetch added to the cache.
type FetchResult struct {
	Added   []Added
	Skipped []string // files pip left that are not wheels, or refused (with why)
	// Refused are the destinations the fetch's egress proxy refused to
	// connect pip to (a URL a package named on a host's own or private
	// address), each with its class of address.
	Refused []egress.Refusal
	// Unreached are the destinations (host:port) pip could not reach
	// through the proxy, or that answered with a server error.
	Unreached []string
	Exit      sandbox.Exit
	ExitCode  int
}

// DownloadArgs is the command line of the fetch after the interpreter:
// pip download of wheels only (no package code runs with network), into
// dest, with the tenant's wheels as a local source, through proxy (pip
// then ignores the environment's proxy variables and no_proxy, and with
// --isolated PIP_* variables and configuration files).
func DownloadArgs(pipDir, dest, wheels, proxy, index string, extra, reqs []string) []string {
	args := []string{"-I", "-S", filepath.Join(pipDir, "pip"), "download", "--only-binary=:all:", "--dest", dest,
		"--isolated", "--no-input", "--progress-bar", "off", "--disable-pip-version-check", "--no-cache-dir",
		"--proxy", proxy, "--find-links", wheels}
	if index != "" {
		args = append(args, "--index-url", index)
	}
	for _, e := range extra {
		args = append(args, "--extra-index-url", e)
	}
	return append(append(args, "--"), reqs...)
}

// TrustedDestinations are the host:port pairs of the configured indexes
// (pip's default, PyPI, when index is ""): the operator's choice, which
// the fetch's egress proxy connects to even on loopback or a private
// network. Unparsable URLs add nothing (the server checked them at start).
func TrustedDestinations(index string, extra []string) []string {
	var out []string
	for _, s := range append([]string{cmp.Or(index, "https://pypi.org/simple")}, extra...) {
		u, err := url.Parse(s)
		if err != nil || u.Hostname() == "" {
			continue
		}
		port := u.Port()
		if port == "" {
			port = map[string]string{"http": "80", "https": "443"}[u.Scheme]
		}
		if port != "" {
			out = append(out, net.JoinHostPort(u.Hostname(), port))
		}
	}
	return out
}

// Fetch downloads f.Reqs (and their dependencies) as wheels in a helper
// box with network full that sees no session directory: its own scratch
// directory (writable), the tenant's wheels and the interpreter
// (read-only). What it leaves is checked and added to the cache by the
// server (Add).
//
// pip goes through an egress proxy of this fetch (its own port and
// secret): the URLs a package on the index names (a direct-URL
// dependency) reach no loopback, link-local, private or other
// non-public address except the configured indexes' own host:port.
func (c *Cache) Fetch(ctx context.Context, tenant string, f *Fetch) (*FetchResult, error) {
	if err := CheckRequirements(f.Reqs); err != nil {
		return nil, err
	}
	wheels, err := c.Ensure(tenant)
	if err != nil {
		return nil, err
	}
	// One fetch at a time per tenant: a tenant's calls cannot open any
	// number of network boxes at once.
	unlock, err := c.lockFetch(ctx, tenant)
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
	out := f.Out
	if out == nil {
		out = io.Discard
	}
	proxy, err := egress.Start(egress.Options{Trusted: TrustedDestinations(f.Index, f.Extra)})
	if err != nil {
		return nil, err
	}
	defer proxy.Close()
	spec := &sandbox.Spec{
		Args:      append([]string{f.Python}, DownloadArgs(f.PipDir, dest, wheels, proxy.URL(), f.Index, f.Extra, f.Reqs)...),
		Dir:       scratch,
		Home:      scratch,
		TmpDir:    scratch,
		TenantDir: f.TenantDir,
		Network:   sandbox.NetworkHost,
		// pip reaches the network through the proxy alone: no other TCP
		// port is reachable from the box (a direct-URL dependency on a git
		// repository or a source archive would have git, or the archive's
		// build backend, connect on its own).
		ConnectPorts: []int{proxy.Port()},
		Rootfs:       f.Rootfs,
		ReadOnly:     append([]string{f.PipDir, wheels}, f.ReadOnly...),
		Stdout:       out,
		Stderr:       out,
	}
	exit, err := f.SB.Run(ctx, spec)
	if err != nil {
		return nil, err
	}
	res := &FetchResult{Exit: exit, ExitCode: exit.Code, Refused: proxy.Refused(), Unreached: proxy.Failed()}
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

// lockFetch waits (bounded by ctx) until no other fetch of tenant runs in
// this process: each tenant's share of the fetch boxes is one, and there
// is no pool shared between tenants, so one tenant's fetches never make
// another's wait.
func (c *Cache) lockFetch(ctx context.Context, tenant string) (unlock func(), err error) {
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
	case <-ctx.Done():
		return nil, fmt.Errorf("waiting for another pip fetch of the tenant to end (a tenant's share is one fetch at a time): %w", context.Cause(ctx))
	}
}
