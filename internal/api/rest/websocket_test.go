package rest_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"testing"

	"github.com/quro-dev/quro/internal/api/rest"
	"github.com/quro-dev/quro/internal/capability"
	"github.com/quro-dev/quro/internal/controller"
)

// TestWebSocketRoutesGoToTheirHandlers: each WebSocket route of the table
// is served by the handler given for its kind, and a kind without one
// answers 404 like any unknown route.
func TestWebSocketRoutesGoToTheirHandlers(t *testing.T) {
	named := func(name string) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, name) })
	}
	srv := httptest.NewServer(rest.New(controller.New(fakeRegistry(), nil), &rest.Options{
		WebSocket: map[rest.WebSocket]http.Handler{rest.WebSocketPTY: named("pty handler")},
	}))
	defer srv.Close()
	if r := do(t, "GET", srv.URL+"/v1/sessions/s1/pty", "", ""); r.status != 200 || r.body != "pty handler" {
		t.Errorf("pty route: %d %q", r.status, r.body)
	}
	if r := do(t, "GET", srv.URL+"/v1/stream/run_code", "", ""); r.status != 404 {
		t.Errorf("stream route without a handler: %d %q", r.status, r.body)
	}
}

// TestStreamRouteFollowsTheRegistry: the stream route's {capability} lists
// the capabilities the registry declares as streaming, and with none the
// route is not in the document.
func TestStreamRouteFollowsTheRegistry(t *testing.T) {
	type none struct{}
	noop := func(context.Context, none) (*none, error) { return &none{}, nil }
	reg := capability.NewRegistry()
	reg.Register(capability.New("still", "Does not stream.", capability.ScopeRead, noop))
	// As served: plain JSON values.
	if doc := plain(rest.OpenAPI(reg, rest.Routes)); get(doc, "paths", "/v1/stream/{capability}") != nil {
		t.Errorf("the stream route is documented with nothing to stream: %v", get(doc, "paths", "/v1/stream/{capability}"))
	}
	reg.Register(capability.New("tail", "Streams.", capability.ScopeExec, noop).Streaming())
	reg.Register(capability.New("follow", "Streams.", capability.ScopeExec, noop).Streaming())
	doc := plain(rest.OpenAPI(reg, rest.Routes))
	if get(doc, "paths", "/v1/sessions/{id}/pty", "get") == nil {
		t.Error("the pty route is not in the document")
	}
	params, _ := get(doc, "paths", "/v1/stream/{capability}", "get", "parameters").([]any)
	if len(params) != 1 {
		t.Fatalf("parameters %v", params)
	}
	if enum := get(params[0], "schema", "enum"); !reflect.DeepEqual(enum, []any{"follow", "tail"}) {
		t.Errorf("streamable capabilities %v, want [follow tail]", enum)
	}
}
