package app

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quro-dev/quro/internal/capability"
	"github.com/quro-dev/quro/internal/controller"
	"github.com/quro-dev/quro/internal/egress"
	"github.com/quro-dev/quro/internal/metrics/metricstest"
	"github.com/quro-dev/quro/internal/sandbox"
	"github.com/quro-dev/quro/internal/store"
)

// standIn is an HTTP server on the host's loopback that the egress
// resolves test names to, as an operator's resolver would resolve real
// ones: allowed.test is the operator's listed exception (its host:port),
// rebind.test is a name whose resolution lands on loopback without being
// listed (DNS rebinding), private.test one on a private address.
type standIn struct {
	srv   *httptest.Server
	port  int
	hits  atomic.Int64
	names sync.Map // more names that resolve to the stand-in (also)
}

// also makes name resolve to the stand-in too.
func (s *standIn) also(name string) { s.names.Store(name, true) }

func newStandIn(t *testing.T) *standIn {
	t.Helper()
	s := &standIn{}
	repo := gitRepo(t)
	files := http.StripPrefix("/repo.git/", http.FileServer(http.Dir(repo)))
	s.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.URL.Path, "/repo.git/") {
			files.ServeHTTP(w, r)
			return
		}
		s.hits.Add(1)
		fmt.Fprintf(w, "hello-from-%s", strings.Split(r.Host, ":")[0])
	}))
	t.Cleanup(s.srv.Close)
	s.port = s.srv.Listener.Addr().(*net.TCPAddr).Port
	return s
}

func (s *standIn) resolve(_ context.Context, host string) ([]netip.Addr, error) {
	if _, ok := s.names.Load(host); ok {
		return []netip.Addr{netip.MustParseAddr("127.0.0.1")}, nil
	}
	switch host {
	case "allowed.test", "rebind.test":
		return []netip.Addr{netip.MustParseAddr("127.0.0.1")}, nil
	case "private.test":
		return []netip.Addr{netip.MustParseAddr("10.255.0.1")}, nil
	}
	return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
}

func netApp(t *testing.T, st *standIn, o NetworkOptions) *App {
	t.Helper()
	o.Trusted = append(o.Trusted, fmt.Sprintf("allowed.test:%d", st.port))
	o.Resolve = st.resolve
	a, err := New(context.Background(), t.TempDir(), &Options{Python: testPython, Network: o})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	needBoxes(t, a)
	return a
}

