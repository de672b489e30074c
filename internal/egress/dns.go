package egress

import (
	"container/list"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/net/dns/dnsmessage"
)

// A box's DNS never learns a real address: each name it asks is answered
// with a synthetic ("fake") address that the transparent proxy maps back
// to the name when the box connects to it, then checks the name's policy
// and resolves the name itself. A name that resolves to a private address
// on the second lookup (DNS rebinding) therefore gains the box nothing,
// and domain rules apply to names, not to addresses that many names share.

// Bounds of a box's DNS.
const (
	MaxNames      = 4096             // names (and fake addresses) one box holds at once
	DNSTTL        = 60               // seconds, of every record answered
	DNSIdle       = 10 * time.Second // a TCP connection's time to send one whole query
	MaxDNSConns   = 16               // TCP connections per box at once
	maxUDPQuery   = 1500             // one datagram: a query never needs more
	maxUDPAnswer  = 512              // RFC 1035's limit without EDNS: our answers always fit
	dnsWriteLimit = time.Second      // to hand one answer to the kernel
)

// FakeRange is 198.18.0.0/15, the benchmarking range (RFC 2544): never
// routed, and Class calls it reserved, so no real destination is in it.
var FakeRange = netip.MustParsePrefix("198.18.0.0/15")

// Names is one box's map between the names its DNS answered and the
// synthetic addresses it answered with (198.18.0.0/15).
//
// It holds at most MaxNames names, so a box asking for endless distinct
// names only recycles addresses: past the cap the least recently used
// name gives its address to the new one. Addresses are handed out from
// 198.18.0.1 upward; the cap keeps them far from 198.19.255.255.
type Names struct {
	mu     sync.Mutex
	max    int
	byName map[string]*list.Element // of *nameEntry
	byAddr map[netip.Addr]*list.Element
	lru    list.List // most recently used first
}

type nameEntry struct {
	name string
	addr netip.Addr
}

// NewNames is an empty map holding at most MaxNames names.
func NewNames() *Names { return newNames(MaxNames) }

// newNames is an empty map holding at most max names (tests use a small
// cap); max is at most the range's addresses but its first and last.
func newNames(max int) *Names {
	max = min(max, 1<<(32-FakeRange.Bits())-2)
	return &Names{max: max, byName: map[string]*list.Element{}, byAddr: map[netip.Addr]*list.Element{}}
}

// Addr returns name's synthetic address, allocating one the first time
// (names are lower-cased, a trailing dot dropped). At most MaxNames names
// per box: past it the least recently used name's address is reused.
func (n *Names) Addr(name string) netip.Addr {
	name = canonical(name)
	n.mu.Lock()
	defer n.mu.Unlock()
	if e, ok := n.byName[name]; ok {
		n.lru.MoveToFront(e)
		return e.Value.(*nameEntry).addr
	}
	if n.lru.Len() >= n.max {
		e := n.lru.Back()
		ne := e.Value.(*nameEntry)
		delete(n.byName, ne.name)
		ne.name = name
		n.byName[name] = e
		n.lru.MoveToFront(e)
		return ne.addr
	}
	// Entries are never removed, only recycled, so the count so far is
	// the last address given out: the next one follows it.
	b := FakeRange.Addr().As4()
	i := uint32(n.lru.Len()) + 1 + binary.BigEndian.Uint32(b[:])
	binary.BigEndian.PutUint32(b[:], i)
	a := netip.AddrFrom4(b)
	e := n.lru.PushFront(&nameEntry{name: name, addr: a})
	n.byName[name] = e
	n.byAddr[a] = e
	return a
}

