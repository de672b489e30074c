package egress

import (
	"errors"
)

// maxPeek bounds what the transparent proxy reads of a connection's
// first bytes to find its destination name (a ClientHello, a request's
// head).
const maxPeek = 16 << 10

var (
	errNeedMore = errors.New("incomplete")
	errNotTLS   = errors.New("not a TLS ClientHello")
)

// Extension numbers of a ClientHello that parseClientHello reads.
const (
	extServerName = 0
	extECH        = 0xfe0d // encrypted_client_hello: the real name is hidden
)

// helloInfo is what the proxy wants of a ClientHello.
type helloInfo struct {
	sni    string // the host_name of server_name, or ""
	hasSNI bool
	ech    bool
}

// parseClientHello reads the ClientHello at the start of b (TLS records
// of type handshake, possibly several). It is errNeedMore when b ends
// before the ClientHello does, and never reads past b.
func parseClientHello(b []byte) (helloInfo, error) {
	// Gather the handshake message from its records.
	var msg []byte
	need := -1 // the handshake message's full length, once known
	for {
		if len(b) < 5 {
			return helloInfo{}, errNeedMore
		}
		if b[0] != 0x16 || b[1] != 3 {
			return helloInfo{}, errNotTLS
		}
		n := int(b[3])<<8 | int(b[4])
		if n == 0 || n > 1<<14+2048 {
			return helloInfo{}, errNotTLS
		}
		if len(b) < 5+n {
			return helloInfo{}, errNeedMore
		}
		msg = append(msg, b[5:5+n]...)
		b = b[5+n:]
		if need < 0 && len(msg) >= 4 {
			if msg[0] != 1 { // client_hello
				return helloInfo{}, errNotTLS
			}
			need = 4 + (int(msg[1])<<16 | int(msg[2])<<8 | int(msg[3]))
			if need > maxPeek {
				return helloInfo{}, errors.New("ClientHello too large")
			}
		}
		if need >= 0 && len(msg) >= need {
			return parseHelloBody(msg[4:need])
		}
		if len(msg) > maxPeek {
			return helloInfo{}, errors.New("ClientHello too large")
		}
	}
}

// cursor reads big-endian fields off a byte slice; any read past its
// end sets bad.
type cursor struct {
	b   []byte
	bad bool
}

func (c *cursor) bytes(n int) []byte {
	if c.bad || n < 0 || n > len(c.b) {
		c.bad = true
		return nil
	}
	v := c.b[:n]
	c.b = c.b[n:]
	return v
}

func (c *cursor) u8() int {
	v := c.bytes(1)
	if v == nil {
		return 0
	}
	return int(v[0])
}

func (c *cursor) u16() int {
	v := c.bytes(2)
	if v == nil {
		return 0
	}
	return int(v[0])<<8 | int(v[1])
}

var errBadHello = errors.New("malformed ClientHello")

func parseHelloBody(body []byte) (helloInfo, error) {
	c := &cursor{b: body}
	c.bytes(2)       // legacy_version
	c.bytes(32)      // random
	c.bytes(c.u8())  // legacy_session_id
	c.bytes(c.u16()) // cipher_suites
	c.bytes(c.u8())  // legacy_compression_methods
	if c.bad {
		return helloInfo{}, errBadHello
	}
	var h helloInfo
	if len(c.b) == 0 {
		return h, nil // no extensions at all
	}
	exts := &cursor{b: c.bytes(c.u16())}
	if c.bad {
		return helloInfo{}, errBadHello
	}
	seen := map[int]bool{}
	for len(exts.b) > 0 && !exts.bad {
		typ := exts.u16()
		data := exts.bytes(exts.u16())
		if exts.bad {
			break
		}
		if seen[typ] {
			return helloInfo{}, errors.New("ClientHello repeats an extension")
		}
		seen[typ] = true
		switch typ {
		case extECH:
			h.ech = true
		case extServerName:
			d := &cursor{b: data}
			list := &cursor{b: d.bytes(d.u16())}
			if d.bad || len(d.b) != 0 {
				return helloInfo{}, errBadHello
			}
			for len(list.b) > 0 && !list.bad {
				nt := list.u8()
				name := list.bytes(list.u16())
				if list.bad {
					break
				}
				if nt == 0 {
					if h.hasSNI || len(name) == 0 {
						return helloInfo{}, errBadHello
					}
					h.sni, h.hasSNI = string(name), true
				}
			}
			if list.bad {
				return helloInfo{}, errBadHello
			}
		}
	}
	if exts.bad {
		return helloInfo{}, errBadHello
	}
	return h, nil
}
