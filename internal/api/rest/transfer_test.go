package rest_test

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/quro-dev/quro/internal/api/httpauth"
	"github.com/quro-dev/quro/internal/api/rest"
	"github.com/quro-dev/quro/internal/app"
	"github.com/quro-dev/quro/internal/capability"
	"github.com/quro-dev/quro/internal/controller"
)

// tenantAuth: "Bearer alice" and "Bearer bob" are two tenants with the
// exec scope.
func tenantAuth(r *http.Request) (controller.Caller, error) {
	switch t := httpauth.Bearer(r); t {
	case "alice", "bob":
		return controller.Caller{Tenant: t, Scope: capability.ScopeExec, TokenID: t}, nil
	}
	return controller.Caller{}, capability.Errorf(capability.Unauthenticated, "send a token")
}

type transferEnv struct {
	t   *testing.T
	url string
}

func (e transferEnv) req(who, method, path string, body io.Reader, size int64) (int, []byte, http.Header) {
	e.t.Helper()
	req, err := http.NewRequest(method, e.url+path, body)
	if err != nil {
		e.t.Fatal(err)
	}
	if size >= 0 {
		req.ContentLength = size
	}
	req.Header.Set("Authorization", "Bearer "+who)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		e.t.Fatalf("%s %s: reading the body: %v", method, path, err)
	}
	return resp.StatusCode, b, resp.Header
}

func (e transferEnv) exec(id, cmd string) string {
	e.t.Helper()
	js, _ := json.Marshal(map[string]string{"command": cmd})
	code, b, _ := e.req("alice", "POST", "/v1/sessions/"+id+"/exec", bytes.NewReader(js), -1)
	if code != 200 {
		e.t.Fatalf("exec %q: %d %s", cmd, code, b)
	}
	var out struct{ Output string }
	_ = json.Unmarshal(b, &out)
	return out.Output
}

func newTransferEnv(t *testing.T, opts *app.Options) (transferEnv, string) {
	if opts == nil {
		opts = &app.Options{}
	}
	opts.Python = testPython
	a, err := app.New(context.Background(), t.TempDir(), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	srv := httptest.NewServer(rest.New(a.Controller, &rest.Options{Access: rest.Access{Auth: tenantAuth}}))
	t.Cleanup(srv.Close)
	e := transferEnv{t, srv.URL}
	code, b, _ := e.req("alice", "POST", "/v1/sessions", strings.NewReader(`{"name":"files"}`), -1)
	if code != http.StatusCreated {
		t.Fatalf("create: %d %s", code, b)
	}
	var s struct{ ID string }
	_ = json.Unmarshal(b, &s)
	return e, s.ID
}

// Upload and download move bytes exactly, in chunks across read_file's and
// write_file's bounds; a folder comes as a tar.gz of what is in it (links
// as links, never followed); and every attack on the routes is refused.
func TestTransfers(t *testing.T) {
	e, id := newTransferEnv(t, nil)
	base := "/v1/sessions/" + id
	blob := make([]byte, 2*rest.TransferChunk+12345)
	rand.Read(blob)

	code, b, _ := e.req("alice", "PUT", base+"/upload/d/blob.bin", bytes.NewReader(blob), int64(len(blob)))
	if code != 200 || !strings.Contains(string(b), `"path":"d/blob.bin"`) {
		t.Fatalf("upload: %d %s", code, b)
	}
	code, b, hdr := e.req("alice", "GET", base+"/download/d/blob.bin", nil, -1)
	if code != 200 || !bytes.Equal(b, blob) {
		t.Fatalf("download: %d, %d bytes, equal %v", code, len(b), bytes.Equal(b, blob))
	}
	if cd := hdr.Get("Content-Disposition"); cd != `attachment; filename=blob.bin` {
		t.Errorf("Content-Disposition %q", cd)
	}
	// Each transfer is one audit entry with its size, not one per chunk:
	// the upload as write_file, the download as read_file, both 3 chunks.
	code, b, _ = e.req("alice", "GET", "/v1/audit?limit=1000", nil, -1)
	var log struct {
		Entries []struct{ Capability, Args, Outcome, Session string }
	}
	if code != 200 || json.Unmarshal(b, &log) != nil {
		t.Fatalf("audit: %d %s", code, trim(string(b)))
	}
	counts := map[string]int{}
	for _, en := range log.Entries {
		counts[en.Capability]++
		switch en.Capability {
		case "write_file", "read_file":
			if !strings.Contains(en.Args, fmt.Sprintf("bytes=%d ", len(blob))) || en.Outcome != "ok" || en.Session != id {
				t.Errorf("the transfer's entry: %+v", en)
			}
		case "stat_file", "move_file":
			t.Errorf("a transfer's part audited on its own: %+v", en)
		}
	}
	if counts["write_file"] != 1 || counts["read_file"] != 1 {
		t.Fatalf("audit entries by capability %v (%s)", counts, trim(string(b)))
	}

	// A replacing upload: the new bytes, and no part file left beside it.
	code, b, _ = e.req("alice", "PUT", base+"/upload/d/blob.bin", strings.NewReader("second"), -1)
	if code != 200 {
		t.Fatalf("replacing upload: %d %s", code, b)
	}
	if out := e.exec(id, "cat d/blob.bin; echo; ls -A d"); out != "second\nblob.bin\n" {
		t.Fatalf("after the replacing upload: %q", out)
	}

	e.exec(id, "mkdir -p d/sub && printf 'hi\\n' > d/sub/a.txt && ln -s /etc/passwd d/out && ln -s / d/root")
	code, b, hdr = e.req("alice", "GET", base+"/download/d/", nil, -1)
	if code != 200 || hdr.Get("Content-Type") != "application/gzip" {
		t.Fatalf("folder download: %d %s", code, trim(string(b)))
	}
	got := untar(t, b)
	want := map[string]string{"d/": "dir", "d/blob.bin": "second", "d/sub/": "dir", "d/sub/a.txt": "hi\n", "d/out": "-> /etc/passwd", "d/root": "-> /"}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("archive %s: %q, want %q (all: %v)", k, got[k], v, got)
		}
	}
	if len(got) != len(want) {
		t.Errorf("archive holds %v, want %v", got, want)
	}
	if code, b, _ = e.req("alice", "GET", base+"/download/", nil, -1); code != 200 || untar(t, b)["user/d/sub/a.txt"] != "hi\n" {
		t.Errorf("workspace download: %d", code)
	}

	for _, tc := range []struct {
		name, who, method, path string
		status                  int
		want                    string
	}{
		{"traversal down", "alice", "GET", base + "/download/..%2F..%2F..%2Fetc%2Fpasswd", 403, "leads out"},
		{"absolute path", "alice", "GET", base + "/download/%2Fetc%2Fpasswd", 400, "relative to the workspace"},
		{"link out of the workspace", "alice", "GET", base + "/download/d/out", 0, ""},
		{"link to the root", "alice", "GET", base + "/download/d/root/etc/passwd", 0, ""},
		{"another tenant's session", "bob", "GET", base + "/download/d/sub/a.txt", 404, "not found"},
		{"another tenant's upload", "bob", "PUT", base + "/upload/d/sub/a.txt", 404, "not found"},
		{"traversal up", "alice", "PUT", base + "/upload/..%2F..%2Fescape", 403, "leads out"},
		{"upload over a link out", "alice", "PUT", base + "/upload/d/root/tmp/x", 0, ""},
		{"upload onto the workspace", "alice", "PUT", base + "/upload/", 400, "name the file"},
		{"no token", "", "GET", base + "/download/d/sub/a.txt", 401, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var body io.Reader
			if tc.method == "PUT" {
				body = strings.NewReader("pwned")
			}
			code, b, _ := e.req(tc.who, tc.method, tc.path, body, -1)
			if code < 400 || (tc.status != 0 && code != tc.status) || !strings.Contains(string(b), tc.want) {
				t.Fatalf("%d %s, want %d with %q", code, trim(string(b)), tc.status, tc.want)
			}
			if strings.Contains(string(b), "root:") {
				t.Fatalf("a host file leaked: %s", trim(string(b)))
			}
			var ce struct {
				Error struct{ Code, Message string }
			}
			if json.Unmarshal(b, &ce) != nil || ce.Error.Message == "" {
				t.Errorf("not an error body: %s", trim(string(b)))
			}
		})
	}
	if out := e.exec(id, "cat d/sub/a.txt; ls -A /tmp | grep -c x; ls -A .. | grep -c escape"); out != "hi\n0\n0\n" {
		t.Errorf("an attack changed something: %q", out)
	}

	// Past the bound: refused before a byte is written.
	code, b, _ = e.req("alice", "PUT", base+"/upload/huge.bin", io.LimitReader(zeros{}, rest.MaxUpload+1), rest.MaxUpload+1)
	if code != http.StatusRequestEntityTooLarge || !strings.Contains(string(b), "1 GiB") {
		t.Errorf("huge upload: %d %s", code, b)
	}
}