// Name is the name a synthetic address stands for, or false (not in
// 198.18.0.0/15, or not given out). A name asked for is in use, so it
// becomes the most recently used: a connection's name is not the next
// to be recycled.
func (n *Names) Name(a netip.Addr) (string, bool) {
	a = a.Unmap()
	if !FakeRange.Contains(a) {
		return "", false
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	e, ok := n.byAddr[a]
	if !ok {
		return "", false
	}
	n.lru.MoveToFront(e)
	return e.Value.(*nameEntry).name, true
}

// canonical is name in ASCII lower case without its trailing dot. Only
// ASCII letters change: strings.ToLower would turn the Kelvin sign into
// "k", making a name no resolver asks look like one the policy allows.
func canonical(name string) string {
	name = strings.TrimSuffix(name, ".")
	for i := 0; i < len(name); i++ {
		if c := name[i]; 'A' <= c && c <= 'Z' {
			b := []byte(name)
			for j := i; j < len(b); j++ {
				if 'A' <= b[j] && b[j] <= 'Z' {
					b[j] += 'a' - 'A'
				}
			}
			return string(b)
		}
	}
	return name
}

// DNSDecision is what the server's policy says of a name the box asked.
type DNSDecision struct {
	Allowed bool
	Rule    string
}

// Rules of the decisions ServeDNS makes itself, without asking allow.
const (
	RuleLocalhost = "localhost"      // localhost and *.localhost: the box's own loopback
	RuleFakePTR   = "fake address"   // the reverse name of an address given out
	RuleReverse   = "reverse lookup" // any other in-addr.arpa or ip6.arpa name
	RuleLiteral   = "address literal"
	RuleNotHost   = "not a host name" // a byte other than a letter, digit, '-' or '_'
	RuleRoot      = "root"
)

// ServeDNS answers the box's queries on pc (UDP) and ln (TCP, RFC 1035
// length-prefixed, several queries per connection, idle timeout DNSIdle,
// at most MaxDNSConns connections at once) until both are closed; either
// may be nil. allow is asked for each query name (nil: everything
// allowed). onQuery, if not nil, is called once per query (for the egress
// log) with the name, type and decision; queries answered FORMERR or
// NOTIMP, or dropped, are not reported. allow and onQuery are called from
// several goroutines at once.
//
// Answers: A of an allowed name is its fake address (Names.Addr); every
// other type of an allowed name (AAAA, HTTPS, SVCB, MX, TXT, ANY…) is
// NOERROR without records, so the box uses IPv4 through the proxy and
// programs behave as for a name without such records (ANY gets no
// records either, as RFC 8482 permits a minimal answer). A refused name
// is NXDOMAIN whatever the type. localhost and *.localhost are 127.0.0.1
// and ::1. An address literal, a name whose last label is numeric (an
// IPv4 address in some spelling) and a name with bytes no host name has
// are NXDOMAIN. Of reverse names (in-addr.arpa, ip6.arpa) only those of
// fake addresses given out exist, their PTR the name.
func ServeDNS(pc net.PacketConn, ln net.Listener, names *Names, allow func(name string) DNSDecision, onQuery func(name string, qtype string, d DNSDecision)) {
	s := &dnsServer{names: names, allow: allow, onQuery: onQuery}
	var wg sync.WaitGroup
	if pc != nil {
		wg.Go(func() { s.serveUDP(pc) })
	}
	if ln != nil {
		wg.Go(func() { s.serveTCP(ln) })
	}
	wg.Wait()
}

type dnsServer struct {
	names   *Names
	allow   func(name string) DNSDecision
	onQuery func(name string, qtype string, d DNSDecision)
}

// serveUDP answers each datagram in turn until pc is closed.
func (s *dnsServer) serveUDP(pc net.PacketConn) {
	buf := make([]byte, maxUDPQuery)
	for {
		n, from, err := pc.ReadFrom(buf)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			time.Sleep(10 * time.Millisecond) // a transient error: the next datagram may fare better
			continue
		}
		if resp := s.respond(buf[:n]); resp != nil && len(resp) <= maxUDPAnswer {
			_ = pc.SetWriteDeadline(time.Now().Add(dnsWriteLimit))
			_, _ = pc.WriteTo(resp, from)
		}
	}
}

// serveTCP serves each connection on its own goroutine until ln is
// closed, then cuts the connections and waits for their ends. A
// connection past MaxDNSConns is closed at once: the box's resolver
// retries, and a waiting accept would let a flood queue up.
func (s *dnsServer) serveTCP(ln net.Listener) {
	var (
		mu    sync.Mutex
		conns = map[net.Conn]struct{}{}
		wg    sync.WaitGroup
	)
	defer func() {
		mu.Lock()
		for c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	}()
	for {
		c, err := ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			time.Sleep(10 * time.Millisecond) // EMFILE and the like
			continue
		}
		mu.Lock()
		full := len(conns) >= MaxDNSConns
		if !full {
			conns[c] = struct{}{}
		}
		mu.Unlock()
		if full {
			c.Close()
			continue
		}
		wg.Go(func() {
			defer func() {
				c.Close()
				mu.Lock()
				delete(conns, c)
				mu.Unlock()
			}()
			s.serveConn(c)
		})
	}
}

