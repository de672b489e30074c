package rest_test

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/http/httptrace"
	"net/textproto"
	"net/url"
	"slices"
	"strconv"
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

// TestPreviewCookiesStayOnTheirHost runs a box's cookie attacks on the host
// form through a cookie jar that keeps the browsers' domain rules: a box
// setting cookies with a Domain attribute for the preview domain (or its
// own host, or the proxy's name) has them kept on its own host alone, so
// that they reach neither another preview (another port, another
// session) nor the domain itself; and a quro_preview cookie a page of
// another preview set for the whole domain, sent first, does not shadow
// this host's own.
func TestPreviewCookiesStayOnTheirHost(t *testing.T) {
	box := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/set" {
			for _, line := range []string{
				"toss=1; Domain=preview.test; Path=/",
				"dot=1; Domain=.preview.test; Path=/",
				"self=1; Domain=8080-s1.preview.test; Path=/",
				"quro_preview=forged; Domain=preview.test; Path=/",
				"plain=1; Path=/app",
			} {
				w.Header().Add("Set-Cookie", line)
			}
		}
		w.Write([]byte("cookie=" + r.Header.Get("Cookie")))
	}))
	t.Cleanup(box.Close)
	auth := func(r *http.Request) (controller.Caller, error) {
		if r.Header.Get("Authorization") == "Bearer good" {
			return controller.Caller{Tenant: "t", Scope: capability.ScopeExec}, nil
		}
		return controller.Caller{}, capability.Errorf(capability.Unauthenticated, "no token")
	}
	ph := rest.NewPreviewHost(rest.Access{Auth: auth}, "preview.test", &fakeBox{addr: box.Listener.Addr().String()}, nil)
	srv := httptest.NewServer(ph)
	t.Cleanup(srv.Close)
	jar, err := cookiejar.New(nil) // no public suffix list: preview.test is a registrable domain
	if err != nil {
		t.Fatal(err)
	}
	client := &http.Client{Jar: jar, Transport: &http.Transport{DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, network, srv.Listener.Addr().String())
	}}}
	do := func(u string, hdr ...string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest("GET", u, nil)
		for i := 0; i+1 < len(hdr); i += 2 {
			req.Header.Add(hdr[i], hdr[i+1])
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		for _, line := range resp.Header.Values("Set-Cookie") {
			if strings.Contains(strings.ToLower(line), "domain=") {
				t.Errorf("the proxy passed a Domain attribute: %q", line)
			}
		}
		return resp.StatusCode, string(b)
	}
	if code, body := do("http://8080-s1.preview.test/set", "Authorization", "Bearer good"); code != 200 {
		t.Fatalf("set: %d %s", code, body)
	}
	own, _ := url.Parse("http://8080-s1.preview.test/app/x")
	var names []string
	for _, c := range jar.Cookies(own) {
		names = append(names, c.Name+"="+c.Value)
	}
	slices.Sort(names)
	if strings.Join(names, " ") != "dot=1 plain=1 self=1 toss=1" {
		t.Errorf("the box's own host keeps %q", names)
	}
	for _, other := range []string{"http://8081-s1.preview.test/", "http://8080-s2.preview.test/", "http://preview.test/", "http://api.preview.test/"} {
		u, _ := url.Parse(other)
		if cs := jar.Cookies(u); len(cs) != 0 {
			t.Errorf("the box's cookies reach %s: %v", other, cs)
		}
	}

	// Shadowing: another preview's page set quro_preview for the whole
	// domain with a longer path; this host's own signature still admits.
	plain := &http.Client{Transport: client.Transport}
	req, _ := http.NewRequest("GET", "http://8080-s1.preview.test/app/x", nil)
	req.Header.Set("Cookie", "quro_preview=tossed; quro_preview=sig")
	resp, err := plain.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || strings.Contains(string(b), "quro_preview") {
		t.Errorf("a tossed cookie ahead of the host's own: %d %s", resp.StatusCode, b)
	}
}

