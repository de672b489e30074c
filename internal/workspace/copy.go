package workspace

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path"

	"golang.org/x/sys/unix"
)

// CopyOptions tunes a CopyTree.
type CopyOptions struct {
	// Budget caps the bytes of regular files copied (0: none): past it
	// the copy fails with ErrBudget.
	Budget int64
	// UID, when >= 0, owns everything made (the target session's uid);
	// -1 leaves the server as the owner.
	UID int
	// Strict: the source is the server's own (a snapshot), so an entry
	// that vanishes or changes type fails the copy instead of being
	// skipped.
	Strict bool
	// BeforeOpen, when set (by tests), runs between an entry's stat and
	// its open: the moment a swap by the session's code would matter.
	BeforeOpen func(rel string)
}

// Bounds of a tree a copy accepts: deeper or larger trees fail the copy
// with a message (the session's own code made them; nothing else is hurt).
const (
	copyMaxDepth   = 256
	copyMaxEntries = 1 << 20
	copyMaxSkipped = 20 // skipped entries named in a result; the rest are counted
)

// Errors of CopyTree, wrapped with the path where the copy stopped.
var (
	// ErrBudget: the regular files are larger than CopyOptions.Budget.
	ErrBudget = errors.New("the files are larger than allowed")
	// ErrTooDeep: the tree is deeper than 256 levels.
	ErrTooDeep = errors.New("the tree is too deep")
	// ErrTooMany: the tree has more than 2^20 entries.
	ErrTooMany = errors.New("the tree has too many entries")
)

// CopyStats is what a copy did.
type CopyStats struct {
	Files, Dirs, Symlinks, Hardlinks int
	Bytes                            int64
	Reflinked                        int
	Skipped                          []string // "path (fifo)", at most copyMaxSkipped
	SkippedCount                     int
	entries                          int
}

func (s *CopyStats) skip(rel, why string) {
	s.SkippedCount++
	if len(s.Skipped) < copyMaxSkipped {
		s.Skipped = append(s.Skipped, rel+" ("+why+")")
	}
}

type inode struct{ dev, ino uint64 }

type copier struct {
	ctx   context.Context
	o     CopyOptions
	st    CopyStats
	dstFd int              // the destination's top directory
	links map[inode]string // first copy of each multiply-linked file, relative to dstFd
	// noClone is set once the filesystems say they cannot clone between
	// the source and the destination (one copy stays on one pair): every
	// later file goes straight to copy_file_range.
	noClone bool
}

// CopyTree copies the tree at src into the existing empty directory dst,
// and gives dst src's mode and mtime (and the owner o.UID).
//
// The tree is a workspace written by session code (hostile), copied for
// snapshots and forks. CopyTree walks from directory file descriptors with
// openat(O_NOFOLLOW) and fstatat(AT_SYMLINK_NOFOLLOW): no symbolic link is
// ever followed, not even one that stays inside the tree (os.Root would
// follow those, and a directory swapped for a link to "." would loop), so
// a link swapped in at any moment is copied as a link or makes its entry
// skipped, and nothing outside the tree is read. Symbolic links are copied
// as links; FIFOs, sockets and devices are skipped and reported; hard
// links between files of the tree stay hard links (a file linked 1000
// times is stored once); modes are kept without the set-uid, set-gid and
// sticky bits of files; mtimes are kept. Regular files are cloned
// (FICLONE) where the filesystem can, else copied with copy_file_range
// (os.File.ReadFrom).
//
// The destination is the server's own (a snapshot's directory, or the
// workspace of a session just made, in which no code ran yet), and is
// written through descriptors too, with O_EXCL.
func CopyTree(ctx context.Context, src, dst string, o CopyOptions) (*CopyStats, error) {
	srcFd, err := unix.Open(src, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", src, err)
	}
	defer unix.Close(srcFd)
	dstFd, err := unix.Open(dst, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", dst, err)
	}
	defer unix.Close(dstFd)
	c := &copier{ctx: ctx, o: o, dstFd: dstFd, links: map[inode]string{}}
	if err := c.dir(srcFd, dstFd, "", 0); err != nil {
		return &c.st, err
	}
	var st unix.Stat_t
	if err := unix.Fstat(srcFd, &st); err != nil {
		return &c.st, err
	}
	if err := c.finishDir(dstFd, &st); err != nil {
		return &c.st, err
	}
	return &c.st, nil
}

