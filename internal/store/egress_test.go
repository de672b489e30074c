package store

import (
	"context"
	"path/filepath"
	"testing"
	"time"
)

// TestEgressInTheOrderConnectionsStarted: an allowed connection's row is
// written when it closes, after a refusal that came later; the log still
// reads in the order the connections started, and Limit takes the latest
// by that order.
func TestEgressInTheOrderConnectionsStarted(t *testing.T) {
	s := open(t, filepath.Join(t.TempDir(), "quro.db"))
	ctx := context.Background()
	t0 := time.Now().Truncate(time.Microsecond)
	refused := EgressEntry{Session: "s", Start: t0.Add(30 * time.Millisecond), Dest: "169.254.169.254:80", Decision: "denied"}
	allowed := EgressEntry{Session: "s", Start: t0, Dest: "allowed.test:80", Decision: "allowed", Duration: 70 * time.Millisecond}
	for _, e := range []EgressEntry{refused, allowed} { // written in the order they ended
		if err := s.AppendEgress(ctx, []EgressEntry{e}, EgressKeep{}); err != nil {
			t.Fatal(err)
		}
	}
	all, err := s.Egress(ctx, EgressFilter{Session: "s"})
	if err != nil || len(all) != 2 || all[0].Dest != allowed.Dest || all[1].Dest != refused.Dest {
		t.Fatalf("the log: %+v, %v; want the allowed connection (started first) first", all, err)
	}
	if latest, err := s.Egress(ctx, EgressFilter{Session: "s", Limit: 1}); err != nil || len(latest) != 1 || latest[0].Dest != refused.Dest {
		t.Errorf("the latest one: %+v, %v; want the refusal (started last)", latest, err)
	}
}
