package app

import (
	"strings"
	"testing"

	"github.com/quro-dev/quro/internal/capability"
	"github.com/quro-dev/quro/internal/controller"
	"github.com/quro-dev/quro/internal/runcode"
)

// portServer listens on 0.0.0.0:8123 and [::1]:8124, says so through the
// fifo ready, closes both when stop is written and says so through closed.
const portServer = `import socket
a = socket.socket(); a.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); a.bind(('0.0.0.0', 8123)); a.listen()
b = socket.socket(socket.AF_INET6); b.bind(('::1', 8124)); b.listen()
open('ready', 'w').write('up\n')
open('stop').read()
a.close(); b.close()
open('closed', 'w').write('closed\n')
`

// TestListPorts: a port a session's code listens on in its box is listed
// (v4 and v6, with its address) for the session's tenant; another session
// of the tenant and another tenant's session do not list it, the other
// tenant cannot name the session, code in another session cannot ask, a
// host session is refused, and a closed socket leaves the list.
func TestListPorts(t *testing.T) {
	t.Parallel()
	a := newApp(t, nil)
	needBoxes(t, a)
	as := func(tenant string) controller.Caller {
		c, _ := callerOfToken(t, a, tenant, "read", "exec")
		return c
	}
	alice, bob := as("alice"), as("bob")
	bash := func(c controller.Caller, id, code, want string) {
		t.Helper()
		reply, err := callAs(t, a, c, "run_code", RunCodeInput{Session: id, Lang: "bash", Code: code})
		if err != nil || reply.Output.(*runcode.Result).ExitCode != 0 || !strings.Contains(reply.Output.(*runcode.Result).Stdout, want) {
			t.Fatalf("%s: %v %+v", code, err, reply)
		}
	}
	ports := func(c controller.Caller, id string) string {
		t.Helper()
		p := mustCallAs(t, a, c, "list_ports", ListPortsInput{Session: id}).(*Ports)
		return p.Text()
	}

	s := mustCallAs(t, a, alice, "create_session", CreateSessionInput{Name: "web", Network: "none"}).(*SessionInfo)
	other := mustCallAs(t, a, alice, "create_session", CreateSessionInput{Name: "other", Network: "none"}).(*SessionInfo)
	theirs := mustCallAs(t, a, bob, "create_session", CreateSessionInput{Name: "theirs", Network: "none"}).(*SessionInfo)
	if got := ports(alice, s.ID); got != "no TCP port listens in the session" {
		t.Errorf("a session with no box: %q", got)
	}
	bash(alice, s.ID, "mkfifo ready stop closed && echo made", "made")
	mustCallAs(t, a, alice, "start_process", StartProcessInput{Session: s.ID, Cmd: "python3", Args: []string{"-c", portServer}, Background: true})
	bash(alice, s.ID, "read up < ready && echo $up", "up")
	bash(alice, other.ID, "echo boxed", "boxed")
	bash(bob, theirs.ID, "echo boxed", "boxed")

	if got := ports(alice, s.ID); got != "8123 (0.0.0.0), 8124 (::1)" {
		t.Errorf("the session's ports: %q", got)
	}
	if got := ports(alice, other.ID); strings.Contains(got, "8123") {
		t.Errorf("another session of the tenant lists %q", got)
	}
	if got := ports(bob, theirs.ID); strings.Contains(got, "8123") {
		t.Errorf("another tenant's session lists %q", got)
	}
	if _, err := callAs(t, a, bob, "list_ports", ListPortsInput{Session: s.ID}); err == nil {
		t.Error("another tenant listed the session's ports")
	}
	if _, err := callAs(t, a, controller.Caller{Path: "test", Tenant: "alice", Scope: capability.ScopeExec, Session: other.ID},
		"list_ports", ListPortsInput{Session: s.ID}); err == nil {
		t.Error("code in another session listed this session's ports")
	}
	host := mustCallAs(t, a, alice, "create_session", CreateSessionInput{Name: "hosted", Network: "host"}).(*SessionInfo)
	if _, err := callAs(t, a, alice, "list_ports", ListPortsInput{Session: host.ID}); err == nil || !strings.Contains(err.Error(), "network host") {
		t.Errorf("a host session's ports: %v", err)
	}

	bash(alice, s.ID, "echo go > stop && read c < closed && echo $c", "closed")
	if got := ports(alice, s.ID); got != "no TCP port listens in the session" {
		t.Errorf("after the sockets closed: %q", got)
	}
}

// TestListPortsLeavesTheServersSockets: in an internet session's box the
// server's own egress (port 1) and DNS (53) listen in the same network
// namespace — the box's code sees them in its /proc/net/tcp — but they are
// root's, not the session's, and list_ports leaves them out.
func TestListPortsLeavesTheServersSockets(t *testing.T) {
	t.Parallel()
	st := newStandIn(t)
	a := netApp(t, st, NetworkOptions{})
	s := mustCall(t, a, "create_session", CreateSessionInput{Name: "out", Network: "internet"}).(*SessionInfo)
	// The egress's listener, 127.0.0.1:1 (0100007F:0001), in LISTEN (0A).
	reply := mustCall(t, a, "run_code", RunCodeInput{Session: s.ID, Lang: "bash", Code: "grep -c ':0001 00000000:0000 0A' /proc/net/tcp"}).(*runcode.Result)
	if strings.TrimSpace(reply.Stdout) == "0" || reply.ExitCode != 0 {
		t.Fatalf("the box does not see the egress's listener: %+v", reply)
	}
	p := mustCall(t, a, "list_ports", ListPortsInput{Session: s.ID}).(*Ports)
	if len(p.Ports) != 0 {
		t.Errorf("list_ports lists the server's sockets: %s", p.Text())
	}
}
