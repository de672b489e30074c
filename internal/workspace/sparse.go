package workspace

import (
	"archive/tar"
	"cmp"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// A sparse file in a move's tar stream: an entry of type typeSparse whose
// bytes are only the file's data, with the PAX records sparseMapKey
// ("OFFSET+LENGTH" of each data segment, in order, separated by commas;
// "" when the file is all hole) and sparseSizeKey (the file's size).
// archive/tar reads the standard sparse formats back as zeros and writes
// none, so the stream uses its own. The type is one of tar's vendor
// letters, not a regular file's: a node of an earlier version refuses the
// entry (the move fails, the session stays where it was) rather than
// take its data as the whole file.
const (
	typeSparse    byte = 'Q'
	sparseMapKey       = "QURO.sparse.map"
	sparseSizeKey      = "QURO.sparse.size"
	// maxSparseSegs bounds a map (the PAX header that holds it stays
	// well under archive/tar's 1 MiB): a file with more data segments
	// sends its smallest holes as zeros.
	maxSparseSegs = 1 << 14
)

// segment is a run of a file's data.
type segment struct{ off, n int64 }

// dataSegments are the data of f, size bytes long, as the filesystem
// tells them (SEEK_DATA, SEEK_HOLE); one segment of all of it where the
// filesystem cannot tell.
func dataSegments(f *os.File, size int64) []segment {
	all := []segment{{0, size}}
	if size == 0 {
		return nil
	}
	var segs []segment
	for off := int64(0); off < size; {
		start, err := f.Seek(off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) || err == nil && start >= size {
			break // only a hole is left
		}
		if err != nil {
			return all
		}
		end, err := f.Seek(start, unix.SEEK_HOLE)
		if err != nil || end <= start {
			return all
		}
		end = min(end, size)
		segs = append(segs, segment{start, end - start})
		off = end
	}
	return coalesce(segs, maxSparseSegs)
}

// coalesce fills the smallest holes between segs until at most max
// segments are left.
func coalesce(segs []segment, limit int) []segment {
	if len(segs) <= limit {
		return segs
	}
	gaps := make([]int, len(segs)-1)
	for i := range gaps {
		gaps[i] = i
	}
	gap := func(i int) int64 { return segs[i+1].off - segs[i].off - segs[i].n }
	slices.SortFunc(gaps, func(a, b int) int { return cmp.Compare(gap(a), gap(b)) })
	fill := make([]bool, len(segs))
	for _, i := range gaps[:len(segs)-limit] {
		fill[i] = true // the hole after segs[i] is sent as zeros
	}
	out := []segment{segs[0]}
	for i := 1; i < len(segs); i++ {
		if fill[i-1] {
			last := &out[len(out)-1]
			last.n = segs[i].off + segs[i].n - last.off
			continue
		}
		out = append(out, segs[i])
	}
	return out
}

// writeFile writes the entry hdr of f (size bytes) to tw: its data
// segments only, with their map, when f has holes. It returns the bytes
// of data written.
func writeFile(tw *tar.Writer, hdr *tar.Header, f *os.File, size int64) (int64, error) {
	segs := dataSegments(f, size)
	var data int64
	for _, s := range segs {
		data += s.n
	}
	hdr.Typeflag, hdr.Size = tar.TypeReg, data
	if data != size {
		m := make([]string, len(segs))
		for i, s := range segs {
			m[i] = strconv.FormatInt(s.off, 10) + "+" + strconv.FormatInt(s.n, 10)
		}
		hdr.Typeflag = typeSparse
		hdr.PAXRecords = map[string]string{sparseMapKey: strings.Join(m, ","), sparseSizeKey: strconv.FormatInt(size, 10)}
	}
	if err := tw.WriteHeader(hdr); err != nil {
		return 0, err
	}
	var n int64
	for _, s := range segs {
		c, err := io.Copy(tw, io.NewSectionReader(f, s.off, s.n))
		n += c
		if err != nil {
			return n, err
		}
		if c != s.n {
			return n, errors.New("it changed size during the move")
		}
	}
	return n, nil
}

// sparseMap is the data segments and size of the file entry hdr (a
// regular file's: all of it), checked as hostile: segments in order, none
// empty, overlapping or past the size, their lengths adding up to the
// entry's bytes.
func sparseMap(hdr *tar.Header) ([]segment, int64, error) {
	if hdr.Typeflag != typeSparse {
		return []segment{{0, hdr.Size}}, hdr.Size, nil
	}
	m, ok := hdr.PAXRecords[sparseMapKey]
	if !ok {
		return nil, 0, fmt.Errorf("%w: %q is a sparse file with no map of its data", ErrUnsafeArchive, hdr.Name)
	}
	bad := func(why string) ([]segment, int64, error) {
		return nil, 0, fmt.Errorf("%w: %q's map of holes %s", ErrUnsafeArchive, hdr.Name, why)
	}
	size, err := strconv.ParseInt(hdr.PAXRecords[sparseSizeKey], 10, 64)
	if err != nil || size < 0 {
		return bad("has no size")
	}
	var segs []segment
	if m != "" {
		parts := strings.Split(m, ",")
		if len(parts) > maxSparseSegs {
			return bad(fmt.Sprintf("has more than %d segments", maxSparseSegs))
		}
		var end, total int64
		for _, p := range parts {
			o, l, _ := strings.Cut(p, "+")
			off, err1 := strconv.ParseInt(o, 10, 64)
			n, err2 := strconv.ParseInt(l, 10, 64)
			switch {
			case err1 != nil || err2 != nil:
				return bad("is not OFFSET+LENGTH,...")
			case off < end || n <= 0 || off > size || n > size-off:
				return bad("has a segment out of order, empty or past the file's size")
			}
			segs = append(segs, segment{off, n})
			end, total = off+n, total+n
		}
		if total != hdr.Size {
			return bad("does not add up to the entry's bytes")
		}
	} else if hdr.Size != 0 {
		return bad("does not add up to the entry's bytes")
	}
	return segs, size, nil
}

// readFile writes the data segments segs from r into the new file f and
// gives it its size (the rest are holes); it returns the bytes written.
func readFile(f *os.File, r io.Reader, segs []segment, size int64) (int64, error) {
	var n int64
	for _, s := range segs {
		if _, err := f.Seek(s.off, io.SeekStart); err != nil {
			return n, err
		}
		c, err := io.CopyN(f, r, s.n)
		n += c
		if err != nil {
			return n, err
		}
	}
	return n, f.Truncate(size)
}
