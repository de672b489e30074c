package events

import (
	"context"
	"strings"
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

// TestLateViewerGetsReplay: a viewer that subscribes after a session's
// calls began is sent the session's recent events first, marked replay,
// then the live ones, with no gap and none twice; another tenant naming
// the session gets nothing of it; the ring is bounded in events and in
// bytes, and Forget releases it.
func TestLateViewerGetsReplay(t *testing.T) {
	t.Parallel()
	b := New()
	b.Publish("acme", Event{Type: TypeOutput, Session: "s1", Call: "c0", Data: "before any call"}) // no ring yet: not kept
	b.Publish("acme", Event{Type: TypeCall, Session: "s1", Call: "c1", Capability: "terminal_exec", Input: map[string]any{"command": "make"}})
	b.Publish("acme", Event{Type: TypeOutput, Session: "s1", Call: "c1", Data: "building"})
	b.Publish("acme", Event{Type: TypeCall, Session: "s2", Call: "c2"})
	if b.Rings() != 2 {
		t.Fatalf("%d rings", b.Rings())
	}
	evil := b.SubscribeReplay("evil", 0, "s1")
	defer evil.Close()
	late := b.SubscribeReplay("acme", 0, "s1")
	defer late.Close()
	b.Publish("acme", Event{Type: TypeEnd, Session: "s1", Call: "c1", Outcome: "ok"})
	var got []Event
	for len(got) < 3 {
		got = append(got, next(t, late)...)
	}
	if len(got) != 3 || got[0].Call != "c1" || got[0].Type != TypeCall || !got[0].Replay || got[0].Input["command"] != "make" ||
		got[1].Data != "building" || !got[1].Replay || got[2].Type != TypeEnd || got[2].Replay || got[2].Seq <= got[1].Seq {
		t.Fatalf("the late viewer got %+v", got)
	}
	b.Publish("evil", Event{Type: TypeCall, Session: "s1", Call: "c9"}) // evil's own event on a session named alike
	if evs := next(t, evil); len(evs) != 1 || evs[0].Replay || evs[0].Call != "c9" {
		t.Fatalf("another tenant got %+v", evs)
	}

	// Bounded in events ...
	for i := 0; i < 3*ReplayEvents; i++ {
		b.Publish("acme", Event{Type: TypeOutput, Session: "s1", Call: "c1", Data: "x"})
	}
	b.ringMu.Lock()
	n := len(b.rings["s1"].evs)
	b.ringMu.Unlock()
	if n != ReplayEvents {
		t.Fatalf("the ring keeps %d events", n)
	}
	// ... and in bytes.
	big := strings.Repeat("y", 16<<10)
	for i := 0; i < 100; i++ {
		b.Publish("acme", Event{Type: TypeOutput, Session: "s1", Call: "c1", Data: big})
	}
	b.ringMu.Lock()
	r := b.rings["s1"]
	sum := 0
	for i := range r.evs {
		sum += size(&r.evs[i])
	}
	bytes, kept := r.bytes, len(r.evs)
	b.ringMu.Unlock()
	if bytes != sum || bytes > ReplayBytes || kept >= 100 {
		t.Fatalf("the ring holds %d bytes (counted %d) in %d events", sum, bytes, kept)
	}
	b.Forget("s1")
	b.Forget("s2")
	if b.Rings() != 0 {
		t.Fatalf("%d rings after Forget", b.Rings())
	}
	again := b.SubscribeReplay("acme", 0, "s1")
	defer again.Close()
	b.Publish("acme", Event{Type: TypeOutput, Session: "s1", Call: "c1", Data: "after"}) // not a call: makes no ring
	if evs := next(t, again); len(evs) != 1 || evs[0].Replay || b.Rings() != 0 {
		t.Fatalf("after Forget: %+v, %d rings", evs, b.Rings())
	}
}

// TestForgottenSessionMakesNoRing: a call that entered its session just
// before a destroy (calls that only read, or change a setting, are not
// waited for: destroy_session itself, set_session_timeout, a second
// destroy) publishes its call event after the session's end released its
// ring. Such a call event must not make the ring again: nothing would
// release it, and a tenant repeating the race would grow the server's
// memory by a ring a session.
func TestForgottenSessionMakesNoRing(t *testing.T) {
	t.Parallel()
	b := New()
	b.Publish("acme", Event{Type: TypeCall, Session: "s1", Call: "c1"})
	b.Forget("s1")
	b.Publish("acme", Event{Type: TypeCall, Session: "s1", Call: "c2"}) // the racing call
	b.Publish("acme", Event{Type: TypeEnd, Session: "s1", Call: "c2"})
	if b.Rings() != 0 {
		t.Fatalf("%d rings for a session its end forgot", b.Rings())
	}
	// Another session's still makes its own.
	b.Publish("acme", Event{Type: TypeCall, Session: "s2", Call: "c3"})
	if b.Rings() != 1 {
		t.Fatalf("%d rings", b.Rings())
	}
}
