// Command pip measures `pip install` of a cached wheel into a new session,
// on the served, boxed setup: a real App served over REST (benchbed) with
// spare sessions, its pip index a PEP 503 simple index on loopback serving
// one small pure-Python wheel, which a first session fetches into the
// tenant's cache. Each round then makes a new session (create_session) and
// installs the wheel from the cache, in turn:
//
//   - by install_packages {manager: pip} (pip install --no-index in the
//     session's box: the server fetches nothing, the cache has it);
//   - by a run_code `%pip install` line followed by the import;
//
// and, for scale, the session's `pip --version` alone (run_code bash), and
// destroys the session. The first two rounds warm up.
//
//	go run ./bench/pip -n 20
package main

import (
	"archive/zip"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/quro-dev/quro/bench/internal/benchbed"
	"github.com/quro-dev/quro/internal/app"
	"github.com/quro-dev/quro/internal/engine/python"
	"github.com/quro-dev/quro/internal/runcode"
	"github.com/quro-dev/quro/internal/sandbox"
)

var (
	n       = flag.Int("n", 20, "rounds (new sessions) per series")
	install = flag.String("install", filepath.Join(os.TempDir(), "quro-test-python"), "where the embedded interpreter is extracted (shared with the tests)")
)

func main() {
	flag.Parse()
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "pip:", err)
		os.Exit(1)
	}
}

// wheel is a pure-Python wheel benchpip 1.0 written with the stdlib.
func wheel() (name string, data []byte) {
	files := map[string]string{
		"benchpip/__init__.py":                 "VALUE = 42\n",
		"benchpip-1.0.dist-info/METADATA":      "Metadata-Version: 2.1\nName: benchpip\nVersion: 1.0\n",
		"benchpip-1.0.dist-info/WHEEL":         "Wheel-Version: 1.0\nGenerator: quro-bench\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
		"benchpip-1.0.dist-info/RECORD":        "",
		"benchpip-1.0.dist-info/top_level.txt": "benchpip\n",
	}
	var buf bytes.Buffer
	zw := zip.NewWriter(&buf)
	var record strings.Builder
	for _, k := range slices.Sorted(func(yield func(string) bool) {
		for k := range files {
			if !yield(k) {
				return
			}
		}
	}) {
		if strings.HasSuffix(k, "RECORD") {
			continue
		}
		w, _ := zw.Create(k)
		_, _ = w.Write([]byte(files[k]))
		sum := sha256.Sum256([]byte(files[k]))
		fmt.Fprintf(&record, "%s,sha256=%s,%d\n", k, base64.RawURLEncoding.EncodeToString(sum[:]), len(files[k]))
	}
	record.WriteString("benchpip-1.0.dist-info/RECORD,,\n")
	w, _ := zw.Create("benchpip-1.0.dist-info/RECORD")
	_, _ = w.Write([]byte(record.String()))
	zw.Close()
	return "benchpip-1.0-py3-none-any.whl", buf.Bytes()
}

func index() *httptest.Server {
	name, data := wheel()
	sum := sha256.Sum256(data)
	return httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/simple/benchpip/":
			fmt.Fprintf(w, "<html><body><a href=\"/files/%s#sha256=%s\">%s</a></body></html>\n", name, hex.EncodeToString(sum[:]), name)
		case "/files/" + name:
			_, _ = w.Write(data)
		default:
			http.NotFound(w, r)
		}
	}))
}

// bearer adds the token to every request.
type bearer struct {
	token string
	rt    http.RoundTripper
}

func (t *bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+t.token)
	return t.rt.RoundTrip(r)
}

type series struct {
	name string
	ds   []time.Duration
}

func (s *series) q(p float64) time.Duration {
	d := slices.Clone(s.ds)
	slices.Sort(d)
	return d[int(p*float64(len(d)-1))]
}

