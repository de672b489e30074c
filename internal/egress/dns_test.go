package egress

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
	"golang.org/x/net/dns/dnsmessage"
)

// dnsBox is a ServeDNS on real sockets of 127.0.0.1, as a box would see it.
type dnsBox struct {
	udp, tcp string
	names    *Names
	mu       sync.Mutex
	logged   []string // onQuery's calls: "name type allowed rule"
	stop     func()
}

// allowTest refuses the names under refused.test.
func allowTest(name string) DNSDecision {
	if name == "refused.test" || strings.HasSuffix(name, ".refused.test") {
		return DNSDecision{Rule: "deny refused.test"}
	}
	return DNSDecision{Allowed: true, Rule: "allow *"}
}

func startDNS(t *testing.T, names *Names) *dnsBox {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	b := &dnsBox{udp: pc.LocalAddr().String(), tcp: ln.Addr().String(), names: names}
	done := make(chan struct{})
	go func() {
		defer close(done)
		ServeDNS(pc, ln, names, allowTest, func(name, qtype string, d DNSDecision) {
			b.mu.Lock()
			defer b.mu.Unlock()
			b.logged = append(b.logged, fmt.Sprintf("%s %s %v %s", name, qtype, d.Allowed, d.Rule))
		})
	}()
	var once sync.Once
	b.stop = func() {
		once.Do(func() {
			pc.Close()
			ln.Close()
			select {
			case <-done:
			case <-time.After(time.Minute): // a bound on a failure, for a loaded machine
				t.Error("ServeDNS still running a minute after its sockets closed")
			}
		})
	}
	t.Cleanup(b.stop)
	return b
}

// resolver is Go's own resolver asking b over network ("udp" or "tcp").
func (b *dnsBox) resolver(network string) *net.Resolver {
	return &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		if network == "tcp" {
			return d.DialContext(ctx, "tcp", b.tcp)
		}
		return d.DialContext(ctx, "udp", b.udp)
	}}
}

func query(t testing.TB, id uint16, name string, qtype dnsmessage.Type) []byte {
	t.Helper()
	m := dnsmessage.Message{
		Header:    dnsmessage.Header{ID: id, RecursionDesired: true},
		Questions: []dnsmessage.Question{{Name: dnsmessage.MustNewName(name), Type: qtype, Class: dnsmessage.ClassINET}},
	}
	b, err := m.Pack()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// answered is how long exchangeUDP waits for a query that must be
// answered (and a TCP read of one): the answer is the event waited for,
// and on a loaded machine (CI, other packages' tests beside, loads of 100
// and more here) a goroutine can stay unscheduled longer than the 300 ms
// and 2 s these waits were.
const answered = time.Minute

// exchangeUDP sends q in one datagram and is the answer, or nil if none
// came within wait.
func (b *dnsBox) exchangeUDP(t *testing.T, q []byte, wait time.Duration) []byte {
	t.Helper()
	c, err := net.Dial("udp", b.udp)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write(q); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(wait))
	buf := make([]byte, 2048)
	n, err := c.Read(buf)
	if err != nil {
		return nil
	}
	return buf[:n]
}

func parse(t *testing.T, resp []byte) dnsmessage.Message {
	t.Helper()
	var m dnsmessage.Message
	if err := m.Unpack(resp); err != nil {
		t.Fatalf("answer does not parse: %v", err)
	}
	return m
}

