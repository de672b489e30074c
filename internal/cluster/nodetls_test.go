package cluster

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// TestNodeTrafficOnThePublicPortIsRefused: with node traffic over mutual
// TLS (Router.TLS, Drainer.TLS), a request on the public port that
// carries a node's header is refused even when the cluster's key signed
// it (a key that leaked is not enough), and so is a move: both come from
// the node port alone (the pinned side of it is TestClusterNodeTLS).
func TestNodeTrafficOnThePublicPortIsRefused(t *testing.T) {
	t.Parallel()
	nt, err := NewNodeTLS("a")
	if err != nil {
		t.Fatal(err)
	}
	key := []byte("0123456789abcdef0123456789abcdef")
	var served atomic.Int32
	rt := &Router{Table: &staticTable{self: "a"}, Key: key, TLS: nt,
		Next: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { served.Add(1) })}
	d := &Drainer{TLS: nt, Key: key}
	mux := http.NewServeMux()
	mux.Handle(MovePath, d)
	mux.Handle("/", rt)
	public := httptest.NewServer(mux)
	defer public.Close()
	do := func(method, path string, hdr ...string) (int, string) {
		req, _ := http.NewRequest(method, public.URL+path, strings.NewReader("{}"))
		for i := 0; i+1 < len(hdr); i += 2 {
			req.Header.Add(hdr[i], hdr[i+1])
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	signed := rt.forwardedBy()
	if !rt.signed([]string{signed}) {
		t.Fatal("the header is not signed with the key: the test would prove nothing")
	}
	for _, path := range []string{"/v1/sessions", "/v1/sessions/s1/files/x"} {
		if code, body := do("POST", path, HeaderForwardedBy, signed); code != http.StatusForbidden || !strings.Contains(body, "node port") {
			t.Errorf("a signed forward on the public port, %s: %d %s", path, code, body)
		}
	}
	if n := served.Load(); n != 0 {
		t.Fatalf("the public port served %d forwarded requests", n)
	}
	sig := MoveSignature(key, "b", "a", "s1", time.Now())
	if code, body := do("PUT", MovePath+"s1", MoveHeader, sig); code != http.StatusForbidden || !strings.Contains(body, "node port") {
		t.Fatalf("a signed move on the public port: %d %s", code, body)
	}
}