// finishDir gives a copied directory (open as fd) its owner, mode and
// times, once everything in it is made.
func (c *copier) finishDir(fd int, st *unix.Stat_t) error {
	if c.o.UID >= 0 {
		if err := unix.Fchown(fd, c.o.UID, c.o.UID); err != nil {
			return err
		}
	}
	if err := unix.Fchmod(fd, st.Mode&0o1777); err != nil {
		return err
	}
	return unix.UtimesNanoAt(fd, ".", []unix.Timespec{st.Atim, st.Mtim}, 0)
}

func (c *copier) dir(srcFd, dstFd int, rel string, depth int) error {
	if depth >= copyMaxDepth {
		return fmt.Errorf("%s: %w (more than %d levels)", rel, ErrTooDeep, copyMaxDepth)
	}
	// Close-on-exec, as every descriptor the server opens: a program
	// another goroutine starts meanwhile (a session's box) would hold the
	// directory, and with it the session's disk (busy: not unmountable),
	// for as long as it runs.
	dup, err := unix.FcntlInt(uintptr(srcFd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return err
	}
	f := os.NewFile(uintptr(dup), rel)
	defer f.Close()
	for {
		names, err := f.Readdirnames(1024)
		for _, name := range names {
			if err := c.entry(srcFd, dstFd, name, path.Join(rel, name), depth); err != nil {
				return err
			}
		}
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return fmt.Errorf("%s: %w", rel, err)
		}
	}
}

func (c *copier) entry(srcFd, dstFd int, name, rel string, depth int) error {
	if err := c.ctx.Err(); err != nil {
		return err
	}
	if c.st.entries++; c.st.entries > copyMaxEntries {
		return fmt.Errorf("%w (more than %d)", ErrTooMany, copyMaxEntries)
	}
	var st unix.Stat_t
	if err := unix.Fstatat(srcFd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		if errors.Is(err, unix.ENOENT) && !c.o.Strict {
			return nil // removed while copied
		}
		return fmt.Errorf("%s: %w", rel, err)
	}
	if c.o.BeforeOpen != nil {
		c.o.BeforeOpen(rel)
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFDIR:
		return c.subdir(srcFd, dstFd, name, rel, depth)
	case unix.S_IFREG:
		return c.file(srcFd, dstFd, name, rel)
	case unix.S_IFLNK:
		return c.symlink(srcFd, dstFd, name, rel, &st)
	case unix.S_IFIFO:
		c.st.skip(rel, "fifo")
	case unix.S_IFSOCK:
		c.st.skip(rel, "socket")
	case unix.S_IFCHR, unix.S_IFBLK:
		c.st.skip(rel, "device")
	default:
		c.st.skip(rel, "unknown type")
	}
	return nil
}

// changed reports an entry that changed type between its stat and its
// open (the session's code swapped it): it is skipped.
func (c *copier) changed(rel string, err error) error {
	if c.o.Strict {
		return fmt.Errorf("%s: %w", rel, err)
	}
	if errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR) || errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENXIO) {
		c.st.skip(rel, "changed while copied")
		return nil
	}
	return fmt.Errorf("%s: %w", rel, err)
}

func (c *copier) subdir(srcFd, dstFd int, name, rel string, depth int) error {
	sub, err := unix.Openat(srcFd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return c.changed(rel, err)
	}
	defer unix.Close(sub)
	var st unix.Stat_t
	if err := unix.Fstat(sub, &st); err != nil {
		return fmt.Errorf("%s: %w", rel, err)
	}
	if err := unix.Mkdirat(dstFd, name, 0o700); err != nil {
		return fmt.Errorf("%s: %w", rel, err)
	}
	out, err := unix.Openat(dstFd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("%s: %w", rel, err)
	}
	defer unix.Close(out)
	if err := c.dir(sub, out, rel, depth+1); err != nil {
		return err
	}
	c.st.Dirs++
	if err := c.finishDir(out, &st); err != nil {
		return fmt.Errorf("%s: %w", rel, err)
	}
	return nil
}

