package app

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/quro-dev/quro/internal/pip/piptest"
	"github.com/quro-dev/quro/internal/sandbox"
	"github.com/quro-dev/quro/internal/sandbox/sandboxtest"
)

// TestPipInstallOutputBoundedAgainstPth: install_packages' pip runs in the
// session's box with the session's user site, so a .pth the session wrote
// there runs inside pip and writes what it likes to pip's stdout (here
// 512 MiB). Both of pip's passes keep a bounded capture: the call returns,
// its output says it was cut, and the server did not allocate the stream.
func TestPipInstallOutputBoundedAgainstPth(t *testing.T) {
	t.Parallel()
	ix := newTestIndex(t, pureWheel(t, "quropth", "1.0", "v"))
	a := pipApp(t, ix)
	s := sessionAs(t, a, pipAlice, "pth", "", nil)
	r := runIn(t, a, pipAlice, RunCodeInput{Session: s.ID, Code: `import os, site
d = site.getusersitepackages()
os.makedirs(d, exist_ok=True)
with open(os.path.join(d, "zz-flood.pth"), "w") as f:
    f.write("import os,sys; [os.write(1, b'A'*(1<<20)) for _ in range(512)] if 'install' in sys.argv else None\n")
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
	// 512 MiB went through pip's stdout; a bounded capture allocates a
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

// pipOfFetch finds the pid of the fetch box's pip of the app's data
// directory (its command line names the cache's scratch directory).
func pipOfFetch(t *testing.T, dataDir string) int {
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
		if slices.Contains(args, "download") && strings.Contains(string(b), filepath.Join(dataDir, "pip")) && !strings.Contains(args[0], "bwrap") {
			return pid
		}
	}
	t.Fatal("no pip download process of this data directory")
	return 0
}

// TestPipFetchInTenantCgroupOneAtATime: the server's fetch box for a
// tenant runs in the tenant's cgroup (its memory, CPU and task ceilings),
// and a tenant's fetches run one at a time: while an index holds alice's
// first fetch, her second call waits for it (here until its own time
// budget ends) and opens no connection.
func TestPipFetchInTenantCgroupOneAtATime(t *testing.T) {
	t.Parallel()
	ix := newTestIndex(t, pureWheel(t, "quroslow", "1.0", "a"), pureWheel(t, "quroother", "1.0", "b"))
	arrived, release := make(chan string, 16), make(chan struct{})
	var mu sync.Mutex
	var seen []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, r.URL.Path)
		mu.Unlock()
		if strings.HasPrefix(r.URL.Path, "/simple/") {
			arrived <- r.URL.Path
			<-release
		}
		ix.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(func() {
		select {
		case <-release:
		default:
			close(release)
		}
	})
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
	pid := pipOfFetch(t, a.DataDir)
	cg, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		t.Fatal(err)
	}
	if name := sandbox.TenantCgroupName(a.DataDir, "alice"); !strings.Contains(string(cg), "/"+name+"/") {
		t.Fatalf("the fetch's pip (pid %d) is not in alice's cgroup %s:\n%s", pid, name, cg)
	}

	reply, err := callAs(t, a, pipAlice, "install_packages", InstallPackagesInput{Session: s2.ID, Manager: "pip", Packages: []string{"quroother"}, TimeoutMS: 10000})
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
	close(release)
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
// metadata address and on a private address. The server's fetch goes
// through its egress proxy, which refuses each: install_packages fails
// naming the destination and its class, and the listener saw no
// connection. A dependency on a git repository there (git, which pip
// runs, ignores the proxy) fails too, the listener still untouched. A
// package without such a dependency still comes from the loopback index.
func TestPipFetchRefusesDirectURLsToTheHostsNetworks(t *testing.T) {
	t.Parallel()
	ln := sandboxtest.ListenHost(t, "")
	target := ln.Addr
	evil := func(project, url string) *testWheel {
		return piptest.BuildWheelMeta(t, project, "1.0", "py3-none-any", "Requires-Dist: evil @ "+url+"\n",
			map[string][]byte{project + "/__init__.py": []byte("")})
	}
	ix := newTestIndex(t,
		pureWheel(t, "quroplain", "1.0", "v"),
		evil("quroloop", "http://"+target+"/evil-1.0-py3-none-any.whl"),
		evil("quroloops", "https://"+target+"/evil-1.0-py3-none-any.whl"),
		evil("quromd", "http://169.254.169.254/latest/meta-data/evil-1.0-py3-none-any.whl"),
		evil("quropriv", "http://10.255.0.1:8080/evil-1.0-py3-none-any.whl"),
		evil("qurogit", "git+http://"+target+"/evil.git"))
	a := pipApp(t, ix)
	s := sessionAs(t, a, pipAlice, "ssrf", "", nil)
	for pkg, want := range map[string]string{
		"quroloop":  target + " (loopback address)",
		"quroloops": target + " (loopback address)",
		"quromd":    "169.254.169.254:80 (link-local address)",
		"quropriv":  "10.255.0.1:8080 (private address)",
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
	// Its error quotes git's command line, whose paths are in the data
	// directory: the tenant reads them as $QURO_DATA.
	if _, err := installPip(t, a, pipAlice, s.ID, "qurogit"); err == nil {
		t.Error("qurogit: installed, want a failure")
	} else if strings.Contains(err.Error(), a.DataDir) || !strings.Contains(err.Error(), "$QURO_DATA") {
		t.Errorf("qurogit: the error shows the data directory %s, or not as $QURO_DATA: %v", a.DataDir, err)
	} else {
		t.Logf("qurogit: %v", err)
	}
	if n := ln.Accepted.Load(); n != 0 {
		t.Fatalf("the fetch connected %d times to the loopback listener a package named", n)
	}
	if res, err := installPip(t, a, pipAlice, s.ID, "quroplain"); err != nil || res.FromCache || len(res.Wheels) != 1 {
		t.Fatalf("a plain package from the loopback index: %+v %v", res, err)
	}
}
