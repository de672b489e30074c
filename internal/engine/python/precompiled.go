//go:build !slim

package python

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// The standard library ships byte-compiled: precompiled/stdlib-GOOS-GOARCH.tar.gz
// (made by `go generate` / `make stdlib-pyc`, committed) holds the .pyc
// files of the embedded interpreter's standard library, compiled by that
// interpreter with compileall --invalidation-mode unchecked-hash, so that
// extraction writes them beside the sources instead of spending seconds
// compiling (~75 % of a first run on a fresh data directory, before).
//
// Unchecked-hash .pyc files are used without looking at the source: no
// mtime or size comparison (extraction sets fresh mtimes, which would
// invalidate timestamp-based ones) and no source hashing at import. That
// is safe here because the tree is only written by the server, under the
// flock, then renamed into place whole; boxes see it read-only (bound
// read-only, owned by root), and intact() checks every .pyc, like every
// other file, before the tree is used. The archive itself is trusted build
// input, like the interpreter it was compiled by. It is tied to that
// interpreter by the content hash of its files.json: an archive from
// another interpreter build is ignored and the tree is compiled at
// extraction, as before (as is a build without the archive).
//
//go:generate go run ./genpyc

// PrecompiledHeader is the first member of the archive (precompiledMeta):
// what it holds and which interpreter compiled it.
type PrecompiledHeader struct {
	ContentHash    string `json:"content_hash"`    // files.json's, of the interpreter that compiled it
	Version        string `json:"version"`         // e.g. 3.14.6
	InvalidationMd string `json:"invalidation"`    // always "unchecked-hash"
	Files          int    `json:"files"`           // .pyc members after this one
	Bytes          int64  `json:"bytes"`           // their total size
	Excluded       string `json:"excluded_regexp"` // noCompile, when it was made
}

const (
	precompiledMeta = "quro-precompiled.json"
	invalidation    = "unchecked-hash"
)

// precompiledName is the archive's name under precompiled/ for a platform.
func precompiledName(goos, goarch string) string {
	return "stdlib-" + goos + "-" + goarch + ".tar.gz"
}

// openPrecompiled returns archive's header and a reader of its members
// after the header, or nil when there is none (the build has none) or it
// belongs to another interpreter (why says which).
func openPrecompiled(m *manifest, archive []byte) (hdr *PrecompiledHeader, tr *tar.Reader, closeFn func(), why error) {
	if len(archive) == 0 {
		return nil, nil, nil, errors.New("this build has no precompiled standard library")
	}
	gz, err := gzip.NewReader(bytes.NewReader(archive))
	if err != nil {
		return nil, nil, nil, fmt.Errorf("precompiled standard library: %w", err)
	}
	tr = tar.NewReader(gz)
	th, err := tr.Next()
	if err != nil || th.Name != precompiledMeta || th.Size > 1<<16 {
		gz.Close()
		return nil, nil, nil, fmt.Errorf("precompiled standard library: no %s first (%v)", precompiledMeta, err)
	}
	b, err := io.ReadAll(tr)
	var h PrecompiledHeader
	if err == nil {
		err = json.Unmarshal(b, &h)
	}
	if err != nil {
		gz.Close()
		return nil, nil, nil, fmt.Errorf("precompiled standard library: %s: %w", precompiledMeta, err)
	}
	if h.ContentHash != m.ContentHash || h.InvalidationMd != invalidation {
		gz.Close()
		return nil, nil, nil, fmt.Errorf("the precompiled standard library is of another interpreter build (%.16s, this one %.16s): run `make stdlib-pyc`", h.ContentHash, m.ContentHash)
	}
	return &h, tr, func() { gz.Close() }, nil
}

// pycEntry is one .pyc file of an extracted tree, checked by intact().
type pycEntry struct {
	Name string `json:"name"` // relative to the tree, slash-separated
	Size int64  `json:"size"`
}

// validPycName reports whether name may be a member of the archive: a
// cache file of the standard library, under lib/pythonX.Y/, in a
// __pycache__ directory, and nothing that leaves the tree.
func validPycName(name, short string) bool {
	return fs.ValidPath(name) && strings.HasPrefix(name, "lib/python"+short+"/") &&
		strings.HasSuffix(name, ".pyc") && filepath.Base(filepath.Dir(name)) == "__pycache__" &&
		!strings.Contains(name, "\\")
}