// TestSessionInternetThroughTheEgress: a session with network internet
// reaches, by name, what the egress allows, from curl, Python and bash
// alike, and nothing of the host: its own loopback is not the host's, a
// name that resolves to loopback, a private or the metadata address, an
// address literal of the host's network are all refused with the reason
// in the egress log; UDP other than DNS does not leave.
func TestSessionInternetThroughTheEgress(t *testing.T) {
	t.Parallel()
	st := newStandIn(t)
	a := netApp(t, st, NetworkOptions{})
	s := newSession(t, a, "inet", "internet")
	url := fmt.Sprintf("http://allowed.test:%d/", st.port)
	for _, run := range []struct{ lang, code string }{
		{"bash", "curl -sS --max-time 20 " + url},
		{"python", "import urllib.request\nprint(urllib.request.urlopen('" + url + "', timeout=20).read().decode())"},
		{"bash", fmt.Sprintf("exec 3<>/dev/tcp/allowed.test/%d && printf 'GET / HTTP/1.0\\r\\nHost: allowed.test\\r\\n\\r\\n' >&3 && cat <&3", st.port)},
		// JS runs in the server: its fetch dials through the egress too.
		{"js", "const r = await fetch('" + url + "'); console.log(await r.text())"},
		{"bash", "node -e \"fetch('" + url + "').then(r => r.text()).then(console.log)\""},
		{"bash", "wget -qO- " + url},
	} {
		res := runCode(t, a, RunCodeInput{Session: s.ID, Lang: run.lang, Code: run.code})
		if !strings.Contains(res.Stdout, "hello-from-allowed.test") {
			t.Errorf("%s did not reach the allowed stand-in: %+v", run.lang, res)
		}
	}
	// git clones over (dumb) HTTP from the stand-in's repository.
	res := runCode(t, a, RunCodeInput{Session: s.ID, Lang: "bash", Code: fmt.Sprintf("git clone -q http://allowed.test:%d/repo.git r 2>&1 && cat r/README", st.port)})
	if !strings.Contains(res.Stdout, "hello-from-the-repo") {
		t.Errorf("git clone through the egress: %+v", res)
	}
	before := st.hits.Load()
	for _, target := range []string{
		fmt.Sprintf("http://rebind.test:%d/", st.port), // resolves to loopback, not listed
		fmt.Sprintf("http://127.0.0.1:%d/", st.port),   // the box's own loopback: nothing listens
		"http://private.test/",                         // resolves to a private address
		"http://169.254.169.254/latest/meta-data/",     // the metadata service
		"http://10.255.0.1:8080/",                      // a private literal
		fmt.Sprintf("http://[::1]:%d/", st.port),       // the box's own IPv6 loopback
		"http://[fd00:ec2::254]/",                      // the metadata service over IPv6
		fmt.Sprintf("http://192.0.2.2:%d/", st.port),   // the box's own address
	} {
		res := runCode(t, a, RunCodeInput{Session: s.ID, Lang: "bash", Code: "curl -sS --max-time 20 " + target + "; echo rc=$?"})
		if strings.Contains(res.Stdout, "hello-from") || strings.Contains(res.Stdout, "rc=0") {
			t.Errorf("%s was reached: %+v", target, res)
		}
	}
	for _, target := range []string{fmt.Sprintf("http://rebind.test:%d/", st.port), fmt.Sprintf("http://127.0.0.1:%d/", st.port), "http://169.254.169.254/"} {
		res := runCode(t, a, RunCodeInput{Session: s.ID, Lang: "js", Code: "try { const r = await fetch('" + target + "'); console.log('reached', await r.text()) } catch (e) { console.log('refused', String(e)) }"})
		if !strings.Contains(res.Stdout, "refused") || !strings.Contains(res.Stdout, "network policy refused") {
			t.Errorf("JS fetch of %s: %+v", target, res)
		}
	}
	if n := st.hits.Load() - before; n != 0 {
		t.Errorf("the stand-in saw %d requests that the egress should have refused", n)
	}
	// A run that failed on a refused connection says which, and why.
	res = runCode(t, a, RunCodeInput{Session: s.ID, Lang: "python", Code: fmt.Sprintf("import urllib.request\nurllib.request.urlopen('http://rebind.test:%d/', timeout=20)", st.port)})
	if res.ExitCode == 0 || !strings.Contains(strings.Join(res.Notes, "\n"), fmt.Sprintf("rebind.test:%d (resolves to a loopback address)", st.port)) {
		t.Errorf("a run refused by the egress: %+v", res)
	}
	// UDP other than DNS is dropped in the box's namespace.
	res = runCode(t, a, RunCodeInput{Session: s.ID, Lang: "python", Code: "import socket\ns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\ntry:\n s.sendto(b'x', ('203.0.113.7', 443)); print('sent')\nexcept OSError as e: print('udp', e.errno)"})
	if !strings.Contains(res.Stdout, "udp 1") { // EPERM
		t.Errorf("UDP to 443 left the box: %+v", res)
	}
	// /metrics counts the decisions.
	if f := metricstest.Scrape(t, a.Metrics.Handler()); f.Sum("quro_egress_connections_total", "decision", "denied") == 0 ||
		f.Sum("quro_egress_connections_total", "decision", "allowed") == 0 || f.Sum("quro_egress_bytes_total", "direction", "in") == 0 {
		t.Error("the egress's metrics counted nothing")
	}
	// The log names each decision and why.
	log := a.egress.events.list(s.ID)
	want := map[string]string{
		fmt.Sprintf("allowed.test:%d", st.port): egress.Allowed,
		fmt.Sprintf("rebind.test:%d", st.port):  egress.Denied,
		"private.test:80":                       egress.Denied,
		"169.254.169.254:80":                    egress.Denied,
	}
	for dest, decision := range want {
		found := false
		for _, ev := range log {
			if ev.Dest == dest && ev.Decision == decision {
				found = true
			}
		}
		if !found {
			t.Errorf("no %s decision for %s in the egress log: %+v", decision, dest, log)
		}
	}
}