// serveConn answers one connection's queries, each a 2-byte length and
// that many bytes, which must all arrive within DNSIdle.
func (s *dnsServer) serveConn(c net.Conn) {
	var buf []byte
	for {
		_ = c.SetDeadline(time.Now().Add(DNSIdle))
		var hdr [2]byte
		if _, err := io.ReadFull(c, hdr[:]); err != nil {
			return
		}
		n := int(binary.BigEndian.Uint16(hdr[:]))
		if cap(buf) < n {
			buf = make([]byte, n)
		}
		if _, err := io.ReadFull(c, buf[:n]); err != nil {
			return
		}
		resp := s.respond(buf[:n])
		if resp == nil {
			return
		}
		out := binary.BigEndian.AppendUint16(make([]byte, 0, 2+len(resp)), uint16(len(resp)))
		if _, err := c.Write(append(out, resp...)); err != nil {
			return
		}
	}
}

// respond is the response to the query packet q, or nil when q gets
// none: it is shorter than a DNS header, or it is itself a response (a
// response answered could start a loop).
func (s *dnsServer) respond(q []byte) []byte {
	var p dnsmessage.Parser
	h, err := p.Start(q)
	if err != nil || h.Response {
		return nil
	}
	m := dnsmessage.Message{Header: dnsmessage.Header{
		ID: h.ID, Response: true, OpCode: h.OpCode,
		RecursionDesired: h.RecursionDesired, RecursionAvailable: true,
	}}
	if h.OpCode != 0 {
		m.RCode = dnsmessage.RCodeNotImplemented
		return pack(&m)
	}
	question, err := p.Question()
	if err == nil {
		if _, err2 := p.Question(); !errors.Is(err2, dnsmessage.ErrSectionDone) {
			err = errors.New("more than one question")
		}
	}
	name := canonical(question.Name.String())
	if err != nil || len(name) > 253 {
		m.RCode = dnsmessage.RCodeFormatError
		return pack(&m)
	}
	m.Questions = []dnsmessage.Question{question}
	if question.Class != dnsmessage.ClassINET {
		m.RCode = dnsmessage.RCodeNotImplemented
		return pack(&m)
	}
	d := s.answer(&m, name, question)
	if s.onQuery != nil {
		if d.Rule == RuleNotHost || d.Rule == RuleLiteral {
			name = sanitize(name) // bytes the box chose, on their way to a log
		}
		s.onQuery(name, typeName(question.Type), d)
	}
	return pack(&m)
}

// answer fills m's RCode and answers for the question of the canonical
// name, and is the decision on the name.
func (s *dnsServer) answer(m *dnsmessage.Message, name string, q dnsmessage.Question) DNSDecision {
	switch {
	case name == "":
		return DNSDecision{Allowed: true, Rule: RuleRoot}
	case !hostName(name):
		m.RCode = dnsmessage.RCodeNameError
		if _, err := netip.ParseAddr(name); err == nil {
			return DNSDecision{Rule: RuleLiteral}
		}
		return DNSDecision{Rule: RuleNotHost}
	case name == "localhost" || strings.HasSuffix(name, ".localhost"):
		switch q.Type {
		case dnsmessage.TypeA:
			m.Answers = append(m.Answers, record(q, &dnsmessage.AResource{A: [4]byte{127, 0, 0, 1}}))
		case dnsmessage.TypeAAAA:
			m.Answers = append(m.Answers, record(q, &dnsmessage.AAAAResource{AAAA: netip.IPv6Loopback().As16()}))
		}
		return DNSDecision{Allowed: true, Rule: RuleLocalhost}
	case isReverse(name):
		return s.reverse(m, name, q)
	case numeric(name[strings.LastIndexByte(name, '.')+1:]):
		m.RCode = dnsmessage.RCodeNameError
		return DNSDecision{Rule: RuleLiteral}
	}
	d := DNSDecision{Allowed: true}
	if s.allow != nil {
		d = s.allow(name)
	}
	switch {
	case !d.Allowed:
		m.RCode = dnsmessage.RCodeNameError
	case q.Type == dnsmessage.TypeA:
		m.Answers = append(m.Answers, record(q, &dnsmessage.AResource{A: s.names.Addr(name).As4()}))
	}
	return d
}

