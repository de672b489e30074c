package cluster

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
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

// TestPinReadsShareOneList: handshakes that wait for the Leases at once
// share one List, and one that arrives after a List began waits for the
// next, which comes a period after the last (the API server's load is a
// List per period, however many certificates arrive).
func TestPinReadsShareOneList(t *testing.T) {
	t.Parallel()
	var lists atomic.Int32
	p := &pinReads{every: time.Millisecond, list: func(context.Context) (map[string]Node, error) {
		n := lists.Add(1)
		return map[string]Node{"n": {Name: "n", Pin: strconv.Itoa(int(n))}}, nil
	}}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	at := time.Now()
	var wg sync.WaitGroup
	pins := make(chan string, 64)
	for range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			nodes, err := p.after(ctx, at)
			if err != nil {
				t.Error(err)
				return
			}
			pins <- nodes["n"].Pin
		}()
	}
	wg.Wait()
	close(pins)
	for pin := range pins {
		if pin != "1" {
			t.Fatalf("a handshake got the List %s (want the one they share)", pin)
		}
	}
	if n := lists.Load(); n != 1 {
		t.Fatalf("64 handshakes at once made %d Lists", n)
	}
	nodes, err := p.after(ctx, time.Now())
	if err != nil || nodes["n"].Pin != "2" || lists.Load() != 2 {
		t.Fatalf("a handshake after the List: %v %v, %d Lists", nodes, err, lists.Load())
	}
}
