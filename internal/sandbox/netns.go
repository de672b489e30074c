package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"runtime"
	"syscall"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// A box's own network namespace, made by the server (not by bubblewrap
// inside the box's user namespace): it belongs to the server's user
// namespace, so the box's root, whose capabilities hold only in the box's
// own user namespace, can change none of its links, addresses, routes or
// firewall rules, nor bind its ports below 1024.
//
// Under NetworkNone it has loopback only, and nothing else: a connection
// to any other address fails at once (no route). Under NetworkEgress it
// also has a default route into loopback, from the box's own address
// (BoxAddr4, BoxAddr6, both on lo), and nftables rules of its own:
//
//	TCP to an address not on loopback    redirected to EgressPort on lo
//	UDP to port 53 not on loopback       redirected to DNSPort on lo
//	anything else not on loopback        dropped (sendto: EPERM)
//
// The server opens its egress listener and its DNS sockets inside the
// namespace (Netns.Listen, Netns.ListenPacket): the only way bytes leave
// the namespace is a socket the server holds. There is no interface out,
// no veth, no rule in the host's own firewall.
const (
	EgressPort = 1  // the egress proxy's TCP port on the box's loopback
	DNSPort    = 53 // the box's DNS (UDP and TCP) on 127.0.0.1
)

// The box's own addresses under NetworkEgress (documentation ranges: the
// same in every box, each in its own namespace). The egress refuses them
// as destinations.
var (
	BoxAddr4 = net.IPv4(192, 0, 2, 2).To4()
	BoxAddr6 = net.ParseIP("2001:db8::2")
)

// Netns is a network namespace the server made for a box.
type Netns struct {
	f      *os.File
	egress bool
}

// NewNetns makes a network namespace with loopback up and, with egress,
// the box's address, default routes and redirect rules described above.
func NewNetns(egress bool) (*Netns, error) {
	var ns *Netns
	err := onLockedThread(func() error {
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			return fmt.Errorf("network namespace: %w", err)
		}
		f, err := os.Open(fmt.Sprintf("/proc/%d/task/%d/ns/net", os.Getpid(), unix.Gettid()))
		if err != nil {
			return fmt.Errorf("network namespace: %w", err)
		}
		ns = &Netns{f: f, egress: egress}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if err := ns.setUp(); err != nil {
		ns.Close()
		return nil, err
	}
	return ns, nil
}

// onLockedThread runs fn on an OS thread of its own that starts in the
// server's network namespace and is put back there afterwards; a thread
// that could not go back is never handed to another goroutine (it exits
// with this one, Go's rule for a locked thread whose goroutine ends).
func onLockedThread(fn func() error) error {
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		home, err := os.Open(fmt.Sprintf("/proc/%d/task/%d/ns/net", os.Getpid(), unix.Gettid()))
		if err != nil {
			runtime.UnlockOSThread()
			done <- fmt.Errorf("network namespace: %w", err)
			return
		}
		defer home.Close()
		err = fn()
		if unix.Setns(int(home.Fd()), unix.CLONE_NEWNET) != nil {
			// Stay locked: the thread ends with this goroutine.
			if err == nil {
				err = errors.New("network namespace: the thread could not go back to the server's")
			}
			done <- err
			return
		}
		runtime.UnlockOSThread()
		done <- err
	}()
	return <-done
}

// Do runs fn on a thread inside n: sockets fn makes belong to n and work
// from any thread afterwards.
func (n *Netns) Do(fn func() error) error {
	return onLockedThread(func() error {
		if err := unix.Setns(int(n.f.Fd()), unix.CLONE_NEWNET); err != nil {
			return fmt.Errorf("network namespace: %w", err)
		}
		return fn()
	})
}

// Listen is net.Listen inside n.
func (n *Netns) Listen(network, addr string) (ln net.Listener, err error) {
	err = n.Do(func() error {
		ln, err = net.Listen(network, addr)
		return err
	})
	return ln, err
}

// ListenPacket is net.ListenPacket inside n.
func (n *Netns) ListenPacket(network, addr string) (pc net.PacketConn, err error) {
	err = n.Do(func() error {
		pc, err = net.ListenPacket(network, addr)
		return err
	})
	return pc, err
}

