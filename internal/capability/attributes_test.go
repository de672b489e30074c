package capability

import (
	"context"
	"slices"
	"testing"
)

// TestStreamingIsDeclared: a capability streams only when its
// registration says so, and the registry lists those that do, which is
// what the WebSocket stream route offers.
func TestStreamingIsDeclared(t *testing.T) {
	r := NewRegistry()
	r.Register(greet())
	if c, _ := r.Get("greet"); c.Streams {
		t.Error("greet streams without declaring it")
	}
	for _, name := range []string{"tail", "follow"} {
		c := New(name, "Stream.", ScopeExec, func(context.Context, in) (out, error) { return out{}, nil })
		if got := c.Streaming(); got != c || !c.Streams {
			t.Fatalf("Streaming returned %p (streams=%v), want the capability itself streaming", got, c.Streams)
		}
		r.Register(c)
	}
	if got := r.Streaming(); !slices.Equal(got, []string{"follow", "tail"}) {
		t.Errorf("Streaming() = %v, want [follow tail]", got)
	}
	if got := NewRegistry().Streaming(); len(got) != 0 {
		t.Errorf("an empty registry streams %v", got)
	}
}