func (c *copier) file(srcFd, dstFd int, name, rel string) error {
	// O_NONBLOCK: a FIFO swapped in after the stat does not hang the
	// copy; the fstat below then skips it.
	in, err := unix.Openat(srcFd, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		return c.changed(rel, err)
	}
	src := os.NewFile(uintptr(in), rel)
	defer src.Close()
	var st unix.Stat_t
	if err := unix.Fstat(in, &st); err != nil {
		return fmt.Errorf("%s: %w", rel, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return c.changed(rel, unix.ENXIO)
	}
	key := inode{uint64(st.Dev), st.Ino} //nolint:unconvert // Stat_t.Dev is not uint64 on every architecture
	if st.Nlink > 1 {
		if first, ok := c.links[key]; ok {
			if err := unix.Linkat(c.dstFd, first, c.dstFd, rel, 0); err != nil {
				return fmt.Errorf("%s: link to %s: %w", rel, first, err)
			}
			c.st.Hardlinks++
			return nil
		}
	}
	size := st.Size
	if c.o.Budget > 0 && c.st.Bytes+size > c.o.Budget {
		return fmt.Errorf("%s: %w", rel, ErrBudget)
	}
	out, err := unix.Openat(dstFd, name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return fmt.Errorf("%s: %w", rel, err)
	}
	dst := os.NewFile(uintptr(out), rel)
	defer dst.Close()
	cloned := false
	if !c.noClone {
		switch err := unix.IoctlFileClone(out, in); {
		case err == nil:
			cloned = true
			var ost unix.Stat_t
			if err := unix.Fstat(out, &ost); err == nil {
				size = ost.Size // it may have grown since the stat
			}
		case errors.Is(err, unix.EOPNOTSUPP), errors.Is(err, unix.EXDEV), errors.Is(err, unix.ENOTTY),
			errors.Is(err, unix.ENOSYS):
			c.noClone = true
		}
		// Other errors (EINVAL on a file being written, say) fall back to
		// a copy of this file only.
	}
	if cloned {
		c.st.Reflinked++
		if c.o.Budget > 0 && c.st.Bytes+size > c.o.Budget {
			return fmt.Errorf("%s: %w", rel, ErrBudget)
		}
	} else {
		// The session may be writing the file: copy what it held at the
		// stat, never more.
		n, err := dst.ReadFrom(io.LimitReader(src, size))
		if err != nil {
			return fmt.Errorf("%s: %w", rel, err)
		}
		size = n
	}
	c.st.Bytes += size
	if c.o.UID >= 0 {
		if err := unix.Fchown(out, c.o.UID, c.o.UID); err != nil {
			return fmt.Errorf("%s: %w", rel, err)
		}
	}
	if err := unix.Fchmod(out, st.Mode&0o777); err != nil {
		return fmt.Errorf("%s: %w", rel, err)
	}
	if err := unix.UtimesNanoAt(dstFd, name, []unix.Timespec{st.Atim, st.Mtim}, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("%s: %w", rel, err)
	}
	if st.Nlink > 1 {
		c.links[key] = rel
	}
	c.st.Files++
	return nil
}

func (c *copier) symlink(srcFd, dstFd int, name, rel string, st *unix.Stat_t) error {
	buf := make([]byte, unix.PathMax)
	n, err := unix.Readlinkat(srcFd, name, buf)
	if err != nil {
		return c.changed(rel, err)
	}
	if n >= len(buf) {
		c.st.skip(rel, "link target too long")
		return nil
	}
	if err := unix.Symlinkat(string(buf[:n]), dstFd, name); err != nil {
		return fmt.Errorf("%s: %w", rel, err)
	}
	if c.o.UID >= 0 {
		if err := unix.Fchownat(dstFd, name, c.o.UID, c.o.UID, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return fmt.Errorf("%s: %w", rel, err)
		}
	}
	if err := unix.UtimesNanoAt(dstFd, name, []unix.Timespec{st.Atim, st.Mtim}, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("%s: %w", rel, err)
	}
	c.st.Symlinks++
	return nil
}
