package workspace

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// File metadata, as E2B's envd keeps it: user-defined key/value pairs
// stored as the file's extended attributes user.e2b.KEY, so that programs
// in the box see (and may set) them too. A replacement (Write) makes a new
// file, so it carries exactly the metadata it was written with: none
// clears it.

// MetadataXattr is the xattr namespace of file metadata.
const MetadataXattr = "user.e2b."

// The bounds of a file's metadata (envd's): a key fits the kernel's
// xattr name limit (255) with the namespace; all keys (with the
// namespace) and values together fit one inode's xattr space.
const (
	MaxMetadataKey   = 255 - len(MetadataXattr)
	MaxMetadataBytes = 4096
)

// CheckMetadata checks metadata to be written: keys non-empty, lowercase
// HTTP token characters (they travel as X-Metadata-KEY header names), at
// most MaxMetadataKey bytes; values printable US-ASCII; at most
// MaxMetadataBytes in all. A failure wraps ErrInvalid.
func CheckMetadata(md map[string]string) error {
	total := 0
	for k, v := range md {
		if k == "" || len(k) > MaxMetadataKey || !isToken(k) || strings.ToLower(k) != k {
			return fmt.Errorf("metadata key %q: keys are 1 to %d lowercase letters, digits and !#$%%&'*+-.^_`|~: %w", k, MaxMetadataKey, ErrInvalid)
		}
		if !printable(v) {
			return fmt.Errorf("metadata value of %q: values are printable US-ASCII (no control characters): %w", k, ErrInvalid)
		}
		total += len(MetadataXattr) + len(k) + len(v)
	}
	if total > MaxMetadataBytes {
		return fmt.Errorf("metadata of %d bytes (keys with %q, and values) is over the %d a file keeps: %w", total, MetadataXattr, MaxMetadataBytes, ErrInvalid)
	}
	return nil
}

func isToken(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0) {
			return false
		}
	}
	return true
}

func printable(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] > 0x7e {
			return false
		}
	}
	return true
}

// setMetadata stores md (checked) on the open file f. A filesystem
// without user xattrs keeps none, as envd: the metadata read back from
// the file says what was kept.
func setMetadata(f *os.File, md map[string]string) error {
	for k, v := range md {
		err := unix.Fsetxattr(int(f.Fd()), MetadataXattr+k, []byte(v), 0)
		if errors.Is(err, unix.ENOTSUP) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("storing the metadata %q: %w", k, err)
		}
	}
	return nil
}

// metadata reads the file metadata of rel, described by fi (an lstat):
// nil when it has none, or is neither a regular file nor a directory (the
// only kinds that take user xattrs). The attributes are the box's to set,
// so they are checked as written ones are: a key or value that
// CheckMetadata would refuse is left out, and nothing past
// MaxMetadataBytes is read.
func (w *FS) metadata(rel string, fi fs.FileInfo) map[string]string {
	if !fi.Mode().IsRegular() && !fi.IsDir() {
		return nil
	}
	// O_NONBLOCK: something swapped in meanwhile (a FIFO) does not block
	// the open; O_NOFOLLOW: a link swapped in is not followed.
	f, err := w.root.OpenFile(rel, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil
	}
	defer f.Close()
	if st, err := f.Stat(); err != nil || !st.Mode().IsRegular() && !st.IsDir() {
		return nil
	}
	fd := int(f.Fd())
	buf := make([]byte, 64<<10) // the kernel's bound on a list (XATTR_LIST_MAX)
	n, err := unix.Flistxattr(fd, buf)
	if err != nil || n <= 0 {
		return nil
	}
	var md map[string]string
	total := 0
	val := make([]byte, MaxMetadataBytes)
	for name := range strings.SplitSeq(string(buf[:n]), "\x00") {
		k, ok := strings.CutPrefix(name, MetadataXattr)
		if !ok || k == "" || len(k) > MaxMetadataKey || !isToken(k) || strings.ToLower(k) != k {
			continue
		}
		m, err := unix.Fgetxattr(fd, name, val)
		if err != nil || !printable(string(val[:m])) {
			continue // gone meanwhile, over the bound (ERANGE), or not text
		}
		if total += len(name) + m; total > MaxMetadataBytes {
			break
		}
		if md == nil {
			md = map[string]string{}
		}
		md[k] = string(val[:m])
	}
	return md
}