// reverse answers an in-addr.arpa or ip6.arpa name: it exists only as a
// fake address given out, whose PTR is its name.
func (s *dnsServer) reverse(m *dnsmessage.Message, name string, q dnsmessage.Question) DNSDecision {
	labels := strings.Split(strings.TrimSuffix(name, ".in-addr.arpa"), ".")
	if len(labels) == 4 && strings.HasSuffix(name, ".in-addr.arpa") {
		labels[0], labels[1], labels[2], labels[3] = labels[3], labels[2], labels[1], labels[0]
		if a, err := netip.ParseAddr(strings.Join(labels, ".")); err == nil && a.Is4() {
			if target, ok := s.names.Name(a); ok {
				if q.Type == dnsmessage.TypePTR {
					ptr, err := dnsmessage.NewName(target + ".")
					if err == nil {
						m.Answers = append(m.Answers, record(q, &dnsmessage.PTRResource{PTR: ptr}))
					}
				}
				return DNSDecision{Allowed: true, Rule: RuleFakePTR}
			}
		}
	}
	m.RCode = dnsmessage.RCodeNameError
	return DNSDecision{Rule: RuleReverse}
}

func isReverse(name string) bool {
	for _, z := range []string{"in-addr.arpa", "ip6.arpa"} {
		if name == z || strings.HasSuffix(name, "."+z) {
			return true
		}
	}
	return false
}

// hostName is whether the canonical name is labels of 1–63 letters,
// digits, '-' and '_' (service labels such as _dmarc) joined by dots.
func hostName(name string) bool {
	for label := range strings.SplitSeq(name, ".") {
		if len(label) == 0 || len(label) > 63 {
			return false
		}
		for i := 0; i < len(label); i++ {
			c := label[i]
			if !('a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '-' || c == '_') {
				return false
			}
		}
	}
	return true
}

// numeric is whether a last label makes the name an IPv4 address to
// inet_aton and to browsers (127.1, 0x7f.1): no top-level domain is
// numeric, and a resolver may turn such a name into any address.
func numeric(label string) bool {
	digits := "0123456789"
	if h, ok := strings.CutPrefix(label, "0x"); ok {
		label, digits = h, "0123456789abcdef"
	}
	for i := 0; i < len(label); i++ {
		if strings.IndexByte(digits, label[i]) < 0 {
			return false
		}
	}
	return true
}

// record is an answer to q with body, under the question's own spelling
// of the name (packing sets the type from body).
func record(q dnsmessage.Question, body dnsmessage.ResourceBody) dnsmessage.Resource {
	return dnsmessage.Resource{
		Header: dnsmessage.ResourceHeader{Name: q.Name, Class: dnsmessage.ClassINET, TTL: DNSTTL},
		Body:   body,
	}
}

// pack is m on the wire, or nil (no answer) if it cannot be packed.
func pack(m *dnsmessage.Message) []byte {
	b, err := m.Pack()
	if err != nil {
		return nil
	}
	return b
}

var typeNames = map[dnsmessage.Type]string{
	dnsmessage.TypeA: "A", dnsmessage.TypeNS: "NS", dnsmessage.TypeCNAME: "CNAME", dnsmessage.TypeSOA: "SOA",
	dnsmessage.TypePTR: "PTR", dnsmessage.TypeMX: "MX", dnsmessage.TypeTXT: "TXT", dnsmessage.TypeAAAA: "AAAA",
	dnsmessage.TypeSRV: "SRV", dnsmessage.TypeSVCB: "SVCB", dnsmessage.TypeHTTPS: "HTTPS", dnsmessage.TypeALL: "ANY",
}

// typeName is a query type as dig writes it: A, AAAA, HTTPS, or TYPE99.
func typeName(t dnsmessage.Type) string {
	if s, ok := typeNames[t]; ok {
		return s
	}
	return "TYPE" + strconv.Itoa(int(t))
}