// TestPreviewHostMatch: the names a browser or a client may send for a
// preview host (case, a port, a trailing dot, the domain itself, deeper
// names, signs and padding in the port) match the host form only as
// PORT-ID.DOMAIN; and with https preview URLs (Secure) the signature's
// cookie is Secure though the request reached the server over plain
// HTTP (TLS in front).
func TestPreviewHostMatch(t *testing.T) {
	ph := rest.NewPreviewHost(rest.Access{}, "Preview.Test.", &fakeBox{}, nil)
	for host, want := range map[string]string{
		"8080-s1.preview.test":                 "s1 8080",
		"8080-S1.PREVIEW.TEST":                 "s1 8080",
		"8080-s1.preview.test:443":             "s1 8080",
		"53-s1.preview.test":                   "s1 53", // refused by the backend (previewPort), not here
		"8080-s1.preview.test.":                "",
		"8080-s1.preview.test.:80":             "",
		"preview.test":                         "",
		".preview.test":                        "",
		"8080-.preview.test":                   "",
		"-s1.preview.test":                     "",
		"08080-s1.preview.test":                "",
		"+8080-s1.preview.test":                "",
		"8080-s1.x.preview.test":               "",
		"8080-s1.preview.test.evil":            "",
		"8080-s1.preview.testx":                "",
		"8080-s1xpreview.test":                 "",
		"8080-s1.preview.test@evil":            "",
		"99999999999999999999-s1.preview.test": "",
	} {
		id, port, ok := ph.Match(&http.Request{Host: host})
		got := ""
		if ok {
			got = id + " " + strconv.Itoa(port)
		}
		if got != want {
			t.Errorf("Host %q: matched %q, want %q", host, got, want)
		}
	}

	box := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	t.Cleanup(box.Close)
	ph = rest.NewPreviewHost(rest.Access{}, "preview.test", &fakeBox{addr: box.Listener.Addr().String()}, nil)
	ph.Secure = true
	req := httptest.NewRequest("GET", "http://8080-s1.preview.test/?quro_preview=sig", nil)
	rec := httptest.NewRecorder()
	ph.ServeHTTP(rec, req)
	var ck *http.Cookie
	for _, c := range rec.Result().Cookies() {
		if c.Name == rest.PreviewParam {
			ck = c
		}
	}
	if rec.Code != 200 || ck == nil || !ck.Secure || !ck.HttpOnly || ck.Domain != "" {
		t.Errorf("the cookie of an https preview over plain HTTP: %d %+v", rec.Code, ck)
	}
}

// TestPreviewEarlyHintsCarryNoCookie: a box answering 103 Early Hints
// with a cookie for the whole preview domain before its response (which
// the proxy passes on as it comes) has the hint's Link reach the client
// and its cookie dropped.
func TestPreviewEarlyHintsCarryNoCookie(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				if _, err := http.ReadRequest(bufio.NewReader(c)); err != nil {
					return
				}
				io.WriteString(c, "HTTP/1.1 103 Early Hints\r\nLink: </a.css>; rel=preload\r\nSet-Cookie: toss=1; Domain=preview.test; Path=/\r\n\r\n"+
					"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
			}()
		}
	}()
	auth := func(r *http.Request) (controller.Caller, error) {
		return controller.Caller{Tenant: "t", Scope: capability.ScopeExec}, nil
	}
	srv := httptest.NewServer(rest.NewPreviewHost(rest.Access{Auth: auth}, "preview.test", &fakeBox{addr: ln.Addr().String()}, nil))
	t.Cleanup(srv.Close)
	var hints []http.Header
	ctx := httptrace.WithClientTrace(t.Context(), &httptrace.ClientTrace{Got1xxResponse: func(code int, h textproto.MIMEHeader) error {
		hints = append(hints, http.Header(h).Clone())
		return nil
	}})
	req, _ := http.NewRequestWithContext(ctx, "GET", srv.URL+"/", nil)
	req.Host = "8080-s1.preview.test"
	resp, err := http.DefaultTransport.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(b) != "ok" {
		t.Fatalf("through the proxy: %d %q", resp.StatusCode, b)
	}
	if len(hints) != 1 || hints[0].Get("Link") == "" || len(hints[0].Values("Set-Cookie")) != 0 {
		t.Errorf("the early hints that reached the client: %v", hints)
	}
}
