// Package piptest has what tests of pip in sessions share: wheels built at
// test time and a PEP 503 simple index on loopback that counts its
// requests. For tests only.
package piptest

import (
	"archive/zip"
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
)

// Wheel is a wheel built at test time.
type Wheel struct {
	Project, Version, Tag string // Tag: python-abi-platform
	Name                  string
	Data                  []byte
}

// BuildWheel writes a wheel of project with files (path → content) with
// the stdlib's zip: METADATA, WHEEL and RECORD with the files' hashes.
func BuildWheel(t testing.TB, project, version, tag string, files map[string][]byte) *Wheel {
	t.Helper()
	return BuildWheelMeta(t, project, version, tag, "", files)
}

// BuildWheelMeta is BuildWheel with further METADATA lines (e.g.
// "Requires-Dist: x @ http://…/x-1.0-py3-none-any.whl\n").
func BuildWheelMeta(t testing.TB, project, version, tag, meta string, files map[string][]byte) *Wheel {
	t.Helper()
	dist := project + "-" + version + ".dist-info/"
	all := map[string][]byte{}
	for k, v := range files {
		all[k] = v
	}
	all[dist+"METADATA"] = fmt.Appendf(nil, "Metadata-Version: 2.1\nName: %s\nVersion: %s\n%s", project, version, meta)
	all[dist+"WHEEL"] = fmt.Appendf(nil, "Wheel-Version: 1.0\nGenerator: quro-test\nRoot-Is-Purelib: %v\nTag: %s\n", strings.HasPrefix(tag, "py3-"), tag)
	var buf bytes.Buffer
	zw := zip.NewWriter(&buf)
	var record strings.Builder
	names := make([]string, 0, len(all))
	for k := range all {
		names = append(names, k)
	}
	for _, n := range names {
		w, err := zw.Create(n)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := w.Write(all[n]); err != nil {
			t.Fatal(err)
		}
		sum := sha256.Sum256(all[n])
		fmt.Fprintf(&record, "%s,sha256=%s,%d\n", n, base64.RawURLEncoding.EncodeToString(sum[:]), len(all[n]))
	}
	record.WriteString(dist + "RECORD,,\n")
	w, err := zw.Create(dist + "RECORD")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write([]byte(record.String())); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return &Wheel{Project: project, Version: version, Tag: tag, Name: project + "-" + version + "-" + tag + ".whl", Data: buf.Bytes()}
}

// PureWheel is a pure-Python wheel: import NAME; NAME.VALUE == value.
func PureWheel(t testing.TB, name, version, value string) *Wheel {
	return BuildWheel(t, name, version, "py3-none-any", map[string][]byte{
		name + "/__init__.py": fmt.Appendf(nil, "VALUE = %q\n", value),
	})
}

// Index is a PEP 503 simple index on loopback serving wheels; it
// counts the Requests it gets, and refuses all while down.
type Index struct {
	*httptest.Server
	mu        sync.Mutex
	wheels    map[string][]*Wheel // normalized project → wheels
	Requests  atomic.Int64
	Down      atomic.Bool
	files     map[string][]byte   // AddFile's
	onRequest func(*http.Request) // OnRequest's
}

// NewIndex serves wheels until the test ends.
func NewIndex(t testing.TB, wheels ...*Wheel) *Index {
	ix := &Index{wheels: map[string][]*Wheel{}}
	for _, w := range wheels {
		p := normalize(w.Project)
		ix.wheels[p] = append(ix.wheels[p], w)
	}
	ix.Server = httptest.NewServer(ix)
	t.Cleanup(ix.Close)
	return ix
}

// Add serves further wheels (one naming the index's own address, made
// once the index listens).
func (ix *Index) Add(wheels ...*Wheel) {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	for _, w := range wheels {
		p := normalize(w.Project)
		ix.wheels[p] = append(ix.wheels[p], w)
	}
}

// AddFile serves data at /files/name (a source archive a package names).
func (ix *Index) AddFile(name string, data []byte) {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	if ix.files == nil {
		ix.files = map[string][]byte{}
	}
	ix.files[name] = data
}

// OnRequest has f see every request first.
func (ix *Index) OnRequest(f func(*http.Request)) {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	ix.onRequest = f
}

// normalize is PEP 503's name normalization (enough for the tests).
func normalize(s string) string {
	return strings.ToLower(strings.NewReplacer("_", "-", ".", "-").Replace(s))
}

// URL is the index's simple API, for --index-url.
func (ix *Index) URL() string { return ix.Server.URL + "/simple/" }

// ServeHTTP answers as the PEP 503 simple index of the wheels (and their
// files), counting requests; a test may put it behind a handler of its own.
func (ix *Index) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	ix.Requests.Add(1)
	ix.mu.Lock()
	hook := ix.onRequest
	ix.mu.Unlock()
	if hook != nil {
		hook(r)
	}
	if ix.Down.Load() {
		http.Error(w, "down", http.StatusServiceUnavailable)
		return
	}
	ix.mu.Lock()
	defer ix.mu.Unlock()
	if p, ok := strings.CutPrefix(r.URL.Path, "/simple/"); ok {
		ws := ix.wheels[normalize(strings.Trim(p, "/"))]
		if len(ws) == 0 {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "text/html")
		fmt.Fprint(w, "<!DOCTYPE html><html><body>\n")
		for _, wh := range ws {
			sum := sha256.Sum256(wh.Data)
			fmt.Fprintf(w, "<a href=\"/files/%s#sha256=%s\">%s</a><br/>\n", wh.Name, hex.EncodeToString(sum[:]), wh.Name)
		}
		fmt.Fprint(w, "</body></html>\n")
		return
	}
	if name, ok := strings.CutPrefix(r.URL.Path, "/files/"); ok {
		if b, ok := ix.files[name]; ok {
			_, _ = w.Write(b)
			return
		}
		for _, ws := range ix.wheels {
			for _, wh := range ws {
				if wh.Name == name {
					_, _ = w.Write(wh.Data) // a client gone is the client's failure
					return
				}
			}
		}
	}
	http.NotFound(w, r)
}
