package app

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"net/http/cgi"
	"net/http/httptest"
	"net/netip"
	"os"
	"path"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quro-dev/quro/internal/rootfs"
	"github.com/quro-dev/quro/internal/rootfs/rootfstest"
)

// testCA is a certificate authority of the test's and a server
// certificate it signed for names: the CA's PEM (what the box is told to
// trust) and the server's key pair.
func testCA(t *testing.T, names ...string) ([]byte, tls.Certificate) {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	ca := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "quro test CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature}
	caDER, err := x509.CreateCertificate(rand.Reader, ca, ca, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	if ca, err = x509.ParseCertificate(caDER); err != nil {
		t.Fatal(err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	leaf := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: names[0]}, DNSNames: names,
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, leaf, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}), tls.Certificate{Certificate: [][]byte{der, caDER}, PrivateKey: key}
}

// slowRunMS is the own budget (timeout_ms) of a run in these tests that
// starts a tool in the box and waits on the network through the egress
// — pip, apt-get, git clone, node, curl —, and slowRunCall the call's,
// a little longer so that the run's own timeout is what answers. Each is
// work that is slow under load, not a wait on an event: at a load of 40
// on 2 cores pip's start alone took over run_code's default 30 s
// (attack_wheel_test.go's pip, TestToolsThroughTheEgress's pip in CI's
// note), and a run cut at its budget answers "timed out" where the test
// wants the tool's output.
const (
	slowRunMS   = 240_000
	slowRunCall = slowRunMS*time.Millisecond + time.Minute
)