// extractPrecompiled writes the archive's .pyc files into the tree at dir
// (extracted from m already: their directories' parents exist) and returns
// them. Each member is checked: a name outside the standard library's
// __pycache__ directories, a type other than a regular file, or a size
// beyond the header's total stops the extraction.
func extractPrecompiled(ctx context.Context, dir, short string, hdr *PrecompiledHeader, tr *tar.Reader, wrote func(int64)) ([]pycEntry, error) {
	var out []pycEntry
	var total int64
	for {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		th, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("precompiled standard library: %w", err)
		}
		if th.Typeflag != tar.TypeReg || !validPycName(th.Name, short) || th.Size < 16 {
			return nil, fmt.Errorf("precompiled standard library: unexpected member %q", th.Name)
		}
		if total += th.Size; total > hdr.Bytes {
			return nil, fmt.Errorf("precompiled standard library: more than the %d bytes its header says", hdr.Bytes)
		}
		path := filepath.Join(dir, filepath.FromSlash(th.Name))
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			return nil, err
		}
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
		if err != nil {
			return nil, err
		}
		n, err := io.Copy(f, tr)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return nil, fmt.Errorf("precompiled standard library: %s: %w", th.Name, err)
		}
		wrote(n)
		out = append(out, pycEntry{Name: th.Name, Size: n})
	}
	if len(out) != hdr.Files || total != hdr.Bytes {
		return nil, fmt.Errorf("precompiled standard library: %d files of %d bytes, its header says %d of %d", len(out), total, hdr.Files, hdr.Bytes)
	}
	return out, nil
}

// listPycs returns every .pyc file under dir/lib, sorted by name: what the
// marker records after compiling at extraction.
func listPycs(dir string) ([]pycEntry, error) {
	var out []pycEntry
	err := filepath.WalkDir(filepath.Join(dir, "lib"), func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.Type().IsRegular() || !strings.HasSuffix(path, ".pyc") {
			return nil
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, path)
		if err != nil {
			return err
		}
		out = append(out, pycEntry{Name: filepath.ToSlash(rel), Size: fi.Size()})
		return nil
	})
	slices.SortFunc(out, func(a, b pycEntry) int { return strings.Compare(a.Name, b.Name) })
	return out, err
}

// WritePrecompiled makes the precompiled standard library of the embedded
// interpreter (see above) and writes it to w as a gzip-compressed tar:
// the header, then the .pyc files sorted by name, with fixed modes and
// times, so that the same interpreter gives the same bytes. It extracts
// the interpreter into a temporary directory and runs its compileall
// there. Only `go generate` (./genpyc) calls it.
func WritePrecompiled(ctx context.Context, w io.Writer) (*PrecompiledHeader, error) {
	m, err := readManifest()
	if err != nil {
		return nil, err
	}
	full, short := pythonVersion(m)
	tmp, err := os.MkdirTemp("", "quro-genpyc-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	root := filepath.Join(tmp, "python")
	if err := extractTree(ctx, root, m, func(string, int64, int64) {}); err != nil {
		return nil, err
	}
	// -B: compileall's own imports must not leave timestamp .pyc files
	// behind (which it would then keep); -f compiles every file anyway.
	// The paths recorded in the .pyc files are /lib/pythonX.Y/...: the
	// import system replaces them with the source's real path as it loads
	// each one (importlib's _fix_co_filename), wherever the tree is.
	out, err := runHelper(ctx, nil, filepath.Join(root, "bin", "python"+short), "-I", "-B", "-m", "compileall", "-q", "-f", "-j", "0",
		"--invalidation-mode", invalidation, "-x", noCompile.String(), "-s", root, "-p", "/", filepath.Join(root, "lib", "python"+short))
	if err != nil {
		return nil, fmt.Errorf("compileall: %w: %s", err, lastLines(string(out), 10))
	}
	pycs, err := listPycs(root)
	if err != nil {
		return nil, err
	}
	h := &PrecompiledHeader{ContentHash: m.ContentHash, Version: full, InvalidationMd: invalidation, Files: len(pycs), Excluded: noCompile.String()}
	for _, p := range pycs {
		if !validPycName(p.Name, short) {
			return nil, fmt.Errorf("unexpected .pyc %s", p.Name)
		}
		h.Bytes += p.Size
	}
	gz, err := gzip.NewWriterLevel(w, gzip.BestCompression)
	if err != nil {
		return nil, err
	}
	tw := tar.NewWriter(gz)
	add := func(name string, data []byte) error {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o644, Size: int64(len(data)),
			ModTime: time.Unix(0, 0), Format: tar.FormatPAX}); err != nil {
			return err
		}
		_, err := tw.Write(data)
		return err
	}
	hb, _ := json.MarshalIndent(h, "", "  ")
	if err := add(precompiledMeta, hb); err != nil {
		return nil, err
	}
	for _, p := range pycs {
		b, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(p.Name)))
		if err != nil {
			return nil, err
		}
		if err := add(p.Name, b); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return h, gz.Close()
}