// Close lets the namespace go once no process is left in it (the kernel
// frees it; the box's processes die with the box).
func (n *Netns) Close() error {
	if n == nil || n.f == nil {
		return nil
	}
	err := n.f.Close()
	n.f = nil
	return err
}

// fd is the namespace's descriptor, for setns on a starting thread.
func (n *Netns) fd() int { return int(n.f.Fd()) }

// setUp configures n over netlink from the server's own namespace (a
// handle bound to n), and its nftables rules the same way.
func (n *Netns) setUp() error {
	h, lo, err := n.loopback()
	if err != nil {
		return err
	}
	defer h.Close()
	if err := h.LinkSetUp(lo); err != nil {
		return fmt.Errorf("network namespace: loopback up: %w", err)
	}
	if !n.egress {
		return nil
	}
	for _, a := range []*netlink.Addr{
		{IPNet: &net.IPNet{IP: BoxAddr4, Mask: net.CIDRMask(32, 32)}},
		// No duplicate address detection: the address is usable at once.
		{IPNet: &net.IPNet{IP: BoxAddr6, Mask: net.CIDRMask(128, 128)}, Flags: unix.IFA_F_NODAD},
	} {
		if err := h.AddrAdd(lo, a); err != nil {
			return fmt.Errorf("network namespace: address %s: %w", a.IP, err)
		}
	}
	if err := n.rules(); err != nil {
		return err
	}
	return n.routesWith(h, lo, true)
}

// routes adds or deletes n's default routes.
func (n *Netns) routes(add bool) error {
	h, lo, err := n.loopback()
	if err != nil {
		return err
	}
	defer h.Close()
	return n.routesWith(h, lo, add)
}

// loopback is a netlink handle bound to n (the caller closes it) and n's
// loopback link.
func (n *Netns) loopback() (*netlink.Handle, netlink.Link, error) {
	h, err := netlink.NewHandleAt(netns.NsHandle(n.fd()))
	if err != nil {
		return nil, nil, fmt.Errorf("network namespace: %w", err)
	}
	lo, err := h.LinkByName("lo")
	if err != nil {
		h.Close()
		return nil, nil, fmt.Errorf("network namespace: loopback: %w", err)
	}
	return h, lo, nil
}

// routesWith adds (or deletes) the default routes into loopback: a
// connection to any address leaves through lo, from the box's address
// (without a source, replies would go to 0.0.0.0), and the rules
// redirect it. The rules go in first: no connection leaves before them.
func (n *Netns) routesWith(h *netlink.Handle, lo netlink.Link, add bool) error {
	for _, r := range []struct {
		dst *net.IPNet
		src net.IP
	}{
		{&net.IPNet{IP: net.IPv4zero.To4(), Mask: net.CIDRMask(0, 32)}, BoxAddr4},
		{&net.IPNet{IP: net.IPv6zero, Mask: net.CIDRMask(0, 128)}, BoxAddr6},
	} {
		route := &netlink.Route{LinkIndex: lo.Attrs().Index, Scope: netlink.SCOPE_LINK, Dst: r.dst, Src: r.src}
		var err error
		if add {
			err = h.RouteReplace(route)
		} else if err = h.RouteDel(route); errors.Is(err, unix.ESRCH) {
			err = nil
		}
		if err != nil {
			return fmt.Errorf("network namespace: route %s: %w", r.dst, err)
		}
	}
	return nil
}

