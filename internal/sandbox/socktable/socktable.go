// Package socktable parses the kernel's TCP socket tables
// (/proc/net/tcp and tcp6) as hostile input: a box shapes them (how many
// sockets, which addresses), and the server reads them for list_ports
// (sandbox.ListenPorts). Lines of at most MaxLine bytes, every field
// parsed strictly; a line that does not parse is an error.
package socktable

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"strconv"
)

// MaxLine is the longest line of a table (the kernel's are ~150 bytes).
const MaxLine = 512

const tcpListen = 0x0A // TCP_LISTEN in the st column

// Listen is a socket in LISTEN state: its address (0.0.0.0 and :: for
// any) and port.
type Listen struct {
	Addr netip.Addr
	Port int
}

// Parse calls found for each socket of table (the text of
// /proc/net/tcp or tcp6) in LISTEN state owned by uid. A line longer than
// MaxLine or with a field that is not what the kernel writes is an
// error.
func Parse(table []byte, uid int, found func(Listen)) error {
	sc := bufio.NewScanner(bytes.NewReader(table))
	sc.Buffer(make([]byte, 0, MaxLine), MaxLine)
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
		found(Listen{Addr: addr, Port: port})
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
