// Package pip is the server's side of pip for sessions: the requirement
// strings install_packages accepts, each tenant's content-addressed wheel
// cache and the fetch that fills it.
//
// A tenant's cache is <root>/<tenant>/: by-hash/<sha256> holds each wheel
// once, and wheels/<file name> is a hard link to it, the name pip reads
// (PIP_FIND_LINKS). Only the server writes it: Fetch runs pip download in a
// helper box of its own (a network namespace whose only ways out are the
// server's egress and a proxy, to the configured indexes alone; no
// session directory, the cache read-only, wheels only) into a scratch directory, and Cache.Add checks
// each file there (a regular file with a wheel's name of a valid form,
// bounded in size), hashes it itself and links it in. The tenant's
// sessions see wheels/ read-only.
package pip

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/quro-dev/quro/internal/flock"
)

// Limits of what install_packages {manager: pip} accepts and of what the
// cache takes.
const (
	MaxRequirements  = 64
	MaxRequirement   = 200
	MaxWheelBytes    = 1 << 30 // one wheel
	MaxFetchedWheels = 256     // one fetch
)

// ErrBadRequirement is a requirement string install_packages refuses.
var ErrBadRequirement = errors.New("bad pip requirement")

// ErrCacheConflict is a wheel whose name the cache already holds with
// other content.
var ErrCacheConflict = errors.New("a different wheel of the same name is already in the cache")

var (
	reqName   = `[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?`
	reqExtras = `\[\s*` + reqName + `(?:\s*,\s*` + reqName + `)*\s*\]`
	reqSpec   = `(?:===|==|!=|~=|<=|>=|<|>)\s*[A-Za-z0-9][A-Za-z0-9.*+!_-]*`
	// requirement is PEP 508's name[extras] and version specifiers: no
	// URL, no "@", no path, no environment marker, nothing pip reads as
	// an option.
	requirement = regexp.MustCompile(`^(` + reqName + `)\s*(?:` + reqExtras + `)?\s*(?:` + reqSpec + `(?:\s*,\s*` + reqSpec + `)*)?$`)
	// archiveName: pip takes a name ending so as a file in its working
	// directory when one exists: pip 25.1.1's ARCHIVE_EXTENSIONS
	// (pip/_internal/utils/filetypes.py; TestArchiveExtensionsArePips
	// reads them from the wheel), and .egg.
	archiveName = regexp.MustCompile(`(?i)\.(whl|zip|tar\.bz2|tbz|tar\.gz|tgz|tar|tar\.xz|txz|tlz|tar\.lz|tar\.lzma|egg)$`)
)

// CheckRequirements checks install_packages' pip requirements: 1 to
// MaxRequirements, each at most MaxRequirement bytes of PEP 508's
// name[extras]specifiers.
func CheckRequirements(reqs []string) error {
	if len(reqs) == 0 {
		return fmt.Errorf("%w: name at least one package", ErrBadRequirement)
	}
	if len(reqs) > MaxRequirements {
		return fmt.Errorf("%w: %d packages, at most %d in one call", ErrBadRequirement, len(reqs), MaxRequirements)
	}
	for _, r := range reqs {
		if err := CheckRequirement(r); err != nil {
			return err
		}
	}
	return nil
}

// CheckRequirement checks one requirement string.
func CheckRequirement(r string) error {
	show := r
	if len(show) > 60 {
		show = show[:60] + "…"
	}
	switch {
	case len(r) > MaxRequirement:
		return fmt.Errorf("%w: %q is %d bytes long, at most %d", ErrBadRequirement, show, len(r), MaxRequirement)
	case strings.HasPrefix(strings.TrimSpace(r), "-"):
		return fmt.Errorf("%w: %q is an option: give package names only (the index is the server's: quro serve --pip-index-url)", ErrBadRequirement, show)
	case strings.ContainsAny(r, "@/\\:;"):
		return fmt.Errorf("%w: %q: URLs, paths and environment markers are refused; give NAME[extras] with optional version specifiers, e.g. requests==2.32.3", ErrBadRequirement, show)
	}
	m := requirement.FindStringSubmatch(r)
	if m == nil {
		return fmt.Errorf("%w: %q is not NAME[extras] with optional version specifiers (e.g. numpy, requests[socks]>=2.31,<3)", ErrBadRequirement, show)
	}
	if archiveName.MatchString(m[1]) {
		return fmt.Errorf("%w: %q names a file: give a package name", ErrBadRequirement, show)
	}
	return nil
}

// wheelName is a wheel file name (PEP 427): name-version[-build]-python-abi-platform.whl.
var wheelName = regexp.MustCompile(`^[A-Za-z0-9_.]+-[A-Za-z0-9_.!+]+(?:-[0-9][A-Za-z0-9_.]*)?-[A-Za-z0-9_.]+-[A-Za-z0-9_.]+-[A-Za-z0-9_.]+\.whl$`)

// ValidWheelName reports whether name is a wheel's file name.
func ValidWheelName(name string) bool {
	return len(name) <= 255 && wheelName.MatchString(name)
}

// Cache is the wheel caches of a data directory's tenants.
type Cache struct {
	Root string // <data>/pip

	mu       sync.Mutex
	fetching map[string]chan struct{} // tenant → a one-slot semaphore (lockFetch)
}

// tenantDir is the directory of tenant's cache: "local" for the local
// tenant, t-NAME for a name of plain characters, else h-HASH.
func (c *Cache) tenantDir(tenant string) string {
	switch {
	case tenant == "":
		return filepath.Join(c.Root, "local")
	case plainName().MatchString(tenant):
		return filepath.Join(c.Root, "t-"+tenant)
	}
	sum := sha256.Sum256([]byte(tenant))
	return filepath.Join(c.Root, "h-"+hex.EncodeToString(sum[:12]))
}