// rules installs the redirect and drop rules, one table per family.
func (n *Netns) rules() error {
	c, err := nftables.New(nftables.WithNetNSFd(n.fd()))
	if err != nil {
		return fmt.Errorf("network namespace: nftables: %w", err)
	}
	defer func() { _ = c.CloseLasting() }()
	for _, fam := range []struct {
		family nftables.TableFamily
		// daddr's offset and length in the network header; loopback is
		// the destination prefix (127/8 or ::1/128) the rules leave alone.
		off, size  uint32
		mask, loop []byte
	}{
		{nftables.TableFamilyIPv4, 16, 4, []byte{255, 0, 0, 0}, []byte{127, 0, 0, 0}},
		{nftables.TableFamilyIPv6, 24, 16, bytesOf(16, 0xff), append(make([]byte, 15), 1)},
	} {
		daddr := func(op expr.CmpOp) []expr.Any {
			return []expr.Any{
				&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: fam.off, Len: fam.size},
				&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: fam.size, Mask: fam.mask, Xor: make([]byte, fam.size)},
				&expr.Cmp{Op: op, Register: 1, Data: fam.loop},
			}
		}
		l4 := func(proto byte) []expr.Any {
			return []expr.Any{
				&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
				&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{proto}},
			}
		}
		redirect := func(port uint16) []expr.Any {
			return []expr.Any{
				&expr.Immediate{Register: 1, Data: binaryutil.BigEndian.PutUint16(port)},
				&expr.Redir{RegisterProtoMin: 1},
			}
		}
		t := c.AddTable(&nftables.Table{Family: fam.family, Name: "quro"})
		nat := c.AddChain(&nftables.Chain{Name: "out_nat", Table: t, Type: nftables.ChainTypeNAT,
			Hooknum: nftables.ChainHookOutput, Priority: nftables.ChainPriorityNATDest})
		c.AddRule(&nftables.Rule{Table: t, Chain: nat, Exprs: cat(l4(unix.IPPROTO_TCP), daddr(expr.CmpOpNeq), redirect(EgressPort))})
		c.AddRule(&nftables.Rule{Table: t, Chain: nat, Exprs: cat(l4(unix.IPPROTO_UDP), daddr(expr.CmpOpNeq),
			[]expr.Any{
				&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
				&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.BigEndian.PutUint16(53)},
			}, redirect(DNSPort))})
		drop := nftables.ChainPolicyDrop
		filt := c.AddChain(&nftables.Chain{Name: "out_filter", Table: t, Type: nftables.ChainTypeFilter,
			Hooknum: nftables.ChainHookOutput, Priority: nftables.ChainPriorityFilter, Policy: &drop})
		// Replies of connections the rules let through (the egress
		// listener's, whose source NAT turns back into the box's original
		// destination), what the redirect rules sent to loopback, and
		// loopback itself pass (the NAT hook ran first); everything else
		// is dropped.
		c.AddRule(&nftables.Rule{Table: t, Chain: filt, Exprs: []expr.Any{
			&expr.Ct{Register: 1, Key: expr.CtKeySTATE},
			&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
				Mask: binaryutil.NativeEndian.PutUint32(expr.CtStateBitESTABLISHED | expr.CtStateBitRELATED), Xor: make([]byte, 4)},
			&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: make([]byte, 4)},
			&expr.Verdict{Kind: expr.VerdictAccept},
		}})
		c.AddRule(&nftables.Rule{Table: t, Chain: filt, Exprs: cat(daddr(expr.CmpOpEq), []expr.Any{&expr.Verdict{Kind: expr.VerdictAccept}})})
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("network namespace: nftables rules: %w", err)
	}
	return nil
}

func cat(parts ...[]expr.Any) []expr.Any {
	var all []expr.Any
	for _, p := range parts {
		all = append(all, p...)
	}
	return all
}

func bytesOf(n int, b byte) []byte {
	s := make([]byte, n)
	for i := range s {
		s[i] = b
	}
	return s
}

// enterThenBack runs fn on the calling thread, which must be locked,
// inside n, then puts the thread back in the namespace it was in. An error
// to go back is returned as fn's would be; the caller must then not unlock
// the thread.
func (n *Netns) enterThenBack(fn func() error) error {
	home, err := os.Open(fmt.Sprintf("/proc/%d/task/%d/ns/net", os.Getpid(), unix.Gettid()))
	if err != nil {
		return fmt.Errorf("network namespace: %w", err)
	}
	defer home.Close()
	if err := unix.Setns(n.fd(), unix.CLONE_NEWNET); err != nil {
		return fmt.Errorf("network namespace: %w", err)
	}
	err = fn()
	if unix.Setns(int(home.Fd()), unix.CLONE_NEWNET) != nil {
		return errors.Join(err, errNetnsStuck)
	}
	return err
}