func TestDNSResolveUDPAndTCP(t *testing.T) {
	b := startDNS(t, NewNames())
	ctx := context.Background()
	for _, network := range []string{"udp", "tcp"} {
		r := b.resolver(network)
		for _, host := range []string{"Example.COM", "example.com", "pypi.org", "files." + network + ".example"} {
			addrs, err := r.LookupNetIP(ctx, "ip", host)
			if err != nil {
				t.Fatalf("%s: %s: %v", network, host, err)
			}
			want := b.names.Addr(host)
			if len(addrs) != 1 || addrs[0] != want || !FakeRange.Contains(want) {
				t.Errorf("%s: %s = %v, want [%v] only", network, host, addrs, want)
			}
			if name, ok := b.names.Name(want); !ok || name != strings.ToLower(host) {
				t.Errorf("Name(%v) = %q, %v", want, name, ok)
			}
		}
		if _, err := r.LookupNetIP(ctx, "ip", "www.refused.test"); err == nil {
			t.Errorf("%s: a refused name resolved", network)
		} else if de := (*net.DNSError)(nil); !errors.As(err, &de) || !de.IsNotFound {
			t.Errorf("%s: a refused name: %v, want not found", network, err)
		}
	}
	if a, b := b.names.Addr("example.com"), b.names.Addr("pypi.org"); a == b {
		t.Errorf("two names share %v", a)
	}
}

func TestDNSAnswers(t *testing.T) {
	b := startDNS(t, NewNames())
	fake := b.names.Addr("known.example")
	fb := fake.As4()
	ptrName := fmt.Sprintf("%d.%d.%d.%d.in-addr.arpa.", fb[3], fb[2], fb[1], fb[0])
	for _, c := range []struct {
		name   string
		qtype  dnsmessage.Type
		rcode  dnsmessage.RCode
		answer string // the one answer's body, "" for none
	}{
		{"ExAmple.Com.", dnsmessage.TypeA, dnsmessage.RCodeSuccess, b.names.Addr("example.com").String()},
		{"example.com.", dnsmessage.TypeAAAA, dnsmessage.RCodeSuccess, ""},
		{"example.com.", dnsmessage.TypeHTTPS, dnsmessage.RCodeSuccess, ""},
		{"example.com.", dnsmessage.TypeSVCB, dnsmessage.RCodeSuccess, ""},
		{"example.com.", dnsmessage.TypeMX, dnsmessage.RCodeSuccess, ""},
		{"example.com.", dnsmessage.TypeTXT, dnsmessage.RCodeSuccess, ""},
		{"example.com.", dnsmessage.TypeALL, dnsmessage.RCodeSuccess, ""},
		{"refused.test.", dnsmessage.TypeA, dnsmessage.RCodeNameError, ""},
		{"a.Refused.test.", dnsmessage.TypeAAAA, dnsmessage.RCodeNameError, ""},
		{"localhost.", dnsmessage.TypeA, dnsmessage.RCodeSuccess, "127.0.0.1"},
		{"LocalHost.", dnsmessage.TypeAAAA, dnsmessage.RCodeSuccess, "::1"},
		{"app.localhost.", dnsmessage.TypeA, dnsmessage.RCodeSuccess, "127.0.0.1"},
		{"app.localhost.", dnsmessage.TypeMX, dnsmessage.RCodeSuccess, ""},
		{ptrName, dnsmessage.TypePTR, dnsmessage.RCodeSuccess, "known.example."},
		{"8.8.8.8.in-addr.arpa.", dnsmessage.TypePTR, dnsmessage.RCodeNameError, ""},
		{"1.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.ip6.arpa.", dnsmessage.TypePTR, dnsmessage.RCodeNameError, ""},
		{"250.255.18.198.in-addr.arpa.", dnsmessage.TypePTR, dnsmessage.RCodeNameError, ""}, // fake, not given out
		{"1.2.3.4.", dnsmessage.TypeA, dnsmessage.RCodeNameError, ""},
		{"127.1.", dnsmessage.TypeA, dnsmessage.RCodeNameError, ""},
		{"evil.0x7f.", dnsmessage.TypeA, dnsmessage.RCodeNameError, ""},
		{"b\x00d.example.", dnsmessage.TypeA, dnsmessage.RCodeNameError, ""},
		{"\u212Aelvin.example.", dnsmessage.TypeA, dnsmessage.RCodeNameError, ""},
		{".", dnsmessage.TypeNS, dnsmessage.RCodeSuccess, ""},
	} {
		q := query(t, 0x1234, c.name, c.qtype)
		m := parse(t, b.exchangeUDP(t, q, answered))
		label := fmt.Sprintf("%s %s", c.name, typeName(c.qtype))
		if m.ID != 0x1234 || !m.Response || !m.RecursionDesired || !m.RecursionAvailable || m.Truncated {
			t.Errorf("%s: header %+v", label, m.Header)
		}
		if len(m.Questions) != 1 || m.Questions[0].Name.String() != c.name || m.Questions[0].Type != c.qtype {
			t.Errorf("%s: question not echoed: %+v", label, m.Questions)
		}
		if m.RCode != c.rcode {
			t.Errorf("%s: rcode %v, want %v", label, m.RCode, c.rcode)
		}
		got := ""
		for _, a := range m.Answers {
			if a.Header.Name.String() != c.name || a.Header.TTL != DNSTTL {
				t.Errorf("%s: answer header %+v", label, a.Header)
			}
			switch body := a.Body.(type) {
			case *dnsmessage.AResource:
				got += netip.AddrFrom4(body.A).String()
			case *dnsmessage.AAAAResource:
				got += netip.AddrFrom16(body.AAAA).String()
			case *dnsmessage.PTRResource:
				got += body.PTR.String()
			default:
				got += fmt.Sprintf("%T", body)
			}
		}
		if got != c.answer {
			t.Errorf("%s: answers %q, want %q", label, got, c.answer)
		}
	}
	if b.names.lru.Len() != 2 {
		t.Errorf("%d names given addresses, want known.example and example.com only", b.names.lru.Len())
	}
	b.mu.Lock()
	logged := strings.Join(b.logged, "\n")
	b.mu.Unlock()
	for _, want := range []string{
		"example.com A true allow *", "example.com HTTPS true allow *", "refused.test A false deny refused.test",
		"localhost AAAA true localhost", ptrName[:len(ptrName)-1] + " PTR true fake address",
		"8.8.8.8.in-addr.arpa PTR false reverse lookup", "1.2.3.4 A false address literal", "b?d.example A false not a host name",
	} {
		if !strings.Contains(logged, want+"\n") {
			t.Errorf("onQuery never said %q; it said:\n%s", want, logged)
		}
	}
}

