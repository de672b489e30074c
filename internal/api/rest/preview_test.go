package rest_test

import (
	"bufio"
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/quro-dev/quro/internal/api/rest"
	"github.com/quro-dev/quro/internal/capability"
	"github.com/quro-dev/quro/internal/controller"
)

// fakeBox is a PreviewBackend whose one session's port is an HTTP
// server of the test's (the real box is in internal/app's
// TestPreviewURLs); the token "good" is its tenant's, the signature
// "sig" its only valid one.
type fakeBox struct{ addr string }

func (f *fakeBox) PreviewByCaller(_ context.Context, c controller.Caller, id string, port int) error {
	if c.Tenant != "t" || id != "s1" || port != 8080 {
		return capability.Errorf(capability.NotFound, "no session %s", id)
	}
	return nil
}

func (f *fakeBox) PreviewBySignature(_ context.Context, id string, port int, sig string) error {
	if sig != "sig" || id != "s1" || port != 8080 {
		return capability.Errorf(capability.Unauthenticated, "bad signature")
	}
	return nil
}

func (f *fakeBox) PreviewPublic(context.Context, string, int) bool { return false }

func (f *fakeBox) DialPreview(ctx context.Context, id string, port int) (net.Conn, error) {
	if id != "s1" || port != 8080 {
		return nil, errors.New("no such port")
	}
	var d net.Dialer
	return d.DialContext(ctx, "tcp", f.addr)
}

// TestPreviewProxyStreamsAndStrips: the proxy streams a response as the
// box flushes it, refuses a foreign origin and what does not
// authenticate, and forwards neither the Authorization header nor the
// signature (query or cookie).
func TestPreviewProxyStreamsAndStrips(t *testing.T) {
	next := make(chan struct{})
	box := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/stream" {
			w.Write([]byte("first\n"))
			w.(http.Flusher).Flush()
			<-next
			w.Write([]byte("second\n"))
			return
		}
		if r.URL.Path == "/go" {
			http.SetCookie(w, &http.Cookie{Name: "theirs", Value: "1", Path: "/"})
			http.SetCookie(w, &http.Cookie{Name: "quro_preview", Value: "forged", Path: "/"})
			http.Redirect(w, r, "/login", http.StatusFound)
			return
		}
		w.Write([]byte(r.URL.RequestURI() + " auth=" + r.Header.Get("Authorization") + " cookie=" + r.Header.Get("Cookie")))
	}))
	t.Cleanup(box.Close)
	auth := func(r *http.Request) (controller.Caller, error) {
		if r.Header.Get("Authorization") == "Bearer good" {
			return controller.Caller{Tenant: "t", Scope: capability.ScopeExec}, nil
		}
		return controller.Caller{}, capability.Errorf(capability.Unauthenticated, "no token")
	}
	mux := http.NewServeMux()
	mux.Handle(rest.PreviewPattern, rest.Preview(rest.Access{Auth: auth}, &fakeBox{addr: box.Listener.Addr().String()}, nil))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	get := func(path string, hdr ...string) (*http.Response, string) {
		t.Helper()
		req, _ := http.NewRequest("GET", srv.URL+path, nil)
		for i := 0; i+1 < len(hdr); i += 2 {
			req.Header.Set(hdr[i], hdr[i+1])
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var b strings.Builder
		_, _ = bufio.NewReader(resp.Body).WriteTo(&b)
		return resp, b.String()
	}
	const base = "/v1/sessions/s1/ports/8080/"
	if _, body := get(base+"a/b?x=1", "Authorization", "Bearer good", "Cookie", "mine=2"); body != "/a/b?x=1 auth= cookie=mine=2" {
		t.Errorf("with the token the box saw %q", body)
	}
	if _, body := get(base + "a?quro_preview=sig&y=2"); body != "/a?y=2 auth= cookie=" {
		t.Errorf("with the signature the box saw %q", body)
	}
	if _, body := get(base+"c", "Cookie", "mine=2; quro_preview=sig"); body != "/c auth= cookie=mine=2" {
		t.Errorf("with the cookie the box saw %q", body)
	}
	// The box's redirects and cookies stay under the prefix; it cannot
	// set the proxy's cookie.
	noRedirect := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	req, _ := http.NewRequest("GET", srv.URL+base+"go", nil)
	req.Header.Set("Authorization", "Bearer good")
	resp, err := noRedirect.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if loc := resp.Header.Get("Location"); loc != base+"login" {
		t.Errorf("redirect to %q", loc)
	}
	if sc := resp.Header.Values("Set-Cookie"); len(sc) != 1 || sc[0] != "theirs=1; Path="+base {
		t.Errorf("the box's cookies: %q", sc)
	}

	for what, c := range map[string]struct {
		path string
		hdr  []string
		want int
	}{
		"no credentials":   {base, nil, 401},
		"a bad signature":  {base + "?quro_preview=nope", nil, 401},
		"a bad cookie":     {base, []string{"Cookie", "quro_preview=nope"}, 401},
		"a foreign origin": {base, []string{"Authorization", "Bearer good", "Origin", "https://evil.example"}, 403},
		"another port":     {"/v1/sessions/s1/ports/8081/", []string{"Authorization", "Bearer good"}, 404},
		"not a port":       {"/v1/sessions/s1/ports/x/", []string{"Authorization", "Bearer good"}, 404},
	} {
		if resp, body := get(c.path, c.hdr...); resp.StatusCode != c.want {
			t.Errorf("%s: %d, want %d: %s", what, resp.StatusCode, c.want, body)
		}
	}

	// Streaming: the first line arrives before the box writes the second.
	req, _ = http.NewRequest("GET", srv.URL+base+"stream", nil)
	req.Header.Set("Authorization", "Bearer good")
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	rd := bufio.NewReader(resp.Body)
	if line, err := rd.ReadString('\n'); line != "first\n" {
		t.Fatalf("first line: %q %v", line, err)
	}
	close(next)
	if line, err := rd.ReadString('\n'); line != "second\n" {
		t.Errorf("second line: %q %v", line, err)
	}
}