var errNetnsStuck = errors.New("network namespace: the thread could not go back to the server's")

// boxNet is a box's network: its namespace and, under NetworkInternet,
// what serves its way out. The zero of a *boxNet (nil) is the host's.
type boxNet struct {
	ns     *Netns
	egress io.Closer
}

// openNet makes the network of a box of session under policy network:
// nil for the host's (or bubblewrap's), a namespace with loopback only for
// NetworkNone, and one served by the egress for NetworkInternet: eg, or
// else the sandbox's.
func (s *Sandbox) openNet(session, network string, eg Egress) (*boxNet, error) {
	if network == NetworkHost || network == NetworkNone && !s.layers.root {
		// A server not running as root cannot make a namespace of its
		// own: under none, bubblewrap makes it (in the box's user
		// namespace, loopback only), as for a box of its own.
		return nil, nil
	}
	ns, err := NewNetns(network == NetworkInternet)
	if err != nil {
		return nil, err
	}
	n := &boxNet{ns: ns}
	if network == NetworkInternet {
		if eg == nil {
			eg = s.egress
		}
		if n.egress, err = eg.Attach(session, ns); err != nil {
			ns.Close()
			return nil, fmt.Errorf("egress: %w", err)
		}
	}
	return n, nil
}

func (n *boxNet) namespace() *Netns {
	if n == nil {
		return nil
	}
	return n.ns
}

// close stops the egress and lets the namespace go: after the box's
// processes are gone.
func (n *boxNet) close() {
	if n == nil {
		return
	}
	if n.egress != nil {
		n.egress.Close()
		n.egress = nil
	}
	n.ns.Close()
}

// ErrNetworkNeedsNewBox is SetNetwork's refusal: a box with processes
// cannot move to or from the host's network (its namespace is
// bubblewrap's or the host's); a new box can.
var ErrNetworkNeedsNewBox = errors.New("the box's network namespace cannot change to or from the host's while the box runs")

// Network is the box's network policy now.
func (bx *Box) Network() string {
	bx.mu.Lock()
	defer bx.mu.Unlock()
	return bx.network
}

// SetNetwork changes the network policy of session key's box, if it has
// one, for its new connections: between NetworkNone and NetworkInternet
// the namespace the server made gains or loses its way out (the default
// routes, the egress's listeners); connections already made go on.
// Another change is ErrNetworkNeedsNewBox.
func (s *Sandbox) SetNetwork(key, network string) error {
	bx := s.Box(key)
	if bx == nil {
		return nil
	}
	bx.mu.Lock()
	defer bx.mu.Unlock()
	if bx.network == network || bx.closed {
		return nil
	}
	ns := bx.net.namespace()
	if ns == nil || network == NetworkHost || bx.network == NetworkHost {
		if len(bx.procs) == 0 {
			// Nothing runs in it: the next run makes a box of the new
			// shape (boxFor replaces an idle box that does not fit).
			return nil
		}
		return ErrNetworkNeedsNewBox
	}
	if network == NetworkInternet {
		if s.egress == nil {
			return fmt.Errorf("%w: network policy %q: this server has no egress", ErrInvalidSpec, NetworkInternet)
		}
		if err := ns.openWay(); err != nil {
			return err
		}
		c, err := s.egress.Attach(key, ns)
		if err != nil {
			_ = ns.closeWay()
			return fmt.Errorf("egress: %w", err)
		}
		bx.net.egress = c
	} else {
		if err := ns.closeWay(); err != nil {
			return err
		}
		if bx.net.egress != nil {
			bx.net.egress.Close()
			bx.net.egress = nil
		}
	}
	bx.network = network
	return nil
}

// openWay gives n its way out (NetworkInternet): the address, rules and
// routes the first time, the routes again after closeWay.
func (n *Netns) openWay() error {
	if !n.egress {
		n.egress = true
		return n.setUp()
	}
	return n.routes(true)
}

// closeWay takes n's default routes away: a new connection off loopback
// fails at once (no route), as under NetworkNone.
func (n *Netns) closeWay() error { return n.routes(false) }

