package sandbox

import (
	"errors"
	"fmt"
	"io"
	"os"
	"slices"

	"github.com/quro-dev/quro/internal/sandbox/socktable"
)

// A box's listening ports: the kernel's TCP tables (/proc/net/tcp and
// tcp6) as seen from a thread inside the box's network namespace, kept to
// the sockets in LISTEN state owned by the session's own host uid. The
// tables are shaped by what the box's code does (how many sockets, which
// addresses), so they are read as hostile input: at most maxPortTable
// bytes a table, parsed by socktable (bounded lines, every field strict; a
// line that does not parse ends the read with an error).

// MaxPorts is the most ports ListenPorts answers (its truncated says
// more were listening).
const MaxPorts = 64

// maxPortTable is the most bytes read of one table (some 27,000 sockets).
const maxPortTable = 4 << 20

// ListenPort is a TCP port a box's process listens on: its address
// (0.0.0.0 and :: for any) and port.
type ListenPort = socktable.Listen

// ListenPorts lists the TCP ports (v4 and v6) in LISTEN state in the
// network namespace of session's box whose socket belongs to uid (the
// session's own host uid), sorted by port then address, at most MaxPorts
// of them (truncated: there were more). A session with no box lists
// none; a box with no network namespace of the server's is
// ErrNoBoxNamespace (its table would be the host's).
func (s *Sandbox) ListenPorts(session string, uid int) (ports []ListenPort, truncated bool, err error) {
	if uid <= 0 {
		// uid 0 owns the server's own sockets in the box (egress, DNS).
		return nil, false, fmt.Errorf("%w: uid %d: want the session's own uid", ErrInvalidSpec, uid)
	}
	bx := s.Box(session)
	if bx == nil {
		return nil, false, nil
	}
	bx.mu.Lock()
	ns, closed := bx.net.namespace(), bx.closed
	var v4, v6 []byte
	if !closed && ns != nil {
		// Under bx.mu: the namespace is not closed while it is read.
		err = ns.Do(func() error {
			var e error
			if v4, e = readTable("/proc/thread-self/net/tcp"); e != nil {
				return e
			}
			v6, e = readTable("/proc/thread-self/net/tcp6")
			if errors.Is(e, os.ErrNotExist) { // a kernel without IPv6
				e = nil
			}
			return e
		})
	}
	bx.mu.Unlock()
	switch {
	case closed:
		return nil, false, nil
	case ns == nil:
		return nil, false, ErrNoBoxNamespace
	case err != nil:
		return nil, false, fmt.Errorf("the box's socket table: %w", err)
	}
	seen := map[ListenPort]bool{}
	for _, t := range [][]byte{v4, v6} {
		if err := socktable.Parse(t, uid, func(p ListenPort) {
			seen[p] = true
		}); err != nil {
			return nil, false, fmt.Errorf("the box's socket table: %w", err)
		}
	}
	for p := range seen {
		ports = append(ports, p)
	}
	slices.SortFunc(ports, func(a, b ListenPort) int {
		if a.Port != b.Port {
			return a.Port - b.Port
		}
		return a.Addr.Compare(b.Addr)
	})
	if len(ports) > MaxPorts {
		return ports[:MaxPorts], true, nil
	}
	return ports, false, nil
}

// readTable reads at most maxPortTable bytes of the table at path; a
// longer table is an error rather than a silently partial answer.
func readTable(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxPortTable+1))
	if err != nil {
		return nil, err
	}
	if len(b) > maxPortTable {
		return nil, fmt.Errorf("%s: more than %d bytes of sockets", path, maxPortTable)
	}
	return b, nil
}