// TestNetworkPolicyBounds: "full" is read as "internet" with a note; the
// operator's maximum refuses "host" by default, and a lower maximum
// refuses "internet"; a default above the maximum does not start.
func TestNetworkPolicyBounds(t *testing.T) {
	t.Parallel()
	a, err := New(context.Background(), t.TempDir(), &Options{Python: testPython})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	full := mustCall(t, a, "create_session", CreateSessionInput{Name: "legacy", Network: "full"}).(*SessionInfo)
	if full.Network != sandbox.NetworkInternet || !strings.Contains(full.Note, "deprecated") {
		t.Errorf("full: network %q note %q", full.Network, full.Note)
	}
	if _, err := call(t, a, "create_session", CreateSessionInput{Name: "h", Network: "host"}); err == nil || !strings.Contains(err.Error(), "--network-max") {
		t.Errorf("host under the default maximum: %v", err)
	}
	if _, err := call(t, a, "create_session", CreateSessionInput{Name: "x", Network: "everything"}); err == nil || !strings.Contains(err.Error(), "none, internet or host") {
		t.Errorf("an unknown policy: %v", err)
	}
	def := mustCall(t, a, "create_session", CreateSessionInput{Name: "d"}).(*SessionInfo)
	if def.Network != sandbox.NetworkNone {
		t.Errorf("default network %q", def.Network)
	}
	b, err := New(context.Background(), t.TempDir(), &Options{Python: testPython, Network: NetworkOptions{Max: "none"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	if _, err := call(t, b, "create_session", CreateSessionInput{Name: "i", Network: "internet"}); err == nil {
		t.Error("internet under a maximum of none was made")
	}
	if _, err := New(context.Background(), t.TempDir(), &Options{Network: NetworkOptions{Default: "internet", Max: "none"}}); err == nil {
		t.Error("a default above the maximum started")
	}
	if _, err := New(context.Background(), t.TempDir(), &Options{Network: NetworkOptions{Trusted: []string{"10.0.0.1/8", "db.internal"}}}); err == nil || !strings.Contains(err.Error(), `"db.internal": want HOST:PORT or a CIDR`) {
		t.Errorf("an exception without a port: %v", err)
	}
}

// TestSessionNetworkRulesAndLiveChange: an internet session with
// allow_out reaches only what it names (by name; another name, an address
// literal and a Host other than the name are refused, and a failed run
// says the rules decided); set_session_network applies to the next
// connection (a deny rule, then none, then internet again, all in the same
// box), and code in the session cannot change it.
func TestSessionNetworkRulesAndLiveChange(t *testing.T) {
	t.Parallel()
	st := newStandIn(t)
	a := netApp(t, st, NetworkOptions{Trusted: []string{fmt.Sprintf("other.test:%d", st.port)}})
	st.also("other.test")
	s := mustCall(t, a, "create_session", CreateSessionInput{Name: "rules", Network: "internet", AllowOut: []string{"allowed.test"}}).(*SessionInfo)
	if s.NetworkRules == nil || !strings.Contains(s.Text(), "allow_out=allowed.test") {
		t.Errorf("rules not shown: %s", s.Text())
	}
	curl := func(host string, extra ...string) *runResult {
		t.Helper()
		res := runCode(t, a, RunCodeInput{Session: s.ID, Lang: "bash", Code: fmt.Sprintf("curl -sS --max-time 20 %s http://%s:%d/", strings.Join(extra, " "), host, st.port)})
		return &runResult{out: res.Stdout, notes: strings.Join(res.Notes, "\n"), code: res.ExitCode}
	}
	if r := curl("allowed.test"); !strings.Contains(r.out, "hello-from-allowed.test") {
		t.Errorf("allowed.test under its allow rule: %+v", r)
	}
	for _, c := range []struct {
		host  string
		extra []string
		note  string
	}{
		{"other.test", nil, "not in the allow list"},
		{"allowed.test", []string{"-H 'Host: other.test'"}, "Host"}, // fronting through an allowed name
		{"127.0.0.1", nil, ""},                                      // the box's own loopback: nothing there
	} {
		r := curl(c.host, c.extra...)
		if strings.Contains(r.out, "hello-from") || r.code == 0 || c.note != "" && !strings.Contains(r.notes, c.note) {
			t.Errorf("%s %v under allow_out allowed.test: %+v", c.host, c.extra, r)
		}
	}
	// A deny rule, live: the next connection is refused, another name
	// goes out.
	mustCall(t, a, "set_session_network", SetNetworkInput{Session: s.ID, DenyOut: []string{"allowed.test"}})
	if r := curl("allowed.test"); strings.Contains(r.out, "hello-from") {
		t.Errorf("allowed.test after deny_out: %+v", r)
	}
	if r := curl("other.test"); !strings.Contains(r.out, "hello-from-other.test") {
		t.Errorf("other.test with only a deny rule: %+v", r)
	}
	// none, then internet again, in the same box (its shell and Python
	// worker keep running).
	box := a.Sandbox.Box(s.ID)
	mustCall(t, a, "set_session_network", SetNetworkInput{Session: s.ID, Network: "none"})
	if r := curl("other.test"); strings.Contains(r.out, "hello-from") || r.code == 0 {
		t.Errorf("other.test under none: %+v", r)
	}
	mustCall(t, a, "set_session_network", SetNetworkInput{Session: s.ID, Network: "internet"})
	if r := curl("other.test"); !strings.Contains(r.out, "hello-from-other.test") {
		t.Errorf("other.test under internet again: %+v", r)
	}
	if a.Sandbox.Box(s.ID) != box {
		t.Error("the change of network made a new box")
	}
	inside := controller.Caller{Path: "insession", Scope: capability.ScopeExec, Session: s.ID}
	if _, err := callAs(t, a, inside, "set_session_network", SetNetworkInput{Network: "host"}); capCode(err) != capability.PermissionDenied {
		t.Errorf("code in the session changed its network: %v", err)
	}
	// Bad rules are refused, naming the rule.
	if _, err := call(t, a, "set_session_network", SetNetworkInput{Session: s.ID, AllowOut: []string{"exa mple.com"}}); capCode(err) != capability.InvalidArgument || !strings.Contains(err.Error(), "exa mple.com") {
		t.Errorf("a bad rule: %v", err)
	}
	log := mustCall(t, a, "get_egress_log", EgressLogInput{Session: s.ID, Decision: "denied"}).(*EgressLog)
	if !strings.Contains(log.Text(), "other.test") || strings.Contains(log.Text(), " allowed ") {
		t.Errorf("egress log of denied decisions:\n%s", log.Text())
	}
}

type runResult struct {
	out, notes string
	code       int
}

// gitRepo is a bare repository with one commit (README), ready for git's
// dumb HTTP protocol.
func gitRepo(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	work, bare := filepath.Join(dir, "work"), filepath.Join(dir, "repo.git")
	script := "set -e; git init -q " + work + " && cd " + work + " && echo hello-from-the-repo > README && git add README && " +
		"git -c user.name=t -c user.email=t@t commit -qm one && git clone -q --bare " + work + " " + bare + " && cd " + bare + " && git update-server-info"
	if out, err := exec.Command("sh", "-c", script).CombinedOutput(); err != nil {
		t.Fatalf("git repository: %v\n%s", err, out)
	}
	return bare
}

// TestEgressLogKeepsTheLatest: past egressKeep decisions a session's log
// drops its oldest and keeps the rest in order; a run's refusals are
// counted across the wrap.
func TestEgressLogKeepsTheLatest(t *testing.T) {
	l := newEgressLog(nil)
	mark := l.mark("s")
	for i := range egressKeep + 10 {
		l.add(egress.Event{Box: "s", Dest: fmt.Sprint("d", i), Decision: egress.Denied, Reason: "r"})
	}
	got := l.list("s")
	if len(got) != egressKeep || got[0].Dest != "d10" || got[len(got)-1].Dest != fmt.Sprint("d", egressKeep+9) {
		t.Fatalf("%d events, first %q last %q", len(got), got[0].Dest, got[len(got)-1].Dest)
	}
	for i := 1; i < len(got); i++ {
		if got[i].Dest != fmt.Sprint("d", i+10) {
			t.Fatalf("event %d is %q", i, got[i].Dest)
		}
	}
	if note := l.refusedSince("s", mark); !strings.Contains(note, fmt.Sprint("d", egressKeep+9)) {
		t.Errorf("note: %q", note)
	}
}

// TestTenantNetworkMax: the operator's per-tenant maximum (set_tenant_limits
// network_max) lowers the server's for that tenant alone: create_session,
// set_session_network and fork_session above it are refused with
// permission_denied naming the tenant's setting; a tenant maximum above the
// server's lifts nothing (the server's flag is named); another tenant keeps
// the server's maximum.
func TestTenantNetworkMax(t *testing.T) {
	t.Parallel()
	a, err := New(context.Background(), t.TempDir(), &Options{Python: testPython})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	acme := controller.Caller{Path: "test", Tenant: "acme", Scope: capability.ScopeExec}
	bob := controller.Caller{Path: "test", Tenant: "bob", Scope: capability.ScopeExec}
	// An internet session and its snapshot, made before the maximum.
	mustCallAs(t, a, acme, "create_session", CreateSessionInput{Name: "net", Network: "internet"})
	mustCallAs(t, a, acme, "snapshot_session", SnapshotInput{Session: "net", Name: "netsnap"})
	mustCallAs(t, a, acme, "create_session", CreateSessionInput{Name: "quiet"})

	if _, err := callAs(t, a, acme, "set_tenant_limits", SetTenantLimitsInput{Tenant: "acme", NetworkMax: "none"}); err == nil {
		t.Fatal("a tenant set its own network maximum")
	}
	info := mustCall(t, a, "set_tenant_limits", SetTenantLimitsInput{Tenant: "acme", NetworkMax: "none"}).(*TenantLimitsInfo)
	if info.Own.NetworkMax != "none" || info.Effective.NetworkMax != "none" || !strings.Contains(info.Text(), "network at most none") {
		t.Errorf("acme's limits: %+v %q", info, info.Text())
	}
	wantTenant := func(what string, err error) {
		t.Helper()
		var ce *capability.Error
		if !errors.As(err, &ce) || ce.Code != capability.PermissionDenied || !strings.Contains(err.Error(), "quro tenant limits set --tenant acme --network-max") {
			t.Errorf("%s above acme's maximum: %v", what, err)
		}
	}
	_, err = callAs(t, a, acme, "create_session", CreateSessionInput{Name: "i", Network: "internet"})
	wantTenant("create_session internet", err)
	_, err = callAs(t, a, acme, "create_session", CreateSessionInput{Name: "r", AllowOut: []string{"pypi.org"}})
	wantTenant("create_session with allow_out", err)
	_, err = callAs(t, a, acme, "set_session_network", SetNetworkInput{Session: "quiet", Network: "internet"})
	wantTenant("set_session_network internet", err)
	_, err = callAs(t, a, acme, "fork_session", ForkInput{Snapshot: "netsnap"})
	wantTenant("fork of an internet snapshot", err)
	if s := mustCallAs(t, a, acme, "create_session", CreateSessionInput{Name: "n"}).(*SessionInfo); s.Network != sandbox.NetworkNone {
		t.Errorf("acme's default session: %q", s.Network)
	}
	// Another tenant keeps the server's maximum.
	if s := mustCallAs(t, a, bob, "create_session", CreateSessionInput{Name: "i", Network: "internet"}).(*SessionInfo); s.Network != sandbox.NetworkInternet {
		t.Errorf("bob: %q", s.Network)
	}
	// A tenant maximum above the server's lifts nothing.
	info = mustCall(t, a, "set_tenant_limits", SetTenantLimitsInput{Tenant: "acme", NetworkMax: "host"}).(*TenantLimitsInfo)
	if info.Effective.NetworkMax != sandbox.NetworkInternet {
		t.Errorf("effective maximum under a server's internet: %q", info.Effective.NetworkMax)
	}
	if _, err := callAs(t, a, acme, "create_session", CreateSessionInput{Name: "h", Network: "host"}); err == nil || !strings.Contains(err.Error(), "quro serve --network-max") {
		t.Errorf("host with acme's host over the server's internet: %v", err)
	}
	mustCallAs(t, a, acme, "set_session_network", SetNetworkInput{Session: "quiet", Network: "internet"})
	if _, err := call(t, a, "set_tenant_limits", SetTenantLimitsInput{Tenant: "acme", NetworkMax: "full"}); err == nil || !strings.Contains(err.Error(), "none, internet or host") {
		t.Errorf("a network maximum that is no policy: %v", err)
	}
}

// TestEgressLogPersistsAndIsBounded: get_egress_log reads the decisions
// from the store, filtered by decision and since; a new server on the same
// data directory finds them; a committed batch is on disk for another
// opener (what a killed server leaves); the session's destroy deletes its
// rows, and a server starting deletes those of sessions that are gone.
func TestEgressLogPersistsAndIsBounded(t *testing.T) {
	t.Parallel()
	st := newStandIn(t)
	dir := t.TempDir()
	o := NetworkOptions{Trusted: []string{fmt.Sprintf("allowed.test:%d", st.port)}, Resolve: st.resolve}
	a, err := New(context.Background(), dir, &Options{Python: testPython, Network: o})
	if err != nil {
		t.Fatal(err)
	}
	needBoxes(t, a)
	s := mustCall(t, a, "create_session", CreateSessionInput{Name: "logged", Network: "internet"}).(*SessionInfo)
	curl := fmt.Sprintf("curl -sS --max-time 20 http://allowed.test:%d/; curl -sS --max-time 20 http://169.254.169.254/; true", st.port)
	if r := runCode(t, a, RunCodeInput{Session: s.ID, Lang: "bash", Code: curl}); !strings.Contains(r.Stdout, "hello-from-allowed.test") {
		t.Fatalf("curl: %+v", r)
	}
	log := func(a *App, in EgressLogInput) []egress.Event {
		t.Helper()
		in.Session = s.ID
		return mustCall(t, a, "get_egress_log", in).(*EgressLog).Entries
	}
	// A denied connection is logged at its refusal, an allowed one when
	// both its directions have ended (with its bytes): after curl's exit
	// the egress still closes its side to the destination and reads the
	// destination's end, which on a loaded machine can come after this
	// call. Wait for both entries.
	var all []egress.Event
	waitFor(t, "both connections in the egress log", func() bool { all = log(a, EgressLogInput{}); return len(all) >= 2 })
	if len(all) != 2 || all[0].Decision != egress.Allowed || all[0].BytesIn == 0 || all[1].Decision != egress.Denied ||
		!strings.Contains(all[1].Dest, "169.254.169.254") || !strings.Contains(all[1].Reason, "link-local") {
		t.Fatalf("the log: %+v", all)
	}
	if d := log(a, EgressLogInput{Decision: "denied"}); len(d) != 1 || d[0].Dest != all[1].Dest {
		t.Errorf("denied only: %+v", d)
	}
	if d := log(a, EgressLogInput{Since: all[1].Start.Format(time.RFC3339Nano)}); len(d) != 1 || d[0].Dest != all[1].Dest {
		t.Errorf("since the second: %+v", d)
	}
	if d := log(a, EgressLogInput{Since: "1h"}); len(d) != 2 {
		t.Errorf("since an hour ago: %+v", d)
	}
	if d := log(a, EgressLogInput{Limit: 1}); len(d) != 1 || d[0].Dest != all[1].Dest {
		t.Errorf("the latest one: %+v", d)
	}
	if _, err := call(t, a, "get_egress_log", EgressLogInput{Session: s.ID, Since: "yesterday"}); err == nil || !strings.Contains(err.Error(), "RFC 3339") {
		t.Errorf("a bad since: %v", err)
	}
	// Committed is on disk: another opener of the database reads it.
	other, err := store.Open(context.Background(), filepath.Join(dir, "quro.db"))
	if err != nil {
		t.Fatal(err)
	}
	if rows, err := other.Egress(context.Background(), store.EgressFilter{Session: s.ID}); err != nil || len(rows) != 2 {
		t.Errorf("another opener reads %d rows: %v", len(rows), err)
	}
	other.Close()
	a.Close()

	b, err := New(context.Background(), dir, &Options{Python: testPython, Network: o})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	if again := log(b, EgressLogInput{}); len(again) != 2 || again[0].Dest != all[0].Dest || again[1].Reason != all[1].Reason || !again[0].Start.Equal(all[0].Start.Truncate(time.Microsecond)) {
		t.Fatalf("after a restart: %+v", again)
	}
	// Rows of a session that no longer exists go when a server starts.
	if err := b.Store.AppendEgress(context.Background(), []store.EgressEntry{{Session: "gone", Start: time.Now(), Dest: "x:1", Decision: egress.Denied}}, store.EgressKeep{}); err != nil {
		t.Fatal(err)
	}
	mustCall(t, b, "destroy_session", SessionRef{Session: s.ID})
	if err := b.egress.events.w.flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	if rows, err := b.Store.Egress(context.Background(), store.EgressFilter{Session: s.ID}); err != nil || len(rows) != 0 {
		t.Errorf("rows after the session's destroy: %+v %v", rows, err)
	}
	if err := b.Store.PruneEgress(context.Background()); err != nil {
		t.Fatal(err)
	}
	if rows, err := b.Store.Egress(context.Background(), store.EgressFilter{Session: "gone"}); err != nil || len(rows) != 0 {
		t.Errorf("rows of a session that is gone: %+v %v", rows, err)
	}
}

// TestEgressWriterBounds: the writer keeps the latest PerSession rows of
// each session and Total in all, oldest deleted first, in the order the
// decisions came; a forget deletes a session's rows, those queued before
// it included.
func TestEgressWriterBounds(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st, err := store.Open(ctx, filepath.Join(t.TempDir(), "quro.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	w := newEgressWriter(st, store.EgressKeep{PerSession: 5, Total: 12}, slog.New(slog.DiscardHandler), nil)
	defer w.close()
	for i := range 20 {
		for _, s := range []string{"a", "b", "c"} {
			w.add(egress.Event{Box: s, Dest: fmt.Sprint(s, i), Decision: egress.Allowed, Start: time.Now()})
		}
	}
	if err := w.flush(ctx); err != nil {
		t.Fatal(err)
	}
	total := 0
	for _, s := range []string{"a", "b", "c"} {
		rows, err := st.Egress(ctx, store.EgressFilter{Session: s})
		if err != nil {
			t.Fatal(err)
		}
		total += len(rows)
		if len(rows) == 0 || len(rows) > 5 || rows[len(rows)-1].Dest != fmt.Sprint(s, 19) {
			t.Fatalf("session %s: %+v", s, rows)
		}
		for i := 1; i < len(rows); i++ {
			if rows[i].Seq <= rows[i-1].Seq || rows[i].Dest != fmt.Sprint(s, 20-len(rows)+i) {
				t.Fatalf("session %s out of order or not the latest: %+v", s, rows)
			}
		}
	}
	if total > 12 {
		t.Errorf("%d rows kept, the total bound is 12", total)
	}
	w.add(egress.Event{Box: "a", Dest: "late", Decision: egress.Denied, Start: time.Now()})
	w.forget("a")
	if err := w.flush(ctx); err != nil {
		t.Fatal(err)
	}
	if rows, _ := st.Egress(ctx, store.EgressFilter{Session: "a"}); len(rows) != 0 {
		t.Errorf("a's rows after forget: %+v", rows)
	}
	// A full queue drops the decision, counted, and never waits: a writer
	// that takes nothing off its queue of 2.
	lost := 0
	full := &egressWriter{log: slog.New(slog.DiscardHandler), lost: func(n int) { lost += n },
		queue: make(chan *egressItem, 2), quit: make(chan struct{}), stopped: make(chan struct{})}
	for range 5 {
		full.add(egress.Event{Box: "a", Dest: "x:1", Decision: egress.Denied})
	}
	if lost != 3 || full.dropped.Load() != 3 {
		t.Errorf("a full queue of 2 after 5 decisions: %d lost, %d dropped", lost, full.dropped.Load())
	}
}
