package sandbox

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/quro-dev/quro/internal/sandbox/sandboxtest"
)

// echoEgress stands in for the server's egress: on the box's EgressPort it
// answers each redirected connection with the destination the box asked
// for (SO_ORIGINAL_DST), and on its DNSPort it answers each datagram with
// "dns". It counts the namespaces it served and the ones it let go.
type echoEgress struct {
	mu       sync.Mutex
	attached map[string]int
	open     int
}

func (e *echoEgress) Attach(session string, ns *Netns) (io.Closer, error) {
	ln, err := ns.Listen("tcp4", fmt.Sprintf("127.0.0.1:%d", EgressPort))
	if err != nil {
		return nil, err
	}
	pc, err := ns.ListenPacket("udp4", fmt.Sprintf("127.0.0.1:%d", DNSPort))
	if err != nil {
		ln.Close()
		return nil, err
	}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			dst := "none"
			if raw, err := c.(*net.TCPConn).SyscallConn(); err == nil {
				_ = raw.Control(func(fd uintptr) {
					if a, err := unix.GetsockoptIPv6Mreq(int(fd), unix.SOL_IP, 80); err == nil {
						dst = fmt.Sprintf("%d.%d.%d.%d:%d", a.Multiaddr[4], a.Multiaddr[5], a.Multiaddr[6], a.Multiaddr[7], int(a.Multiaddr[2])<<8|int(a.Multiaddr[3]))
					}
				})
			}
			fmt.Fprintf(c, "dst=%s\n", dst)
			c.Close()
		}
	}()
	go func() {
		b := make([]byte, 1500)
		for {
			_, from, err := pc.ReadFrom(b)
			if err != nil {
				return
			}
			_, _ = pc.WriteTo([]byte("dns"), from)
		}
	}()
	e.mu.Lock()
	e.attached[session]++
	e.open++
	e.mu.Unlock()
	return closerFunc(func() error {
		e.mu.Lock()
		e.open--
		e.mu.Unlock()
		return errors.Join(ln.Close(), pc.Close())
	}), nil
}

type closerFunc func() error

func (f closerFunc) Close() error { return f() }

// TestNetnsInternetOnlyWayOutIsTheEgress: a session box under "internet"
// is in a namespace the server made: every TCP connection to an address
// off its loopback reaches the server's egress listener, which learns the
// destination the box asked for; a DNS datagram to any resolver reaches
// the server's DNS socket; any other datagram is dropped; the host's
// loopback is not the box's; the box's root can change nothing of it; and
// when the box closes, the egress is let go.
func TestNetnsInternetOnlyWayOutIsTheEgress(t *testing.T) {
	eg := &echoEgress{attached: map[string]int{}}
	sb, err := New(&Options{SessionBoxes: true, Egress: eg})
	if err != nil {
		t.Fatal(err)
	}
	if !sb.Boxed() || os.Geteuid() != 0 {
		t.Skip("needs the box and root")
	}
	t.Cleanup(sb.CloseBoxes)
	host := sandboxtest.ListenHost(t, "hello-from-host")
	dir := t.TempDir()
	script := `
import socket, errno
def tcp(addr, fam=socket.AF_INET):
    s = socket.socket(fam, socket.SOCK_STREAM); s.settimeout(10)
    try:
        s.connect(addr); print("tcp", addr[0], s.recv(100).decode().strip())
    except OSError as e:
        print("tcp", addr[0], errno.errorcode.get(e.errno, e))
def udp(addr):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(10)
    try:
        s.sendto(b"q", addr); print("udp", addr[1], s.recv(100).decode())
    except OSError as e:
        print("udp", addr[1], errno.errorcode.get(e.errno, e))
tcp(("203.0.113.10", 443))
tcp(("169.254.169.254", 80))
tcp(("127.0.0.1", HOSTPORT))
udp(("203.0.113.10", 53))
udp(("203.0.113.10", 443))
try:
    socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP); print("raw socket made")
except OSError as e:
    print("raw", errno.errorcode.get(e.errno, e))
print(open("/etc/resolv.conf").read().split()[1])
`
	script = strings.Replace(script, "HOSTPORT", fmt.Sprint(host.Port), 1)
	var out bytes.Buffer
	spec := &Spec{Args: []string{"python3", "-c", script}, Dir: dir, Session: "inet", UID: 2_500_100, Network: NetworkInternet, Stdout: &out, Stderr: &out}
	exit, err := sb.Run(testCtx(t), spec)
	if err != nil || exit.Code != 0 {
		t.Fatalf("run: %v %+v\n%s", err, exit, out.String())
	}
	for _, want := range []string{
		"tcp 203.0.113.10 dst=203.0.113.10:443",
		"tcp 169.254.169.254 dst=169.254.169.254:80", // the egress decides: it sees it
		"tcp 127.0.0.1 ECONNREFUSED",                 // the box's own loopback
		"udp 53 dns",
		"udp 443 EPERM",
		"raw EPERM",
		"127.0.0.1",
	} {
		if !strings.Contains(out.String(), want+"\n") {
			t.Errorf("want %q in:\n%s", want, out.String())
		}
	}
	if n := host.Accepted.Load(); n != 0 {
		t.Errorf("the host's loopback listener saw %d connections", n)
	}
	// The box's root (all capabilities in its own user namespace) cannot
	// change the namespace the server made.
	out.Reset()
	root := &Spec{Args: []string{"sh", "-c", "unshare --user --map-root-user --net=/proc/self/ns/net true 2>&1; " +
		"unshare --user --map-root-user sh -c 'echo 0 > /proc/sys/net/ipv4/ip_unprivileged_port_start' 2>&1 || echo sysctl refused"},
		Dir: dir, Session: "inet", UID: 2_500_100, Network: NetworkInternet, Stdout: &out, Stderr: &out}
	if _, err := sb.Run(testCtx(t), root); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "sysctl refused") {
		t.Errorf("the box's root changed its namespace's sysctl:\n%s", out.String())
	}
	eg.mu.Lock()
	attached, open := eg.attached["inet"], eg.open
	eg.mu.Unlock()
	if attached != 1 || open != 1 {
		t.Errorf("egress attached %d times for the session, %d open: want one box, one egress", attached, open)
	}
	sb.CloseBoxes()
	eg.mu.Lock()
	defer eg.mu.Unlock()
	if eg.open != 0 {
		t.Errorf("%d egress attachments still open after the box closed", eg.open)
	}
}

