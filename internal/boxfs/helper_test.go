package boxfs

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/quro-dev/quro/internal/boxfs/boxhelper"
	"github.com/quro-dev/quro/internal/workspace"
)

// served is a Starter running boxhelper.Serve in this process (the
// helper's own code, without a box) and counting its starts.
func served(t testing.TB) Starter {
	return func(lifetime context.Context, stdin, stdout *os.File) (int, <-chan struct{}, error) {
		in, out := dup(t, stdin), dup(t, stdout)
		done := make(chan struct{})
		go func() {
			defer close(done)
			boxhelper.Serve(in, out)
			in.Close()
			out.Close()
		}()
		context.AfterFunc(lifetime, func() { in.Close(); out.Close() })
		return os.Getpid(), done, nil
	}
}

// dup is a copy of f the caller may keep (the Helper closes its copies of
// the child's ends once started, as after a fork).
func dup(t testing.TB, f *os.File) *os.File {
	fd, err := syscall.Dup(int(f.Fd()))
	if err != nil {
		t.Fatal(err)
	}
	return os.NewFile(uintptr(fd), f.Name())
}

// TestHelperServes: one process serves every operation in turn, large
// content in both directions byte for byte; after Stop the next call
// starts another; after Close calls are refused.
func TestHelperServes(t *testing.T) {
	dir := t.TempDir()
	h := NewHelper(served(t), 0)
	b := New(context.Background(), h.Run, workspace.Options{MaxRead: 16 << 20, MaxWrite: 16 << 20})
	big := bytes.Repeat([]byte("0123456789abcdef"), 1<<20) // 16 MiB
	p := filepath.Join(dir, "sub", "big")
	if w, err := b.Write(p, big, false); err != nil || w.Size != int64(len(big)) || !w.Created {
		t.Fatalf("write: %+v %v", w, err)
	}
	c, err := b.Read(p, 0, 0)
	if err != nil || !bytes.Equal(c.Data, big) {
		t.Fatalf("read: %v (%d bytes)", err, len(c.Data))
	}
	if _, err := b.Read(filepath.Join(dir, "nope"), 0, 0); !errors.Is(err, workspace.ErrNotFound) {
		t.Errorf("read of a missing file: %v", err)
	}
	if l, err := b.List(dir, workspace.ListOptions{Depth: 2}); err != nil || len(l.Entries) != 2 {
		t.Errorf("list: %+v %v", l, err)
	}
	if h.Starts() != 1 {
		t.Errorf("%d starts, want 1", h.Starts())
	}
	h.Stop()
	if _, err := b.Info(p); err != nil || h.Starts() != 2 {
		t.Errorf("after Stop: %v, %d starts", err, h.Starts())
	}
	h.Close()
	if _, err := b.Info(p); !errors.Is(err, ErrHelper) {
		t.Errorf("after Close: %v", err)
	}
}

// FuzzFrames feeds Helper.Run whatever a helper process could write on
// its standard output: it returns an error or at most max bytes, never
// panics, and a process that broke the framing is not used again.
func FuzzFrames(f *testing.F) {
	f.Add([]byte{0, 0, 0, 0, 0, 0, 0, 0, 3, 'a', 'b', 'c'}, int64(3))
	f.Add([]byte{0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, int64(64))
	f.Add([]byte{2, 0, 0, 0, 0, 0, 0, 0, 0}, int64(64))
	f.Add([]byte{0, 0, 0, 0, 0, 0, 0, 0, 9, 'x'}, int64(64))
	f.Add([]byte{}, int64(1))
	f.Fuzz(func(t *testing.T, out []byte, max int64) {
		if max < 0 || max > 1<<20 {
			return
		}
		start := func(lifetime context.Context, stdin, stdout *os.File) (int, <-chan struct{}, error) {
			in, o := dup(t, stdin), dup(t, stdout)
			done := make(chan struct{})
			go func() {
				defer close(done)
				_, _ = o.Write(out)
				o.Close()
				_, _ = io.Copy(io.Discard, in)
				in.Close()
			}()
			context.AfterFunc(lifetime, func() { in.Close() })
			return 1, done, nil
		}
		h := NewHelper(start, 0)
		defer h.Close()
		var got bytes.Buffer
		code, err := h.Run(context.Background(), []string{boxhelper.Arg, "stat", "/tmp/f"}, []byte("in"), max, &got)
		if int64(got.Len()) > max {
			t.Fatalf("%d bytes past the bound %d", got.Len(), max)
		}
		if err == nil && code != 0 && code != 2 {
			t.Fatalf("code %d", code)
		}
		if err != nil && h.Running() {
			t.Fatalf("a helper that failed is still used")
		}
	})
}