// raw builds a query's bytes: a header with the given flags and question
// count, then body.
func raw(id, flags, qdcount uint16, body ...byte) []byte {
	h := binary.BigEndian.AppendUint16(nil, id)
	h = binary.BigEndian.AppendUint16(h, flags)
	h = binary.BigEndian.AppendUint16(h, qdcount)
	h = append(h, 0, 0, 0, 0, 0, 0)
	return append(h, body...)
}

func TestDNSMalformed(t *testing.T) {
	b := startDNS(t, NewNames())
	exampleQ := query(t, 7, "example.com.", dnsmessage.TypeA)[12:]
	long := []byte{}
	for range 4 {
		long = append(long, 63)
		long = append(long, strings.Repeat("a", 63)...)
	}
	long = append(long, 0, 0, 1, 0, 1)
	for _, c := range []struct {
		what  string
		q     []byte
		rcode dnsmessage.RCode
		drop  bool // no answer at all
	}{
		{"three bytes", []byte{1, 2, 3}, 0, true},
		{"empty", nil, 0, true},
		{"a response", raw(1, 0x8100, 1, exampleQ...), 0, true},
		{"opcode STATUS", raw(1, 2<<11|0x0100, 1, exampleQ...), dnsmessage.RCodeNotImplemented, false},
		{"no question", raw(1, 0x0100, 0), dnsmessage.RCodeFormatError, false},
		{"two questions", raw(1, 0x0100, 2, append(append([]byte{}, exampleQ...), exampleQ...)...), dnsmessage.RCodeFormatError, false},
		{"truncated question", raw(1, 0x0100, 1, exampleQ[:5]...), dnsmessage.RCodeFormatError, false},
		{"label of 64", raw(1, 0x0100, 1, append([]byte{64}, strings.Repeat("a", 64)+"\x00\x00\x01\x00\x01"...)...), dnsmessage.RCodeFormatError, false},
		{"name of 256", raw(1, 0x0100, 1, long...), dnsmessage.RCodeFormatError, false},
		{"pointer loop", raw(1, 0x0100, 1, 0xc0, 12, 0, 1, 0, 1), dnsmessage.RCodeFormatError, false},
		{"class CHAOS", raw(1, 0x0100, 1, append(append([]byte{}, exampleQ[:len(exampleQ)-1]...), 3)...), dnsmessage.RCodeNotImplemented, false},
	} {
		// An answer is waited for as long as a loaded machine may take;
		// a query that must go unanswered, a short while (a late answer
		// then passes unseen, but no answer is ever missed).
		wait := answered
		if c.drop {
			wait = 300 * time.Millisecond
		}
		resp := b.exchangeUDP(t, c.q, wait)
		switch {
		case c.drop && resp != nil:
			t.Errorf("%s: answered % x", c.what, resp)
		case c.drop:
		case resp == nil:
			t.Errorf("%s: no answer, want %v", c.what, c.rcode)
		default:
			m := parse(t, resp)
			if m.RCode != c.rcode || m.ID != 1 || !m.Response || len(m.Answers) != 0 {
				t.Errorf("%s: %+v, want %v", c.what, m.Header, c.rcode)
			}
		}
		// The server keeps serving.
		if resp := b.exchangeUDP(t, query(t, 9, "example.com.", dnsmessage.TypeA), answered); resp == nil || len(parse(t, resp).Answers) != 1 {
			t.Fatalf("after %s: no answer to a good query", c.what)
		}
	}

	// Over TCP an empty message ends the connection; others keep working.
	c, err := net.Dial("tcp", b.tcp)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(answered))
	if _, err := c.Write([]byte{0, 0}); err != nil {
		t.Fatal(err)
	}
	if n, err := c.Read(make([]byte, 10)); !errors.Is(err, io.EOF) {
		t.Errorf("an empty TCP message: read %d, %v; want EOF", n, err)
	}
	if _, err := b.resolver("tcp").LookupNetIP(context.Background(), "ip4", "after.example"); err != nil {
		t.Error(err)
	}
}