var plainName = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$`) })

// Wheels is the directory of tenant's wheels by file name (PIP_FIND_LINKS
// of its sessions, bound read-only into their boxes).
func (c *Cache) Wheels(tenant string) string { return filepath.Join(c.tenantDir(tenant), "wheels") }

// Ensure makes tenant's cache directories (readable by every session uid:
// the boxes show wheels/ read-only) and returns the wheels directory.
func (c *Cache) Ensure(tenant string) (string, error) {
	d := c.tenantDir(tenant)
	for _, p := range []string{c.Root, d, filepath.Join(d, "by-hash"), filepath.Join(d, "wheels")} {
		if err := os.Mkdir(p, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
			return "", err
		}
		if err := os.Chmod(p, 0o755); err != nil {
			return "", err
		}
	}
	return filepath.Join(d, "wheels"), nil
}

// Scratch makes a new empty directory beside tenant's cache for a fetch
// to write into; the caller removes it.
func (c *Cache) Scratch(tenant string) (string, error) {
	if _, err := c.Ensure(tenant); err != nil {
		return "", err
	}
	return os.MkdirTemp(c.tenantDir(tenant), ".fetch-")
}

// Added is a wheel Add put (or found) in the cache.
type Added struct {
	Name   string
	SHA256 string
	Size   int64
	New    bool // false: the cache had it already
}

// Add checks the file src (written by a box: hostile) and adds it to
// tenant's cache under its base name: it must be a regular file (not a
// link) with a wheel's name, at most MaxWheelBytes. Its content is stored
// once by its sha256, and the name links to it; a name the cache holds
// with other content is refused (ErrCacheConflict).
func (c *Cache) Add(tenant, src string) (*Added, error) {
	name := filepath.Base(src)
	if !ValidWheelName(name) {
		return nil, fmt.Errorf("%q is not a wheel file name", name)
	}
	wheels, err := c.Ensure(tenant)
	if err != nil {
		return nil, err
	}
	d := c.tenantDir(tenant)
	f, err := os.OpenFile(src, os.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK, 0)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%s is not a regular file", name)
	}
	if fi.Size() > MaxWheelBytes {
		return nil, fmt.Errorf("%s is %d bytes, more than the cache takes (%d)", name, fi.Size(), MaxWheelBytes)
	}
	unlock, err := flock.Lock(filepath.Join(d, ".lock"), nil)
	if err != nil {
		return nil, err
	}
	defer unlock()
	tmp, err := os.CreateTemp(filepath.Join(d, "by-hash"), ".add-")
	if err != nil {
		return nil, err
	}
	defer os.Remove(tmp.Name())
	h := sha256.New()
	n, err := io.Copy(io.MultiWriter(tmp, h), io.LimitReader(f, MaxWheelBytes+1))
	if err == nil && n > MaxWheelBytes {
		err = fmt.Errorf("%s grew beyond %d bytes", name, int64(MaxWheelBytes))
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, err
	}
	sum := hex.EncodeToString(h.Sum(nil))
	blob := filepath.Join(d, "by-hash", sum)
	added := &Added{Name: name, SHA256: sum, Size: n}
	if _, err := os.Lstat(blob); errors.Is(err, os.ErrNotExist) {
		if err := os.Chmod(tmp.Name(), 0o644); err != nil {
			return nil, err
		}
		if err := os.Rename(tmp.Name(), blob); err != nil {
			return nil, err
		}
		added.New = true
	} else if err != nil {
		return nil, err
	}
	link := filepath.Join(wheels, name)
	if err := os.Link(blob, link); err == nil {
		added.New = true
		return added, nil
	} else if !errors.Is(err, os.ErrExist) {
		return nil, err
	}
	a, err1 := os.Lstat(link)
	b, err2 := os.Lstat(blob)
	if err1 != nil || err2 != nil || !os.SameFile(a, b) {
		return nil, fmt.Errorf("%w: %s (sha256 %s)", ErrCacheConflict, name, sum)
	}
	return added, nil
}

// Why a pip run found nothing to install, from its output (Diagnose).
const (
	Unreachable = "unreachable" // no index answered: a connection, name or proxy failure, or an index that failed (5xx)
	NotOnIndex  = "not_found"   // an index answered and has no version of the requirement that fits
)

// unreachableMarks are what pip prints when it cannot get an answer from
// an index: urllib3's connection, proxy and TLS errors, pip's "Could not
// fetch URL" and its retries after error responses.
var unreachableMarks = []string{
	"NewConnectionError", "Failed to establish a new connection", "Name or service not known",
	"Temporary failure in name resolution", "No address associated with hostname", "Connection refused",
	"Network is unreachable", "No route to host", "ConnectTimeoutError", "ReadTimeoutError",
	"ProxyError", "Cannot connect to proxy", "Tunnel connection failed", "SSLError",
	"Could not fetch URL", "Max retries exceeded", "error responses", "connection broken by",
	"HTTPError: 5", "Server Error",
}

// Diagnose says why pip found no version of a requirement: Unreachable
// when its output shows that no index answered, NotOnIndex when it
// reports "No matching distribution" without such a failure, else "".
// pip words both alike ("from versions: none").
func Diagnose(out string) string {
	for _, m := range unreachableMarks {
		if strings.Contains(out, m) {
			return Unreachable
		}
	}
	if strings.Contains(out, "No matching distribution found") || strings.Contains(out, "Could not find a version that satisfies") {
		return NotOnIndex
	}
	return ""
}