// TestNetnsNoneHasLoopbackOnly: under "none" the namespace the server made
// has loopback up and no route: a connection off it fails at once.
func TestNetnsNoneHasLoopbackOnly(t *testing.T) {
	sb := newBoxSandbox(t)
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	var out bytes.Buffer
	script := `
import socket, errno
srv = socket.socket(); srv.bind(("127.0.0.1", 0)); srv.listen()
c = socket.create_connection(srv.getsockname(), timeout=10); print("loopback ok")
for addr in [("203.0.113.10", 443), ("::1", 1)]:
    fam = socket.AF_INET6 if ":" in addr[0] else socket.AF_INET
    s = socket.socket(fam)
    try:
        s.connect(addr); print("connected", addr[0])
    except OSError as e:
        print(addr[0], errno.errorcode.get(e.errno, e))
`
	spec := &Spec{Args: []string{"python3", "-c", script}, Dir: t.TempDir(), Session: "none1", UID: 2_500_101, Stdout: &out, Stderr: &out}
	if exit, err := sb.Run(testCtx(t), spec); err != nil || exit.Code != 0 {
		t.Fatalf("run: %v %+v\n%s", err, exit, out.String())
	}
	for _, want := range []string{"loopback ok", "203.0.113.10 ENETUNREACH", "::1 ECONNREFUSED"} {
		if !strings.Contains(out.String(), want+"\n") {
			t.Errorf("want %q in:\n%s", want, out.String())
		}
	}
}

// TestSpecEgressServesItsBoxAlone: a box of its own under internet with
// Spec.Egress is served by that egress, not the sandbox's (which sees no
// attach); a Spec.Egress under another network, or on a session's box,
// is refused before anything starts.
func TestSpecEgressServesItsBoxAlone(t *testing.T) {
	shared := &echoEgress{attached: map[string]int{}}
	sb, err := New(&Options{SessionBoxes: true, Egress: shared})
	if err != nil {
		t.Fatal(err)
	}
	if !sb.Boxed() || os.Geteuid() != 0 {
		t.Skip("needs the box and root")
	}
	t.Cleanup(sb.CloseBoxes)
	own := &echoEgress{attached: map[string]int{}}
	var out bytes.Buffer
	script := `import socket
s = socket.create_connection(("203.0.113.10", 443), timeout=10); print(s.recv(100).decode().strip())`
	exit, err := sb.Run(testCtx(t), &Spec{Args: []string{"python3", "-c", script}, Dir: t.TempDir(), Network: NetworkInternet, Egress: own, Stdout: &out, Stderr: &out})
	if err != nil || exit.Code != 0 || !strings.Contains(out.String(), "dst=203.0.113.10:443") {
		t.Fatalf("a run with its own egress: %v %+v %q", err, exit, out.String())
	}
	own.mu.Lock()
	ownAttached, ownOpen := len(own.attached), own.open
	own.mu.Unlock()
	shared.mu.Lock()
	sharedAttached := len(shared.attached)
	shared.mu.Unlock()
	if ownAttached != 1 || ownOpen != 0 || sharedAttached != 0 {
		t.Fatalf("the run's egress attached %d (open %d), the sandbox's %d", ownAttached, ownOpen, sharedAttached)
	}
	for _, spec := range []*Spec{
		{Args: []string{"true"}, Dir: t.TempDir(), Network: NetworkNone, Egress: own},
		{Args: []string{"true"}, Dir: t.TempDir(), Network: NetworkInternet, Session: "s", UID: 2_500_101, Egress: own},
	} {
		if _, err := sb.Run(testCtx(t), spec); !errors.Is(err, ErrInvalidSpec) {
			t.Errorf("network %s, session %q: %v, want ErrInvalidSpec", spec.Network, spec.Session, err)
		}
	}
}
