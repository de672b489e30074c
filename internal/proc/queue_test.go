package proc

import (
	"errors"
	"strings"
	"testing"
)

// A process of table t with no program behind it: emit is what the
// sandbox's output copy calls, so the queue logic runs as it does for a
// real process, chunk by chunk, exactly.
func fakeProcess(t *Table, pid int) *Process {
	return &Process{t: t, pid: pid, viewers: map[*Viewer]struct{}{}, done: make(chan struct{})}
}

// drain reads what v has queued, telling it consumed; it returns the
// bytes and whether v's channel is closed.
func drain(v *Viewer) (got string, closed bool) {
	var b strings.Builder
	for {
		select {
		case ev, ok := <-v.C:
			if !ok {
				return b.String(), true
			}
			b.Write(ev.Data)
			v.Consumed(len(ev.Data))
		default:
			return b.String(), false
		}
	}
}

// A viewer that does not read is detached once the bytes waiting for it
// pass the table's queue, with the reason in its error; one that reads
// keeps up however much passes, and the process is never held up.
func TestQueueDropsByBytes(t *testing.T) {
	tab := newTable(DefaultMax, 4<<10)
	p := fakeProcess(tab, 7)
	slow, fast := p.attachLocked(), p.attachLocked()
	chunk := strings.Repeat("x", 3000)
	total := 0
	for range 10 {
		p.emit("stdout", []byte(chunk))
		got, closed := drain(fast)
		if closed || got != chunk {
			t.Fatalf("the reading viewer got %d bytes (closed %v)", len(got), closed)
		}
		total += len(got)
	}
	if fast.Err() != nil {
		t.Fatalf("the reading viewer: %v", fast.Err())
	}
	got, closed := drain(slow)
	if !closed || got != chunk {
		t.Fatalf("the slow viewer got %d bytes before it was detached (closed %v); want the first chunk only", len(got), closed)
	}
	err := slow.Err()
	if !errors.Is(err, ErrLagged) || !strings.Contains(err.Error(), "5 KiB of process 7's output waited for this reader (at most 4 KiB may)") {
		t.Fatalf("the slow viewer's reason: %v", err)
	}
	if len(p.viewers) != 1 {
		t.Fatalf("%d viewers left, want the reading one", len(p.viewers))
	}
}

// However small its pieces, output queues at most maxQueuedChunks of them
// for a viewer: the reason then counts pieces, not bytes (it is far from
// the byte bound).
func TestQueueDropsByChunks(t *testing.T) {
	tab := newTable(DefaultMax, DefaultQueue)
	p := fakeProcess(tab, 9)
	slow, fast := p.attachLocked(), p.attachLocked()
	for range maxQueuedChunks + 1 {
		p.emit("stderr", []byte("."))
		if got, closed := drain(fast); closed || got != "." {
			t.Fatalf("the reading viewer: %q (closed %v)", got, closed)
		}
	}
	got, closed := drain(slow)
	if !closed || len(got) != maxQueuedChunks {
		t.Fatalf("the slow viewer got %d pieces (closed %v), want %d then the end", len(got), closed, maxQueuedChunks)
	}
	err := slow.Err()
	if !errors.Is(err, ErrLagged) || !strings.Contains(err.Error(), "4097 pieces of process 9's output waited for this reader (at most 4096 may") {
		t.Fatalf("the slow viewer's reason: %v", err)
	}
	if fast.Err() != nil || len(p.viewers) != 1 {
		t.Fatalf("the reading viewer: %v; %d viewers left", fast.Err(), len(p.viewers))
	}
	// A viewer that detaches itself has no error; nothing more reaches it.
	fast.Detach()
	p.emit("stdout", []byte("after"))
	if got, closed := drain(fast); !closed || got != "" || fast.Err() != nil {
		t.Fatalf("a detached viewer: %q closed %v err %v", got, closed, fast.Err())
	}
}

// BenchmarkAttachFollow is what a followed process (an E2B commands.run, a
// start_process that waits for its end) costs its viewer's queue: attach,
// one chunk of output, the end. Its B/op is the queue's buffer, allocated
// and cleared whole at attach.
//
//	go test -run '^$' -bench AttachFollow -benchmem ./internal/proc/
func BenchmarkAttachFollow(b *testing.B) {
	tab := newTable(DefaultMax, DefaultQueue)
	b.ReportAllocs()
	for b.Loop() {
		p := fakeProcess(tab, 9)
		p.mu.Lock()
		v := p.attachLocked()
		p.mu.Unlock()
		p.emit("stdout", []byte("hello\n"))
		if got, _ := drain(v); got != "hello\n" {
			b.Fatalf("got %q", got)
		}
		v.Detach()
	}
}
