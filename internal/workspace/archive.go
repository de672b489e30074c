package workspace

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

const noFollow = unix.O_NOFOLLOW

// A workspace as a tar stream, for a session's move between the nodes of
// a cluster: WriteArchive on the node it leaves, Extract on the node it
// goes to. The stream comes from another machine, so Extract takes it as
// hostile: it makes only directories, regular files, hard links to the
// files it made and symbolic links, within a byte budget, all through an
// os.Root of the new workspace (no path, link or later entry leads out of
// it, and no name is made twice). A file's holes travel as a map (the PAX
// records sparseMapKey and sparseSizeKey; archive/tar writes no sparse
// entries), so a sparse file costs the stream, the budget and the new
// disk only its data; a file with several names travels once, its other
// names as hard links. A symbolic link is carried as a link, whatever its
// target (a Python venv's bin/python points to /usr/bin/python3): neither
// side ever follows one (WriteArchive reads a link's text, never through
// it; Extract makes it and never writes through it, nor makes an entry of
// the same name), and its target is resolved only inside the session's box.

// ErrUnsafeArchive wraps every entry Extract refuses.
var ErrUnsafeArchive = errors.New("the archive holds an entry a workspace does not take")

// WriteArchive writes the tree under dir as a tar stream to w: its
// directories, regular files and symbolic links (as links); other kinds
// (fifos, sockets, devices) are skipped and counted. The tree must not
// change meanwhile (the session is quiesced): a file that changes size
// fails the write.
func WriteArchive(ctx context.Context, w io.Writer, dir string) (*CopyStats, error) {
	root, err := os.OpenRoot(dir)
	if err != nil {
		return nil, err
	}
	defer root.Close()
	tw := tar.NewWriter(w)
	st := &CopyStats{}
	first := map[inode]string{} // the name a file with several names went under
	err = fs.WalkDir(root.FS(), ".", func(name string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if name == "." {
			return nil
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		hdr := &tar.Header{Name: name, Mode: int64(fi.Mode().Perm()), ModTime: fi.ModTime(), Format: tar.FormatPAX}
		switch {
		case d.IsDir():
			hdr.Typeflag, hdr.Name = tar.TypeDir, name+"/"
			st.Dirs++
			return tw.WriteHeader(hdr)
		case d.Type()&fs.ModeSymlink != 0:
			target, err := root.Readlink(name)
			if err != nil {
				return err
			}
			hdr.Typeflag, hdr.Linkname = tar.TypeSymlink, target
			st.Symlinks++
			return tw.WriteHeader(hdr)
		case d.Type().IsRegular():
			if sys, ok := fi.Sys().(*syscall.Stat_t); ok && sys.Nlink > 1 {
				ino := inode{uint64(sys.Dev), sys.Ino} //nolint:unconvert // Dev's type differs between architectures
				if to, ok := first[ino]; ok {
					hdr.Typeflag, hdr.Linkname = tar.TypeLink, to
					st.Hardlinks++
					return tw.WriteHeader(hdr)
				}
				first[ino] = name
			}
			// O_NONBLOCK: a fifo put in the file's place does not block
			// the move (the fstat below refuses it).
			f, err := root.OpenFile(name, os.O_RDONLY|noFollow|unix.O_NONBLOCK, 0)
			if err != nil {
				return err
			}
			defer f.Close()
			if now, err := f.Stat(); err != nil || !os.SameFile(fi, now) || !now.Mode().IsRegular() {
				return fmt.Errorf("%s changed during the move", name)
			}
			n, err := writeFile(tw, hdr, f, fi.Size())
			if err != nil {
				return fmt.Errorf("%s: %w", name, err)
			}
			st.Files++
			st.Bytes += n
			return nil
		}
		st.skip(name, d.Type().String())
		return nil
	})
	if err != nil {
		return st, err
	}
	return st, tw.Close()
}

// ArchiveSize is the bytes of file data WriteArchive would send of the
// tree under dir, as Extract charges them against its budget: a file with
// several names counted once, a sparse file by its data, not its length.
// The tree may change meanwhile (the session still runs): what is removed
// mid-walk is skipped. It walks through an os.Root, so no directory
// swapped for a link leads it out of dir.
func ArchiveSize(ctx context.Context, dir string) (int64, error) {
	root, err := os.OpenRoot(dir)
	if err != nil {
		return 0, err
	}
	defer root.Close()
	var n int64
	seen := map[inode]bool{}
	err = fs.WalkDir(root.FS(), ".", func(name string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			n, err = addFileData(root, name, d, seen, n)
		}
		if err != nil && name != "." && errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if err != nil {
			return err
		}
		return ctx.Err()
	})
	return n, err
}

