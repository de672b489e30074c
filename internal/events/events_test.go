package events

import (
	"context"
	"testing"
	"time"
)

func next(t *testing.T, s *Sub) []Event {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	evs, err := s.Next(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return evs
}

// TestTenantSeesOnlyItsOwn: a subscriber of another tenant (or of the
// single-user tenant "") gets none of a tenant's events.
func TestTenantSeesOnlyItsOwn(t *testing.T) {
	t.Parallel()
	b := New()
	mine := b.Subscribe("acme", 0)
	defer mine.Close()
	other := b.Subscribe("evil", 0)
	defer other.Close()
	none := b.Subscribe("", 0)
	defer none.Close()
	if b.Watched("nobody") || !b.Watched("acme") {
		t.Fatal("Watched is wrong")
	}
	b.Publish("acme", Event{Type: TypeCall, Session: "s1", Capability: "terminal_exec", Input: map[string]any{"command": "echo secret"}})
	b.Publish("evil", Event{Type: TypeCall, Session: "s2"})
	evs := next(t, mine)
	if len(evs) != 1 || evs[0].Session != "s1" || evs[0].Seq == 0 || evs[0].Time.IsZero() {
		t.Fatalf("acme got %+v", evs)
	}
	// evil's own event comes, and nothing of acme's before it.
	evs = next(t, other)
	if len(evs) != 1 || evs[0].Session != "s2" {
		t.Fatalf("evil got %+v", evs)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if evs, err := none.Next(ctx); err == nil {
		t.Fatalf("the tenant \"\" got %+v", evs)
	}
}

// TestSlowViewerDrops: a subscriber that reads nothing never blocks the
// publisher; it keeps the oldest events up to its queue and is told how
// many it lost, and it reads on normally afterwards.
func TestSlowViewerDrops(t *testing.T) {
	t.Parallel()
	b := New()
	slow := b.Subscribe("t", 4)
	defer slow.Close()
	fast := b.Subscribe("t", 0)
	defer fast.Close()
	for i := 0; i < 1000; i++ { // would block forever if Publish waited
		b.Publish("t", Event{Type: TypeOutput, Data: "x"})
	}
	evs := next(t, slow)
	if len(evs) != 5 || evs[4].Type != TypeDropped || evs[4].Dropped != 996 {
		t.Fatalf("slow viewer got %d events, last %+v", len(evs), evs[len(evs)-1])
	}
	for i := 1; i < 4; i++ {
		if evs[i].Seq != evs[i-1].Seq+1 {
			t.Fatalf("kept events out of order: %+v", evs[:4])
		}
	}
	if got := next(t, fast); len(got) != 1000 {
		t.Fatalf("fast viewer got %d events", len(got))
	}
	b.Publish("t", Event{Type: TypeEnd})
	if evs := next(t, slow); len(evs) != 1 || evs[0].Type != TypeEnd {
		t.Fatalf("after the drop: %+v", evs)
	}
	slow.Close()
	if b.Publish("t", Event{}); len(b.subs["t"]) != 1 {
		t.Fatalf("a closed subscriber is still on the bus")
	}
}
