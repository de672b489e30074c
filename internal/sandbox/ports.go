package sandbox

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"slices"
	"strconv"
)

// A box's listening ports: the kernel's TCP tables (/proc/net/tcp and
// tcp6) as seen from a thread inside the box's network namespace, kept to
// the sockets in LISTEN state owned by the session's own host uid. The
// tables are shaped by what the box's code does (how many sockets, which
// addresses), so they are read as hostile input: at most maxPortTable
// bytes a table, lines of at most maxPortLine bytes, every field parsed
// strictly; a line that does not parse ends the read with an error.

// MaxPorts is the most ports ListenPorts answers; Truncated says more
// were listening.
const MaxPorts = 64

const (
	maxPortTable = 4 << 20 // bytes read of one table (some 27,000 sockets)
	maxPortLine  = 512     // a line of the table (the kernel's are ~150)
	tcpListen    = 0x0A    // TCP_LISTEN in the st column
)

// ListenPort is a TCP port a box's process listens on.
type ListenPort struct {
	Addr netip.Addr // the address it is bound to (0.0.0.0 and :: for any)
	Port int
}

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
		if err := ParseTCPTable(t, uid, func(p ListenPort) {
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

// ParseTCPTable calls found for each socket of table (the text of
// /proc/net/tcp or tcp6) in LISTEN state owned by uid. A line longer than
// maxPortLine or with a field that is not what the kernel writes is an
// error.
func ParseTCPTable(table []byte, uid int, found func(ListenPort)) error {
	sc := bufio.NewScanner(bytes.NewReader(table))
	sc.Buffer(make([]byte, 0, maxPortLine), maxPortLine)
	first := true
	for sc.Scan() {
		line := sc.Bytes()
		if first { // the header
			first = false
			if !bytes.Contains(line, []byte("local_address")) {
				return errors.New("not a socket table: no header")
			}
			continue
		}
		f := bytes.Fields(line)
		if len(f) == 0 {
			continue
		}
		if len(f) < 10 {
			return fmt.Errorf("a socket line of %d fields", len(f))
		}
		st, err := strconv.ParseUint(string(f[3]), 16, 8)
		if err != nil || len(f[3]) != 2 {
			return fmt.Errorf("socket state %q", f[3])
		}
		owner, err := strconv.ParseUint(string(f[7]), 10, 32)
		if err != nil {
			return fmt.Errorf("socket uid %q", f[7])
		}
		addr, port, err := parseHexAddrPort(f[1])
		if err != nil {
			return err
		}
		if st != tcpListen || owner != uint64(uid) {
			continue
		}
		found(ListenPort{Addr: addr, Port: port})
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("socket table: %w", err)
	}
	return nil
}

// parseHexAddrPort parses the kernel's ADDR:PORT, the address as 8 (v4)
// or 32 (v6) hex digits of 32-bit words in the host's byte order, the
// port as 4 hex digits.
func parseHexAddrPort(s []byte) (netip.Addr, int, error) {
	i := bytes.IndexByte(s, ':')
	if i < 0 || len(s)-i-1 != 4 || i != 8 && i != 32 {
		return netip.Addr{}, 0, fmt.Errorf("socket address %q", s)
	}
	port, err := strconv.ParseUint(string(s[i+1:]), 16, 16)
	if err != nil {
		return netip.Addr{}, 0, fmt.Errorf("socket port %q", s[i+1:])
	}
	var raw [16]byte
	for w := 0; w < i/8; w++ {
		v, err := strconv.ParseUint(string(s[w*8:w*8+8]), 16, 32)
		if err != nil {
			return netip.Addr{}, 0, fmt.Errorf("socket address %q", s[:i])
		}
		binary.NativeEndian.PutUint32(raw[w*4:], uint32(v))
	}
	if i == 8 {
		return netip.AddrFrom4([4]byte(raw[:4])), int(port), nil
	}
	return netip.AddrFrom16(raw).Unmap(), int(port), nil
}