// addFileData adds to n the data of the regular file name, unless one of
// its other names was counted (seen).
func addFileData(root *os.Root, name string, d fs.DirEntry, seen map[inode]bool, n int64) (int64, error) {
	fi, err := d.Info()
	if err != nil {
		return n, err
	}
	sys, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return n + fi.Size(), nil
	}
	if sys.Nlink > 1 {
		ino := inode{uint64(sys.Dev), sys.Ino} //nolint:unconvert // Dev's type differs between architectures
		if seen[ino] {
			return n, nil
		}
		seen[ino] = true
	}
	if sys.Blocks*512 >= fi.Size() {
		return n + fi.Size(), nil // no room for a hole
	}
	f, err := root.OpenFile(name, os.O_RDONLY|noFollow|unix.O_NONBLOCK, 0)
	if err != nil {
		return n, err
	}
	defer f.Close()
	if now, err := f.Stat(); err != nil || !os.SameFile(fi, now) {
		return n + fi.Size(), nil // replaced meanwhile: its length, as a bound
	}
	for _, s := range dataSegments(f, fi.Size()) {
		n += s.n
	}
	return n, nil
}

// ExtractOptions bound an Extract.
type ExtractOptions struct {
	// Budget caps the bytes of regular files (0: none): an entry that
	// would pass it fails the extraction before its bytes are read.
	Budget int64
	// MaxEntries caps the entries (0: copyMaxEntries).
	MaxEntries int
}