// ErrNoBoxNamespace is DialBox's refusal of a box that has no network
// namespace of the server's (network host, or a server not running as
// root): its 127.0.0.1 is the host's (or one the server cannot enter).
var ErrNoBoxNamespace = errors.New("the session's box has no network namespace of the server's (network host, or a server not running as root): its ports cannot be reached through the server")

// DialBox connects to 127.0.0.1:port inside the network namespace of
// session's box: the socket is made on a thread in the namespace, then
// connected from any thread. A session with no box (it runs nothing), a
// box in the host's network, the egress's port and the DNS port are
// refused: nothing dials the host's own loopback.
func (s *Sandbox) DialBox(ctx context.Context, session string, port int) (net.Conn, error) {
	if port < 1 || port > 65535 {
		return nil, fmt.Errorf("%w: port %d: want 1 to 65535", ErrInvalidSpec, port)
	}
	if port == EgressPort || port == DNSPort {
		return nil, fmt.Errorf("%w: port %d is the server's own in the box (egress, DNS)", ErrInvalidSpec, port)
	}
	bx := s.Box(session)
	if bx == nil {
		return nil, fmt.Errorf("session %s has no box: it runs nothing (start a server in it first)", session)
	}
	bx.mu.Lock()
	ns, closed := bx.net.namespace(), bx.closed
	var fd int
	var err error
	if !closed && ns != nil {
		// Under bx.mu: the namespace is not closed while a socket is
		// made in it.
		err = ns.Do(func() error {
			var e error
			fd, e = unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, 0)
			return e
		})
	}
	bx.mu.Unlock()
	switch {
	case closed:
		return nil, fmt.Errorf("session %s has no box: it runs nothing (start a server in it first)", session)
	case ns == nil:
		return nil, ErrNoBoxNamespace
	case err != nil:
		return nil, fmt.Errorf("socket in the box's network namespace: %w", err)
	}
	f := os.NewFile(uintptr(fd), "box-socket")
	defer f.Close()
	rc, err := f.SyscallConn()
	if err != nil {
		return nil, err
	}
	// Connect the non-blocking socket, then wait for it through a
	// net.Conn (FileConn dups the descriptor into the runtime's poller).
	var cerr error
	if err := rc.Control(func(fd uintptr) {
		cerr = unix.Connect(int(fd), &unix.SockaddrInet4{Port: port, Addr: [4]byte{127, 0, 0, 1}})
	}); err != nil {
		return nil, err
	}
	if cerr != nil && !errors.Is(cerr, unix.EINPROGRESS) {
		return nil, fmt.Errorf("dial 127.0.0.1:%d in the box: %w", port, cerr)
	}
	c, err := net.FileConn(f)
	if err != nil {
		return nil, err
	}
	if err := waitConnected(ctx, c); err != nil {
		c.Close()
		return nil, fmt.Errorf("dial 127.0.0.1:%d in the box: %w", port, err)
	}
	return c, nil
}

// waitConnected waits for c's non-blocking connect to finish (writable),
// then reports its outcome (SO_ERROR).
func waitConnected(ctx context.Context, c net.Conn) error {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return errors.New("not a socket")
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return err
	}
	if dl, ok := ctx.Deadline(); ok {
		_ = c.SetWriteDeadline(dl)
		defer func() { _ = c.SetWriteDeadline(time.Time{}) }()
	}
	stop := context.AfterFunc(ctx, func() { _ = c.SetWriteDeadline(time.Unix(1, 0)) })
	defer stop()
	var soErr error
	werr := rc.Write(func(fd uintptr) bool {
		n, err := unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_ERROR)
		if err != nil {
			soErr = err
			return true
		}
		if n == 0 {
			// Connected, or still in progress: poll says which.
			var pfd = []unix.PollFd{{Fd: int32(fd), Events: unix.POLLOUT}}
			if k, _ := unix.Poll(pfd, 0); k == 0 {
				return false
			}
			return true
		}
		soErr = syscall.Errno(n)
		return true
	})
	if werr != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return werr
	}
	return soErr
}