func run() error {
	ctx := context.Background()
	ix := index()
	defer ix.Close()
	dir, err := os.MkdirTemp("", "quro-bench-pip-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	a, err := app.New(ctx, dir, &app.Options{
		Python:        &python.EmbeddedOptions{InstallRoot: *install},
		Sandbox:       &sandbox.Options{BoxReadOnly: []string{*install}},
		AutoPause:     -1,
		SpareSessions: 1,
		Pip:           app.PipOptions{IndexURL: ix.URL + "/simple/"},
		Limits: app.Limits{SessionsPerTenant: -1,
			Tenant: app.TenantLimits{Sessions: -1, Tasks: -1, Memory: -1, Disk: -1}},
	})
	if err != nil {
		return err
	}
	b, err := benchbed.Serve(ctx, a, false)
	if err != nil {
		return err
	}
	defer b.Close()
	// install_packages needs scope install besides exec.
	iss, err := a.CreateToken(ctx, "bench-pip", benchbed.Tenant, []string{"exec", "install"}, "bench")
	if err != nil {
		return err
	}
	b.Token = iss.Token
	b.Client = &http.Client{Transport: &bearer{token: iss.Token, rt: &http.Transport{MaxIdleConns: 8, MaxIdleConnsPerHost: 8}}}

	c := &client{ctx: ctx, b: b}
	// The tenant's cache gets the wheel (the server's fetch).
	fmt.Fprintf(os.Stderr, "filling the cache (interpreter under %s) ...\n", *install)
	id, err := c.newSession()
	if err != nil {
		return err
	}
	if r, err := c.installPkgs(id); err != nil || len(r.Wheels) != 1 {
		return fmt.Errorf("first install: %+v %v", r, err)
	}
	if err := c.destroy(id); err != nil {
		return err
	}

	rows := []*series{
		{name: "create_session"},
		{name: "install_packages pip (cached wheel)"},
		{name: "create_session + install_packages pip"},
		{name: "run_code %pip install + import"},
		{name: "create_session + %pip install + import"},
		{name: "run_code bash pip --version"},
	}
	fmt.Fprintf(os.Stderr, "%d rounds ...\n", *n)
	for i := range *n + 2 {
		rec := func(k int, d time.Duration) {
			if i >= 2 {
				rows[k].ds = append(rows[k].ds, d)
			}
		}
		t0 := time.Now()
		id, err := c.newSession()
		if err != nil {
			return err
		}
		t1 := time.Now()
		r, err := c.installPkgs(id)
		if err != nil || !r.FromCache {
			return fmt.Errorf("install_packages: %+v %v", r, err)
		}
		t2 := time.Now()
		rec(0, t1.Sub(t0))
		rec(1, t2.Sub(t1))
		rec(2, t2.Sub(t0))
		if err := c.destroy(id); err != nil {
			return err
		}

		t0 = time.Now()
		if id, err = c.newSession(); err != nil {
			return err
		}
		t1 = time.Now()
		if err := c.runCode(id, "python", "%pip install -q benchpip\nimport benchpip\nprint(benchpip.VALUE)", "42\n"); err != nil {
			return err
		}
		t2 = time.Now()
		rec(3, t2.Sub(t1))
		rec(4, t2.Sub(t0))
		if err := c.runCode(id, "bash", "pip --version >/dev/null; echo ok", "ok\n"); err != nil {
			return err
		}
		rec(5, time.Since(t2))
		if err := c.destroy(id); err != nil {
			return err
		}
	}
	report(rows)
	return nil
}

// client makes the calls a round is made of, through the bench's server.
type client struct {
	ctx context.Context
	b   *benchbed.Bed
}

func (c *client) newSession() (string, error) {
	var s app.SessionInfo
	err := c.b.Post(c.ctx, "create_session", []byte(`{}`), &s)
	return s.ID, err
}

func (c *client) destroy(id string) error {
	ref, _ := json.Marshal(app.SessionRef{Session: id})
	return c.b.Post(c.ctx, "destroy_session", ref, nil)
}

func (c *client) installPkgs(id string) (*app.InstallPackagesResult, error) {
	body, _ := json.Marshal(app.InstallPackagesInput{Session: id, Manager: "pip", Packages: []string{"benchpip"}})
	var r app.InstallPackagesResult
	return &r, c.b.Post(c.ctx, "install_packages", body, &r)
}

// runCode runs code in session id; its stdout must end with want.
func (c *client) runCode(id, lang, code, want string) error {
	body, _ := json.Marshal(app.RunCodeInput{Session: id, Lang: lang, Code: code})
	var r runcode.Result
	if err := c.b.Post(c.ctx, "run_code", body, &r); err != nil {
		return err
	}
	if !strings.HasSuffix(r.Stdout, want) {
		return fmt.Errorf("run_code %q: %+v", code, r)
	}
	return nil
}

// report prints each row's count, median and p95, with the time and the
// load average.
func report(rows []*series) {
	load, _ := os.ReadFile("/proc/loadavg")
	fmt.Printf("Quro pip, cached wheel into a new session: %s, load average %s\n", time.Now().UTC().Format(time.RFC3339),
		strings.Join(strings.Fields(string(load))[:3], " "))
	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "\tn\tmedian\tp95\t")
	for _, s := range rows {
		fmt.Fprintf(tw, "%s\t%d\t%.1f ms\t%.1f ms\t\n", s.name, len(s.ds), ms(s.q(0.5)), ms(s.q(0.95)))
	}
	tw.Flush()
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
