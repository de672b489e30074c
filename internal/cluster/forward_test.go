package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/quro-dev/quro/internal/capability"
	"github.com/quro-dev/quro/internal/controller"
)

// Router.Forward against an owner over real HTTP: the call goes to the
// owner's POST /v1/{capability} with the caller's credential and a
// header signed with the cluster's key, the owner's error comes back
// with its code and Retry-After, an owner that is down or lapsed is
// Unavailable with Retry-After, an answer past MaxReply is refused, and
// a session of this node, or of nobody, is not forwarded.
// Between real nodes on a real API server: TestCluster (build tag k8s).
func TestRouterForward(t *testing.T) {
	t.Parallel()
	key := []byte("the cluster's forwarding key....")
	check := &Router{Table: &staticTable{self: "b"}, Key: key}
	owner := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !check.signed(r.Header.Values(HeaderForwardedBy)) || r.Header.Get("Authorization") != "Bearer tok" || r.Header.Get(HeaderForwardedPath) != "mcp" {
			w.WriteHeader(http.StatusForbidden)
			fmt.Fprint(w, `{"error":{"code":"permission_denied","message":"not signed by this cluster, or no token"}}`)
			return
		}
		var in map[string]any
		json.NewDecoder(r.Body).Decode(&in)
		switch in["session"] {
		case "busy":
			w.Header().Set("Retry-After", "7")
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprint(w, `{"error":{"code":"unavailable","message":"not yet"}}`)
		case "huge":
			fmt.Fprintf(w, `{"text":%q}`, strings.Repeat("x", 4096))
		default:
			fmt.Fprintf(w, `{"path":%q,"session":%q}`, r.URL.Path, in["session"])
		}
	}))
	defer owner.Close()
	dead, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	deadAddr := dead.Addr().String()
	dead.Close()
	now := time.Now()
	addr := strings.TrimPrefix(owner.URL, "http://")
	rt := &Router{Key: key, MaxReply: 1024, Table: &staticTable{self: "a",
		sessions: map[string]*Session{
			"onb": {Spec: SessionSpec{Node: "b"}}, "busy": {Spec: SessionSpec{Node: "b"}}, "huge": {Spec: SessionSpec{Node: "b"}},
			"onc": {Spec: SessionSpec{Node: "c"}}, "ond": {Spec: SessionSpec{Node: "d"}}, "ona": {Spec: SessionSpec{Node: "a"}},
		},
		nodes: []Node{
			{Name: "a", Address: "unused", Renewed: now, TTL: time.Hour},
			{Name: "b", Address: addr, Renewed: now, TTL: time.Hour},
			{Name: "c", Address: addr, Renewed: now.Add(-time.Hour), TTL: time.Minute}, // lapsed
			{Name: "d", Address: deadAddr, Renewed: now, TTL: time.Hour},
		}}}
	ctx := controller.WithCredential(context.Background(), "Bearer tok")
	caller := controller.Caller{Path: "mcp", Tenant: "acme", Scope: capability.ScopeExec}
	call := func(ctx context.Context, ref string) (string, bool, error) {
		raw, ok, err := rt.Forward(ctx, caller, "run_code", ref, json.RawMessage(fmt.Sprintf(`{"session":%q}`, ref)))
		return string(raw), ok, err
	}

	if raw, ok, err := call(ctx, "onb"); !ok || err != nil || raw != `{"path":"/v1/run_code","session":"onb"}` {
		t.Fatalf("onb: %q %v %v", raw, ok, err)
	}
	for _, ref := range []string{"ona", "nobody"} {
		if _, ok, err := call(ctx, ref); ok || err != nil {
			t.Fatalf("%s was forwarded: %v %v", ref, ok, err)
		}
	}
	var ce *capability.Error
	if _, ok, err := call(ctx, "busy"); !ok || !errors.As(err, &ce) || ce.Code != capability.Unavailable || ce.RetryAfter != 7 || ce.Message != "not yet" {
		t.Fatalf("the owner's error: %v %v", ok, err)
	}
	for _, ref := range []string{"onc", "ond"} {
		if _, ok, err := call(ctx, ref); !ok || !errors.As(err, &ce) || ce.Code != capability.Unavailable || ce.RetryAfter == 0 {
			t.Fatalf("%s (owner down): %v %v", ref, ok, err)
		}
	}
	if _, ok, err := call(ctx, "huge"); !ok || !errors.As(err, &ce) || ce.Code != capability.Internal {
		t.Fatalf("an answer past MaxReply: %v %v", ok, err)
	}
	// Without the caller's credential the owner refuses: no node vouches.
	if _, ok, err := call(context.Background(), "onb"); !ok || !errors.As(err, &ce) || ce.Code != capability.PermissionDenied {
		t.Fatalf("no credential: %v %v", ok, err)
	}
	// Signed with another key: the owner refuses it.
	if _, ok, err := (&Router{Key: []byte("another cluster's key..........."), MaxReply: 1024, Table: rt.Table}).Forward(ctx, caller, "run_code", "onb", json.RawMessage(`{"session":"onb"}`)); !ok || !errors.As(err, &ce) || ce.Code != capability.PermissionDenied {
		t.Fatalf("another key: %v %v", ok, err)
	}
}