// An upload into a full disk is a clear 507, and the file it would have
// replaced is as it was, with no part of the upload left behind.
func TestUploadIntoFullDiskLosesNothing(t *testing.T) {
	e, id := newTransferEnv(t, &app.Options{Limits: app.Limits{Tenant: app.TenantLimits{Disk: 64 << 20}}})
	base := "/v1/sessions/" + id
	e.exec(id, "echo keep > keep.txt")
	if out := e.exec(id, "head -c 70M /dev/zero > fill 2>/dev/null; echo rc=$?"); out != "rc=1\n" {
		t.Skipf("no kernel disk quota here: writing 70 MiB into a 64 MiB quota: %q", out)
	}
	code, b, _ := e.req("alice", "PUT", base+"/upload/keep.txt", bytes.NewReader(make([]byte, 6<<20)), -1)
	if code != http.StatusInsufficientStorage || !strings.Contains(string(b), "no space left on the session's disk") {
		t.Errorf("upload into the full disk: %d %s", code, b)
	}
	if out := e.exec(id, "cat keep.txt; ls -A | grep -c quro-upload"); out != "keep\n0\n" {
		t.Errorf("after the refused upload: %q", out)
	}
}

type zeros struct{}

func (zeros) Read(p []byte) (int, error) { clear(p); return len(p), nil }

// untar maps an archive's names to their content ("dir", "-> target").
func untar(t *testing.T, b []byte) map[string]string {
	t.Helper()
	zr, err := gzip.NewReader(bytes.NewReader(b))
	if err != nil {
		t.Fatalf("not gzip: %v", err)
	}
	tr := tar.NewReader(zr)
	m := map[string]string{}
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return m
		}
		if err != nil {
			t.Fatalf("archive: %v", err)
		}
		switch h.Typeflag {
		case tar.TypeDir:
			m[h.Name] = "dir"
		case tar.TypeSymlink:
			m[h.Name] = "-> " + h.Linkname
		default:
			c, _ := io.ReadAll(tr)
			m[h.Name] = string(c)
		}
	}
}
