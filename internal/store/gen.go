package store

import (
	"fmt"
	"os"
	"sync/atomic"
	"syscall"
	"unsafe"
)

// genFile is the size of the generation file: one page, of which the
// first 8 bytes are the counter.
const genFile = 4096

// generation is a counter shared by every process that opens the same
// database: the file <db>-gen beside it, mapped MAP_SHARED, whose first
// word every writer of sessions, tokens or settings increments (atomically,
// in shared memory) once its change is committed. Reading it is one atomic
// load — a few nanoseconds — so a request can ask "did anything cached
// change, in this process or any other?" without SQLite.
//
// Why not SQLite's PRAGMA data_version: it is a query (a connection and a
// statement per request, the very cost the cache removes), and every audit
// batch commits to the same file, so it would change, and empty the cache,
// on nearly every request of a busy server.
type generation struct {
	mem []byte
	p   *uint64
}

// The mapping is never unmapped, not even by Close: a request still
// running when its Store closes must find memory to load, and one page per
// opened Store is nothing.

// openGeneration maps file (created 0600, one page) or fails: then the
// Store caches nothing and reads SQLite each time.
func openGeneration(file string) (*generation, error) {
	f, err := os.OpenFile(file, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	// Two processes creating it at once both extend it to one page;
	// extending to the size it has is a no-op, so no counter is zeroed.
	if fi.Size() < genFile {
		if err := f.Truncate(genFile); err != nil {
			return nil, err
		}
	}
	mem, err := syscall.Mmap(int(f.Fd()), 0, genFile, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("mmap %s: %w", file, err)
	}
	// The mapping is page-aligned, so the word is 8-byte aligned: atomic
	// operations on it are atomic across processes too.
	return &generation{mem: mem, p: (*uint64)(unsafe.Pointer(&mem[0]))}, nil
}

func (g *generation) load() uint64 {
	if g == nil {
		return 0
	}
	return atomic.LoadUint64(g.p)
}

func (g *generation) bump() {
	if g != nil {
		atomic.AddUint64(g.p, 1)
	}
}
