package rootfs

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
)

// Limits of reading apt's lists and dpkg's status out of a rootfs. The
// rootfs is shared and maintainer scripts run as its root, so its files
// are input like any other: bounded, and never followed out of it.
const (
	listFileMax  = 1 << 30 // bytes read from one file
	listLineMax  = 1 << 20 // longer lines are skipped
	listNamesMax = 1 << 20 // distinct package names kept
	listFilesMax = 4096    // *_Packages files read
)

// Offer is what apt's lists offer of one package name.
type Offer struct {
	Archs    []string // Architecture fields seen ("amd64", "all"…)
	Versions []string // Version fields seen
}

// Available maps the package names apt's lists offer to what they offer.
type Available map[string]*Offer

// AptListsDir is where apt keeps its lists, relative to a rootfs.
const AptListsDir = "var/lib/apt/lists"

// AptLists reads the package names offered by the lists apt fetched into
// root (var/lib/apt/lists/*_Packages). Only regular files directly in that
// directory are read, opened beneath root without following a symlink out
// of it (os.Root, O_NOFOLLOW, O_NONBLOCK against FIFOs), each bounded; a
// stanza's Package must be a Debian package name to count. It returns the
// number of list files read with the names; none is not an error.
func AptLists(root string) (Available, int, error) {
	r, err := os.OpenRoot(root)
	if err != nil {
		return nil, 0, err
	}
	defer r.Close()
	d, err := r.Open(AptListsDir)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return Available{}, 0, nil
		}
		return nil, 0, err
	}
	ents, err := d.ReadDir(-1)
	d.Close()
	if err != nil {
		return nil, 0, err
	}
	av := Available{}
	n := 0
	for _, e := range ents {
		if !e.Type().IsRegular() || !strings.HasSuffix(e.Name(), "_Packages") {
			continue
		}
		if n++; n > listFilesMax {
			return nil, 0, fmt.Errorf("%s holds more than %d package lists", AptListsDir, listFilesMax)
		}
		f, err := openRegular(r, path.Join(AptListsDir, e.Name()))
		if err != nil {
			return nil, 0, err
		}
		err = ParsePackages(io.LimitReader(f, listFileMax), av)
		f.Close()
		if err != nil {
			return nil, 0, fmt.Errorf("%s/%s: %w", AptListsDir, e.Name(), err)
		}
	}
	return av, n, nil
}

// DpkgStatus reads the packages dpkg's status in root lists (any state),
// as AptLists reads the lists: beneath root, a regular file, bounded.
func DpkgStatus(root string) (Available, error) {
	f, err := openDpkgStatus(root)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	av := Available{}
	if err := ParsePackages(io.LimitReader(f, listFileMax), av); err != nil {
		return nil, err
	}
	return av, nil
}