// TestDNSTCPConnection sends several queries on one connection, the
// second in two pieces, and answers come back in order.
func TestDNSTCPConnection(t *testing.T) {
	b := startDNS(t, NewNames())
	c, err := net.Dial("tcp", b.tcp)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(answered))
	framed := func(q []byte) []byte { return append(binary.BigEndian.AppendUint16(nil, uint16(len(q))), q...) }
	one, two := framed(query(t, 1, "one.example.", dnsmessage.TypeA)), framed(query(t, 2, "two.example.", dnsmessage.TypeAAAA))
	if _, err := c.Write(one); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Write(two[:5]); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond)
	if _, err := c.Write(two[5:]); err != nil {
		t.Fatal(err)
	}
	for _, id := range []uint16{1, 2} {
		var hdr [2]byte
		if _, err := io.ReadFull(c, hdr[:]); err != nil {
			t.Fatal(err)
		}
		resp := make([]byte, binary.BigEndian.Uint16(hdr[:]))
		if _, err := io.ReadFull(c, resp); err != nil {
			t.Fatal(err)
		}
		if m := parse(t, resp); m.ID != id || m.RCode != dnsmessage.RCodeSuccess {
			t.Errorf("answer %d: %+v", id, m.Header)
		}
	}
}

// TestDNSTCPLimit: past MaxDNSConns idle connections a new one is closed
// at once, and a freed slot serves again.
func TestDNSTCPLimit(t *testing.T) {
	b := startDNS(t, NewNames())
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for range MaxDNSConns {
		c, err := net.Dial("tcp", b.tcp)
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
	}
	extra, err := net.Dial("tcp", b.tcp)
	if err != nil {
		t.Fatal(err)
	}
	// The close comes once the server has accepted the connections
	// before it: the deadline only bounds a failure (3 s was short of
	// what a loaded machine may take to accept them).
	_ = extra.SetDeadline(time.Now().Add(time.Minute))
	if _, err := extra.Read(make([]byte, 1)); err == nil || isTimeout(err) {
		t.Errorf("connection %d: read %v, want closed", MaxDNSConns+1, err)
	}
	extra.Close()
	conns[0].Close()
	conns = conns[1:]
	r := b.resolver("tcp")
	deadline := time.Now().Add(time.Minute) // the slot frees once the server has seen the close
	for {
		_, err := r.LookupNetIP(context.Background(), "ip4", "freed.example")
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a freed slot does not serve: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

func TestNames(t *testing.T) {
	n := NewNames()
	a := n.Addr("Example.COM.")
	if a != netip.MustParseAddr("198.18.0.1") || n.Addr("example.com") != a {
		t.Errorf("first address %v; again %v", a, n.Addr("example.com"))
	}
	if got := n.Addr("second.example"); got != netip.MustParseAddr("198.18.0.2") {
		t.Errorf("second address %v", got)
	}
	for _, addr := range []string{"198.18.0.3", "198.18.0.0", "10.0.0.1", "::1"} {
		if name, ok := n.Name(netip.MustParseAddr(addr)); ok {
			t.Errorf("Name(%s) = %q", addr, name)
		}
	}
	if name, ok := n.Name(netip.MustParseAddr("::ffff:198.18.0.1")); !ok || name != "example.com" {
		t.Errorf("Name of the mapped address = %q, %v", name, ok)
	}
	if n.Addr("\u212Aelvin") == n.Addr("kelvin") {
		t.Error("the Kelvin sign is lower-cased to k")
	}

	// A flood of distinct names only recycles.
	for i := range 3 * MaxNames {
		a := n.Addr(fmt.Sprintf("flood%d.example", i))
		if !FakeRange.Contains(a) || a == FakeRange.Addr() {
			t.Fatalf("address %v", a)
		}
	}
	if len(n.byName) != MaxNames || len(n.byAddr) != MaxNames || n.lru.Len() != MaxNames {
		t.Errorf("%d names, %d addresses, %d in LRU; want %d", len(n.byName), len(n.byAddr), n.lru.Len(), MaxNames)
	}
	last := fmt.Sprintf("flood%d.example", 3*MaxNames-1)
	if name, ok := n.Name(n.Addr(last)); !ok || name != last {
		t.Errorf("the newest name: %q, %v", name, ok)
	}
}

func TestNamesLRU(t *testing.T) {
	n := newNames(3)
	a, b, c := n.Addr("a"), n.Addr("b"), n.Addr("c")
	n.Addr("a") // a used again
	n.Name(b)   // b connected to
	if d := n.Addr("d"); d != c {
		t.Errorf("d got %v, want c's %v (least recently used)", d, c)
	}
	if name, _ := n.Name(c); name != "d" {
		t.Errorf("c's address stands for %q, want d", name)
	}
	if n.Addr("a") != a || n.Addr("b") != b {
		t.Error("a recently used name lost its address")
	}
	// c's return evicts d, now the least recently used: it gets d's
	// address, which was c's.
	if e := n.Addr("c"); e != c {
		t.Errorf("c again got %v, want %v", e, c)
	}
	if n.lru.Len() != 3 {
		t.Errorf("%d names held, cap 3", n.lru.Len())
	}

	// Through the server too: twenty names asked, eight held.
	box := startDNS(t, newNames(8))
	r := box.resolver("udp")
	for i := range 20 {
		if _, err := r.LookupNetIP(context.Background(), "ip4", fmt.Sprintf("n%d.example", i)); err != nil {
			t.Fatal(err)
		}
	}
	box.names.mu.Lock()
	held := box.names.lru.Len()
	box.names.mu.Unlock()
	if held != 8 {
		t.Errorf("%d names held, cap 8", held)
	}
}

// TestDNSConcurrent is for -race: resolvers over UDP and TCP at once, all
// agreeing on each name's address.
func TestDNSConcurrent(t *testing.T) {
	b := startDNS(t, NewNames())
	var wg sync.WaitGroup
	errs := make(chan error, 100)
	for g := range 8 {
		network := []string{"udp", "tcp"}[g%2]
		wg.Go(func() {
			r := b.resolver(network)
			for i := range 20 {
				host := fmt.Sprintf("host%d.example", i%5)
				addrs, err := r.LookupNetIP(context.Background(), "ip", host)
				if err != nil {
					errs <- err
					return
				}
				if len(addrs) != 1 || addrs[0] != b.names.Addr(host) {
					errs <- fmt.Errorf("%s over %s: %v", host, network, addrs)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// TestDNSStops: closing the sockets ends ServeDNS and all its
// goroutines, even with a TCP client in the middle of a query.
func TestDNSStops(t *testing.T) {
	ignore := goleak.IgnoreCurrent()
	b := startDNS(t, NewNames())
	c, err := net.Dial("tcp", b.tcp)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write([]byte{0, 40, 1, 2}); err != nil { // 4 of 42 bytes
		t.Fatal(err)
	}
	if resp := b.exchangeUDP(t, query(t, 3, "example.com.", dnsmessage.TypeA), answered); resp == nil {
		t.Fatal("no answer")
	}
	// ServeDNS returns without waiting for the connection that holds a
	// half-sent query: had it waited, it would have returned only when
	// that connection's idle limit (DNSIdle) ended it. (Not a bound of a
	// second: on a loaded machine the return itself can take longer.)
	start := time.Now()
	b.stop()
	if d := time.Since(start); d >= DNSIdle {
		t.Errorf("ServeDNS took %v to return: it waited for the half-sent query's connection", d)
	}
	c.Close()
	goleak.VerifyNone(t, ignore)
}

func FuzzDNSQuery(f *testing.F) {
	f.Add(query(f, 1, "example.com.", dnsmessage.TypeA))
	f.Add(query(f, 2, "Example.Com.", dnsmessage.TypeA))
	f.Add(query(f, 3, "example.com.", dnsmessage.TypeAAAA))
	f.Add(query(f, 4, "1.0.18.198.in-addr.arpa.", dnsmessage.TypePTR))
	f.Add(query(f, 5, "localhost.", dnsmessage.TypeA))
	f.Add(raw(6, 0x0100, 1, 0xc0, 12, 0, 1, 0, 1))
	f.Add([]byte{1, 2, 3})
	f.Fuzz(func(t *testing.T, q []byte) {
		s := &dnsServer{names: newNames(4)}
		s.names.Addr("example.com")
		resp := s.respond(q)
		if len(q) < 12 || q[2]&0x80 != 0 {
			if resp != nil {
				t.Fatalf("answered a non-query: % x", resp)
			}
			return
		}
		if resp == nil {
			t.Fatal("a query got no answer")
		}
		if len(resp) > 512 {
			t.Fatalf("answer of %d bytes", len(resp))
		}
		var m dnsmessage.Message
		if err := m.Unpack(resp); err != nil {
			t.Fatalf("answer does not parse: %v", err)
		}
		if m.ID != binary.BigEndian.Uint16(q) || !m.Response {
			t.Fatalf("header %+v", m.Header)
		}
		// The seeds' shape: a single A question for example.com.
		var p dnsmessage.Parser
		h, _ := p.Start(q)
		qs, err := p.AllQuestions()
		if err == nil && h.OpCode == 0 && len(qs) == 1 && qs[0].Type == dnsmessage.TypeA && qs[0].Class == dnsmessage.ClassINET &&
			canonical(qs[0].Name.String()) == "example.com" {
			if m.RCode != dnsmessage.RCodeSuccess || len(m.Answers) != 1 {
				t.Fatalf("example.com A: %v, %d answers", m.RCode, len(m.Answers))
			}
			if a, ok := m.Answers[0].Body.(*dnsmessage.AResource); !ok || netip.AddrFrom4(a.A) != netip.MustParseAddr("198.18.0.1") {
				t.Fatalf("example.com A: %+v", m.Answers[0].Body)
			}
		}
	})
}