// Extract makes the tree of the tar stream r under dir, an empty
// workspace, checking every entry as hostile: a name that is not a
// clean path inside dir ("..", absolute, through a link the archive
// made), a name made already (so nothing is written through a link
// made before it), a link target that is empty, holds a NUL or is
// longer than PATH_MAX, a hard link, device, fifo or any other kind, an
// entry past the budget or the count fails the whole extraction
// (ErrUnsafeArchive, ErrBudget, ErrTooMany); a link is made as a link,
// never followed here, whatever its target;
// what it made is left for the caller to remove. Modes keep their
// permission bits only (no set-uid, set-gid or sticky bit); everything
// is owned by the server (the caller gives it to the session).
func Extract(ctx context.Context, r io.Reader, dir string, o ExtractOptions) (*CopyStats, error) {
	root, err := os.OpenRoot(dir)
	if err != nil {
		return nil, err
	}
	defer root.Close()
	maxN := o.MaxEntries
	if maxN <= 0 {
		maxN = copyMaxEntries
	}
	st := &CopyStats{}
	links := map[string]bool{} // symbolic links made: no later entry goes through one
	files := map[string]bool{} // regular files made: the only targets of a hard link
	made := map[string]bool{}  // every name made: no later entry takes one again
	type dirTime struct {
		name string
		t    time.Time
	}
	var dirs []dirTime
	tr := tar.NewReader(r)
	for {
		if err := ctx.Err(); err != nil {
			return st, err
		}
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return st, fmt.Errorf("%w: %v", ErrUnsafeArchive, err)
		}
		if st.entries++; st.entries > maxN {
			return st, fmt.Errorf("%w: more than %d entries", ErrTooMany, maxN)
		}
		name, err := entryName(hdr.Name)
		if err != nil {
			return st, err
		}
		for p := path.Dir(name); p != "."; p = path.Dir(p) {
			if links[p] {
				return st, fmt.Errorf("%w: %q goes through the symbolic link %q", ErrUnsafeArchive, hdr.Name, p)
			}
		}
		if made[name] {
			return st, fmt.Errorf("%w: %q is in the archive twice", ErrUnsafeArchive, hdr.Name)
		}
		made[name] = true
		if strings.Count(name, "/") >= copyMaxDepth {
			return st, fmt.Errorf("%w: %q", ErrTooDeep, hdr.Name)
		}
		perm := os.FileMode(hdr.Mode) & os.ModePerm
		switch hdr.Typeflag {
		case tar.TypeDir:
			if err := root.MkdirAll(name, 0o700); err != nil {
				return st, fmt.Errorf("%s: %w", name, err)
			}
			dirs = append(dirs, dirTime{name, hdr.ModTime})
			if err := root.Chmod(name, perm|0o700); err != nil {
				return st, err
			}
			st.Dirs++
		case tar.TypeReg, typeSparse:
			if hdr.Size < 0 || o.Budget > 0 && st.Bytes+hdr.Size > o.Budget {
				return st, fmt.Errorf("%w: %q is %d bytes, and with the %d before it passes the %d allowed", ErrBudget, hdr.Name, hdr.Size, st.Bytes, o.Budget)
			}
			segs, size, err := sparseMap(hdr)
			if err != nil {
				return st, err
			}
			if err := mkParent(root, name); err != nil {
				return st, err
			}
			f, err := root.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL|noFollow, perm&^0o022|0o600)
			if err != nil {
				return st, fmt.Errorf("%s: %w", name, err)
			}
			files[name] = true
			n, err := readFile(f, tr, segs, size)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err == nil && n != hdr.Size {
				err = io.ErrUnexpectedEOF
			}
			if err != nil {
				return st, fmt.Errorf("%s: %w", name, err)
			}
			if err := root.Chmod(name, perm); err != nil {
				return st, err
			}
			_ = root.Chtimes(name, hdr.ModTime, hdr.ModTime) // times are kept where they can be
			st.Files++
			st.Bytes += n
		case tar.TypeLink:
			// Only another name of a regular file this archive made: no
			// file of the target's own, nor a link, directory or device.
			if !files[hdr.Linkname] {
				return st, fmt.Errorf("%w: the hard link %q names %q, not a file made before it", ErrUnsafeArchive, hdr.Name, hdr.Linkname)
			}
			if err := mkParent(root, name); err != nil {
				return st, err
			}
			if err := root.Link(hdr.Linkname, name); err != nil {
				return st, fmt.Errorf("%s: %w", name, err)
			}
			files[name] = true
			st.Hardlinks++
		case tar.TypeSymlink:
			if t := hdr.Linkname; t == "" || len(t) >= unix.PathMax || strings.ContainsRune(t, 0) {
				return st, fmt.Errorf("%w: the symbolic link %q has the target %.64q", ErrUnsafeArchive, hdr.Name, t)
			}
			if err := mkParent(root, name); err != nil {
				return st, err
			}
			if err := root.Symlink(hdr.Linkname, name); err != nil {
				return st, fmt.Errorf("%s: %w", name, err)
			}
			links[name] = true
			st.Symlinks++
		default:
			return st, fmt.Errorf("%w: %q is a %s, not a directory, file or symbolic link", ErrUnsafeArchive, hdr.Name, kind(hdr.Typeflag))
		}
	}
	for i := len(dirs) - 1; i >= 0; i-- {
		_ = root.Chtimes(dirs[i].name, dirs[i].t, dirs[i].t) // times are kept where they can be
	}
	return st, nil
}

// entryName is an archive entry's name as a clean path inside the
// workspace, or an error for one that is not.
func entryName(n string) (string, error) {
	c := strings.TrimSuffix(n, "/")
	if c == "" || c != path.Clean(c) || !fs.ValidPath(c) || c == "." || strings.ContainsRune(c, 0) {
		return "", fmt.Errorf("%w: the name %q is not a clean path inside /home/user", ErrUnsafeArchive, n)
	}
	return c, nil
}

// mkParent makes the directories above name.
func mkParent(root *os.Root, name string) error {
	if d := path.Dir(name); d != "." {
		if err := root.MkdirAll(d, 0o755); err != nil {
			return fmt.Errorf("%s: %w", d, err)
		}
	}
	return nil
}

// kind names a tar entry type.
func kind(t byte) string {
	switch t {
	case tar.TypeChar:
		return "character device"
	case tar.TypeBlock:
		return "block device"
	case tar.TypeFifo:
		return "fifo"
	}
	return fmt.Sprintf("entry of type %q", t)
}