// openRegular opens name beneath r for reading, refusing a symlink as the
// last component and anything but a regular file.
func openRegular(r *os.Root, name string) (*os.File, error) {
	f, err := r.OpenFile(name, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	if st, err := f.Stat(); err != nil || !st.Mode().IsRegular() {
		f.Close()
		return nil, fmt.Errorf("%s is not a regular file", name)
	}
	return f, nil
}

// ParsePackages adds the stanzas of a Packages (or dpkg status) file read
// from r to av: for each Package that is a Debian package name, its
// Architecture and Version. Lines longer than 1 MiB are skipped (a
// Description may be long; no field kept here is), and so is a stanza
// whose name is not a package name.
func ParsePackages(r io.Reader, av Available) error {
	var name, arch, ver string
	flush := func() error {
		if name != "" && packageNameRE().MatchString(name) {
			o := av[name]
			if o == nil {
				if len(av) >= listNamesMax {
					return fmt.Errorf("more than %d package names", listNamesMax)
				}
				o = &Offer{}
				av[name] = o
			}
			if arch != "" && len(arch) <= 32 && !slices.Contains(o.Archs, arch) && len(o.Archs) < 64 {
				o.Archs = append(o.Archs, arch)
			}
			if ver != "" && len(ver) <= 128 && !slices.Contains(o.Versions, ver) && len(o.Versions) < 256 {
				o.Versions = append(o.Versions, ver)
			}
		}
		name, arch, ver = "", "", ""
		return nil
	}
	return eachLine(r, func(line []byte) error {
		line = bytes.TrimRight(line, "\r")
		field := func(prefix string) (string, bool) {
			if !bytes.HasPrefix(line, []byte(prefix)) {
				return "", false
			}
			return string(bytes.TrimSpace(line[len(prefix):])), true
		}
		if len(line) == 0 {
			return flush()
		}
		switch line[0] { // only these fields are kept: most lines are not looked at twice
		case 'P':
			if v, ok := field("Package:"); ok {
				name = v
			}
		case 'A':
			if v, ok := field("Architecture:"); ok {
				arch = v
			}
		case 'V':
			if v, ok := field("Version:"); ok {
				ver = v
			}
		}
		return nil
	}, flush)
}

// eachLine calls fn with each line of r (without its newline; valid only
// during the call), skipping lines longer than listLineMax, then end.
func eachLine(r io.Reader, fn func([]byte) error, end func() error) error {
	br := bufio.NewReaderSize(r, 64<<10)
	var long bool // in a line too long to keep
	var buf []byte
	for {
		chunk, err := br.ReadSlice('\n')
		line := chunk
		if errors.Is(err, bufio.ErrBufferFull) || len(buf) > 0 {
			// A line longer than the reader's buffer: gathered in buf.
			if len(buf)+len(chunk) > listLineMax {
				long, buf = true, buf[:0]
			} else if !long {
				buf = append(buf, chunk...)
			}
			if errors.Is(err, bufio.ErrBufferFull) {
				continue
			}
			line = buf
		}
		if err != nil && err != io.EOF {
			return err
		}
		if !long && len(line) > 0 {
			if e := fn(bytes.TrimSuffix(line, []byte("\n"))); e != nil {
				return e
			}
		}
		long, buf = false, buf[:0]
		if err == io.EOF {
			return end()
		}
	}
}

// Has reports whether av offers name (a bare package name).
func (av Available) Has(name string) bool { return av[name] != nil }

// Closest returns the offered names nearest name by edit distance (at most
// 2, or a prefix/suffix relation), best first, at most n.
func (av Available) Closest(name string, n int) []string {
	type cand struct {
		name string
		d    int
	}
	var cs []cand
	for k := range av {
		if l := len(k) - len(name); l > 2 || l < -2 {
			continue
		}
		if d := editDistance(name, k, 3); d <= 2 {
			cs = append(cs, cand{k, d})
		}
	}
	sort.Slice(cs, func(i, j int) bool {
		if cs[i].d != cs[j].d {
			return cs[i].d < cs[j].d
		}
		return cs[i].name < cs[j].name
	})
	var out []string
	for i := 0; i < len(cs) && i < n; i++ {
		out = append(out, cs[i].name)
	}
	return out
}

// editDistance is Levenshtein's distance of a and b, or max when it is
// more than that.
func editDistance(a, b string, max int) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		low := cur[0]
		for j := 1; j <= len(b); j++ {
			c := prev[j-1]
			if a[i-1] != b[j-1] {
				c++
			}
			c = min(c, prev[j]+1, cur[j-1]+1)
			cur[j] = c
			low = min(low, c)
		}
		if low >= max {
			return max
		}
		prev, cur = cur, prev
	}
	return min(prev[len(b)], max)
}

// packageNameRE is a bare Debian package name (no architecture, no
// version).
var packageNameRE = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[a-z0-9][a-z0-9+.-]{1,127}$`) })

// SplitPackage splits an argument that CheckPackage accepted into its
// name, architecture ("" when none) and version ("" when none).
func SplitPackage(p string) (name, arch, version string) {
	name, version, _ = strings.Cut(p, "=")
	name, arch, _ = strings.Cut(name, ":")
	return name, arch, version
}

// Unsettled lists the packages dpkg's status in root shows as not fully
// installed — half-installed, unpacked, half-configured, awaiting or
// pending triggers, or needing a reinstall — as "name (state)", sorted.
// Such a rootfs breaks every later install until `dpkg --configure -a`
// (quro rootfs repair) settles it. A status file that cannot be read is an
// error: a rootfs whose state is unknown is not called clean.
func Unsettled(root string) ([]string, error) {
	f, err := openDpkgStatus(root)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []string
	var name, status string
	flush := func() error {
		if name != "" {
			// Status: want error-flag state
			if fs := strings.Fields(status); len(fs) == 3 {
				switch {
				case fs[1] == "reinstreq":
					out = append(out, name+" (reinstreq, "+fs[2]+")")
				case fs[2] != "installed" && fs[2] != "not-installed" && fs[2] != "config-files":
					out = append(out, name+" ("+fs[2]+")")
				}
			} else if status != "" {
				out = append(out, name+" (status "+fmt.Sprintf("%q", status)+")")
			}
		}
		name, status = "", ""
		return nil
	}
	err = eachLine(io.LimitReader(f, listFileMax), func(b []byte) error {
		line := string(b)
		switch {
		case line == "":
			return flush()
		case strings.HasPrefix(line, "Package:"):
			name = strings.TrimSpace(line[len("Package:"):])
		case strings.HasPrefix(line, "Status:"):
			status = strings.TrimSpace(line[len("Status:"):])
		}
		return nil
	}, flush)
	if err != nil {
		return nil, err
	}
	sort.Strings(out)
	return out, nil
}

// openDpkgStatus opens dpkg's status file beneath root (never through a
// link out of it), a regular file.
func openDpkgStatus(root string) (*os.File, error) {
	r, err := os.OpenRoot(root)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	return openRegular(r, "var/lib/dpkg/status")
}