// TestToolsThroughTheEgress: one session under allow rules reaches
// HTTPS stand-ins on the host's loopback (which the egress resolves
// web.test, git.test and pypi.test to, and the operator listed) with the
// tools an agent uses, each through the egress: curl, Python's urllib,
// Node's fetch, git clone over smart HTTP (git http-backend behind
// net/http/cgi), pip install from the server's index (pip in the box,
// not the server's fetch), and the JS engine's fetch (plain HTTP: it
// runs in the server, which trusts only the system's CAs). TLS is
// verified against the test's CA, which the session trusts through its
// variables (SSL_CERT_FILE, CURL_CA_BUNDLE, GIT_SSL_CAINFO,
// NODE_EXTRA_CA_CERTS, PIP_CERT). A name the rules do not list is
// refused to each, with the reason in the run's note, and the stand-in
// sees none of it.
func TestToolsThroughTheEgress(t *testing.T) {
	t.Parallel()
	caPEM, cert := testCA(t, "web.test", "git.test", "pypi.test", "other.test")
	repo := gitRepo(t)
	ix := newTestIndex(t, pureWheel(t, "qurotool", "1.0", "from-the-stand-in-index"))
	var hits, upload, refusedHits atomic.Int64
	git := &cgi.Handler{Path: "/usr/lib/git-core/git-http-backend", Root: "/git",
		Env: []string{"GIT_PROJECT_ROOT=" + filepath.Dir(repo), "GIT_HTTP_EXPORT_ALL=1"}}
	if _, err := os.Stat(git.Path); err != nil {
		t.Skip("no git http-backend on this host")
	}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		host, _, _ := net.SplitHostPort(r.Host)
		switch {
		case host == "other.test":
			refusedHits.Add(1)
			fmt.Fprint(w, "hello-from-other.test")
		case strings.HasPrefix(r.URL.Path, "/git/"):
			if strings.Contains(r.URL.RawQuery, "service=git-upload-pack") || strings.HasSuffix(r.URL.Path, "/git-upload-pack") {
				upload.Add(1)
			}
			git.ServeHTTP(w, r)
		case strings.HasPrefix(r.URL.Path, "/simple/"), strings.HasPrefix(r.URL.Path, "/files/"):
			ix.ServeHTTP(w, r)
		default:
			hits.Add(1)
			fmt.Fprintf(w, "hello-from-%s", host)
		}
	}))
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{cert}}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	port := srv.Listener.Addr().(*net.TCPAddr).Port
	plain := newStandIn(t) // for the JS engine: allowed.test over plain HTTP

	names := []string{"web.test", "git.test", "pypi.test", "other.test"}
	var trusted []string
	for _, n := range names {
		trusted = append(trusted, fmt.Sprintf("%s:%d", n, port))
	}
	resolve := func(ctx context.Context, host string) ([]netip.Addr, error) {
		for _, n := range names {
			if host == n {
				return []netip.Addr{netip.MustParseAddr("127.0.0.1")}, nil
			}
		}
		return plain.resolve(ctx, host)
	}
	a, err := New(context.Background(), t.TempDir(), &Options{Python: testPython,
		Network: NetworkOptions{Trusted: append(trusted, fmt.Sprintf("allowed.test:%d", plain.port)), Resolve: resolve},
		Pip:     PipOptions{IndexURL: fmt.Sprintf("https://pypi.test:%d/simple/", port)}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	needBoxes(t, a)

	ca := "/home/user/.quro-test-ca.pem"
	env := map[string]string{"SSL_CERT_FILE": ca, "CURL_CA_BUNDLE": ca, "GIT_SSL_CAINFO": ca, "NODE_EXTRA_CA_CERTS": ca, "PIP_CERT": ca}
	s := mustCall(t, a, "create_session", CreateSessionInput{Name: "tools", Network: "internet", Env: env,
		AllowOut: []string{"web.test", "*.test:" + fmt.Sprint(port), fmt.Sprintf("allowed.test:%d", plain.port)}, DenyOut: []string{"other.test"}}).(*SessionInfo)
	mustCall(t, a, "write_file", WriteFileInput{Session: s.ID, Path: ca, Content: string(caPEM)})

	web := fmt.Sprintf("https://web.test:%d/", port)
	for _, run := range []struct{ tool, lang, code string }{
		// The tools' own time limits guard against a hang, sized for a
		// loaded machine (a TLS handshake through the egress).
		{"curl", "bash", "curl -sS --max-time 120 " + web},
		{"python", "python", "import urllib.request\nprint(urllib.request.urlopen('" + web + "', timeout=120).read().decode())"},
		{"node", "bash", "command -v node >/dev/null || { echo hello-from-web.test no node; exit; }; node -e \"fetch('" + web + "').then(r => r.text()).then(console.log)\""},
		{"js engine", "js", fmt.Sprintf("const r = await fetch('http://allowed.test:%d/'); console.log(await r.text())", plain.port)},
	} {
		res := runCodeWithin(t, a, RunCodeInput{Session: s.ID, Lang: run.lang, Code: run.code, TimeoutMS: slowRunMS}, slowRunCall)
		if !strings.Contains(res.Stdout, "hello-from-") {
			t.Errorf("%s did not reach its stand-in through the egress: %+v", run.tool, res)
		}
	}
	res := runCodeWithin(t, a, RunCodeInput{Session: s.ID, Lang: "bash", Code: fmt.Sprintf("git clone -q https://git.test:%d/git/repo.git r 2>&1 && cat r/README", port), TimeoutMS: slowRunMS}, slowRunCall)
	if !strings.Contains(res.Stdout, "hello-from-the-repo") || upload.Load() == 0 {
		t.Errorf("git clone over smart HTTP(S) through the egress (%d upload-pack requests): %+v", upload.Load(), res)
	}
	// pip in the box: the session's pip goes to the server's index
	// through the session's egress (not install_packages' fetch).
	if wantPython == "python/embedded" {
		before := ix.Requests.Load()
		res = runCodeWithin(t, a, RunCodeInput{Session: s.ID, Lang: "bash", Code: "python3 -m pip install -q qurotool 2>&1 && python3 -c 'import qurotool; print(qurotool.VALUE)'", TimeoutMS: slowRunMS}, slowRunCall)
		t.Logf("pip: %s", res.Stdout)
		if !strings.Contains(res.Stdout, "from-the-stand-in-index") || ix.Requests.Load() == before {
			t.Errorf("pip install in the session through the egress: %+v", res)
		}
	}

	// A name the rules refuse: each tool fails, and the run says why.
	other := fmt.Sprintf("https://other.test:%d/", port)
	for _, run := range []struct{ tool, lang, code string }{
		{"curl", "bash", "curl -sS --max-time 20 " + other},
		{"python", "python", "import urllib.request\nprint(urllib.request.urlopen('" + other + "', timeout=20).read().decode())"},
		{"git", "bash", fmt.Sprintf("git clone -q https://other.test:%d/git/repo.git o", port)},
	} {
		res := runCodeWithin(t, a, RunCodeInput{Session: s.ID, Lang: run.lang, Code: run.code, TimeoutMS: slowRunMS}, slowRunCall)
		t.Logf("%s to a denied name: %s %s %q", run.tool, res.Stdout, res.Stderr, res.Notes)
		if res.ExitCode == 0 || strings.Contains(res.Stdout, "hello-from-other") {
			t.Errorf("%s reached a denied name: %+v", run.tool, res)
		}
		if notes := strings.Join(res.Notes, "\n"); !strings.Contains(notes, "other.test") || !strings.Contains(notes, "deny rule other.test") || !strings.Contains(notes, "set_session_network") {
			t.Errorf("%s: the run's notes do not say which name the egress refused and why: %q", run.tool, notes)
		}
	}
	if n := refusedHits.Load(); n != 0 {
		t.Errorf("the stand-in served %d requests for a denied name", n)
	}
	if hits.Load() == 0 {
		t.Error("the stand-in saw no request")
	}
}

// TestAptThroughTheEgress: in a session on the installed Debian rootfs
// (skipped where none is installed) under allow rules, apt-get — as the
// session's user, with its lists and cache in the workspace — updates
// from a stand-in flat repository (apt.test, on the host's loopback,
// which only the egress reaches) and downloads a package from it,
// checked by apt against the repository's hashes, and pip run by the
// rootfs's python3 installs from the server's index there; a repository
// under a
// name the rules do not list fails to update, the note naming it. (The
// rootfs's own /usr/bin/apt-get: quro's apt-get stand-in, first on PATH,
// is the test binary here.)
func TestAptThroughTheEgress(t *testing.T) {
	t.Parallel()
	m := rootfs.New(rootfstest.Dir())
	if !m.Ready(rootfs.DefaultName) {
		t.Skip("no test rootfs installed (" + rootfstest.Dir() + ")")
	}
	deb := []byte("!<arch>\nquro stand-in package\n")
	debSum := sha256.Sum256(deb)
	packages := fmt.Sprintf("Package: qurohello\nVersion: 1.0\nArchitecture: all\nMaintainer: quro <t@t>\nFilename: ./qurohello_1.0_all.deb\nSize: %d\nSHA256: %x\nDescription: a stand-in\n\n", len(deb), debSum)
	pkSum := sha256.Sum256([]byte(packages))
	release := fmt.Sprintf("Origin: quro-test\nLabel: quro-test\nSuite: stable\nCodename: stable\nArchitectures: amd64 all\nDate: %s\nSHA256:\n %x %d Packages\n",
		time.Now().UTC().Format(time.RFC1123), pkSum, len(packages))
	var served atomic.Int64
	ix := newTestIndex(t, pureWheel(t, "qurorootfs", "1.0", "from-the-stand-in-index"))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		files := map[string]string{"/Release": release, "/Packages": packages, "/qurohello_1.0_all.deb": string(deb)}
		body, ok := files[path.Clean(r.URL.Path)] // apt asks for /./Packages
		if !ok {
			ix.ServeHTTP(w, r) // pip's index
			return
		}
		served.Add(1)
		fmt.Fprint(w, body)
	}))
	t.Cleanup(srv.Close)
	port := srv.Listener.Addr().(*net.TCPAddr).Port
	resolve := func(_ context.Context, host string) ([]netip.Addr, error) {
		if host == "apt.test" || host == "other.test" {
			return []netip.Addr{netip.MustParseAddr("127.0.0.1")}, nil
		}
		return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
	}
	data := t.TempDir()
	if err := os.Symlink(m.Dir, rootfs.DirIn(data)); err != nil {
		t.Fatal(err)
	}
	a, err := New(context.Background(), data, &Options{Python: testPython,
		Network: NetworkOptions{Trusted: []string{fmt.Sprintf("apt.test:%d", port), fmt.Sprintf("other.test:%d", port)}, Resolve: resolve},
		Pip:     PipOptions{IndexURL: fmt.Sprintf("http://apt.test:%d/simple/", port)}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	needBoxes(t, a)
	embedded := wantPython == "python/embedded"
	if embedded {
		// pip comes with the embedded Python: ready before the box is made.
		if _, _, err := a.Python.Installed(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	s := mustCall(t, a, "create_session", CreateSessionInput{Name: "apt", Network: "internet", Rootfs: rootfs.DefaultName,
		AllowOut: []string{fmt.Sprintf("apt.test:%d", port)}}).(*SessionInfo)
	apt := func(host string) string {
		return fmt.Sprintf(`set -e
mkdir -p ~/apt-%[1]s/lists/partial ~/apt-%[1]s/cache/archives/partial ~/dl-%[1]s
echo "deb [trusted=yes] http://%[1]s:%[2]d/ ./" > ~/apt-%[1]s/sources.list
o="-o Dir::Etc::SourceList=$HOME/apt-%[1]s/sources.list -o Dir::Etc::SourceParts=/nonexistent -o Dir::State::Lists=$HOME/apt-%[1]s/lists -o Dir::Cache=$HOME/apt-%[1]s/cache -o Debug::NoLocking=1 -o APT::Sandbox::User=$(id -un)"
/usr/bin/apt-get $o -q update 2>&1
cd ~/dl-%[1]s && /usr/bin/apt-get $o -q download qurohello 2>&1 && ls`, host, port)
	}
	res := runCodeWithin(t, a, RunCodeInput{Session: s.ID, Lang: "bash", Code: apt("apt.test"), TimeoutMS: slowRunMS}, slowRunCall)
	t.Logf("apt: %s %s %q", res.Stdout, res.Stderr, res.Notes)
	if res.ExitCode != 0 || !strings.Contains(res.Stdout, "qurohello_1.0_all.deb") {
		t.Fatalf("apt-get update and download through the egress: %+v", res)
	}
	// pip run by the rootfs's python3 goes to the server's index through
	// the session's egress too (--trusted-host: pip takes plain HTTP from
	// a name other than localhost only so).
	if embedded {
		res = runCodeWithin(t, a, RunCodeInput{Session: s.ID, Lang: "bash", Code: "python3 -m pip install -q --trusted-host apt.test qurorootfs 2>&1 && python3 -c 'import sys, qurorootfs; print(sys.version_info[:2], qurorootfs.VALUE)'", TimeoutMS: slowRunMS}, slowRunCall)
		if !strings.Contains(res.Stdout, "(3, 11) from-the-stand-in-index") || ix.Requests.Load() == 0 {
			t.Errorf("the rootfs's pip through the egress: %+v", res)
		}
	}
	before := served.Load()
	res = runCodeWithin(t, a, RunCodeInput{Session: s.ID, Lang: "bash", Code: apt("other.test"), TimeoutMS: slowRunMS}, slowRunCall)
	t.Logf("apt from a name not allowed: %s %q", res.Stdout, res.Notes)
	if strings.Contains(res.Stdout, "qurohello_1.0_all.deb") || served.Load() != before {
		t.Errorf("apt reached a repository the rules do not list: %+v", res)
	}
	if notes := strings.Join(res.Notes, "\n"); !strings.Contains(notes, "other.test") {
		t.Errorf("the run's notes do not name the refused repository: %q", notes)
	}
}
