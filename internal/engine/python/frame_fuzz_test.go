//go:build !slim

package python

import (
	"bufio"
	"encoding/binary"
	"errors"
	"os"
	"runtime"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// frameReader is a worker whose reply pipe holds exactly b (a memfd, so
// that any amount fits without a writer goroutine).
func frameReader(t *testing.T, b []byte) *worker {
	t.Helper()
	fd, err := unix.MemfdCreate("frames", unix.MFD_CLOEXEC)
	if err != nil {
		t.Skip("memfd_create:", err)
	}
	f := os.NewFile(uintptr(fd), "frames")
	t.Cleanup(func() { f.Close() })
	if _, err := f.Write(b); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Seek(0, 0); err != nil {
		t.Fatal(err)
	}
	return &worker{rep: f, repBuf: bufio.NewReader(f)}
}

func encodeFrame(body string) []byte {
	b := binary.BigEndian.AppendUint32(nil, uint32(len(body)))
	return append(b, body...)
}

// FuzzReadFrame: whatever the box writes on the reply pipe, readFrame
// returns frames or an error, never panics, and refuses a length above
// maxFrame before reading or allocating it.
func FuzzReadFrame(f *testing.F) {
	for _, s := range [][]byte{
		encodeFrame(`{"op":"hello","pid":7,"version":"3.12"}`),
		encodeFrame(`{"op":"done","id":1,"status":"ok","artifacts":[{"path":"a.png"}]}`),
		append(encodeFrame(`{"op":"hello"}`), encodeFrame(`{"op":"done","id":2}`)...),
		encodeFrame(`not json`),
		encodeFrame(``),
		{0xff, 0xff, 0xff, 0xff},
		binary.BigEndian.AppendUint32(nil, maxFrame+1),
		binary.BigEndian.AppendUint32(nil, 100), // a length and no body
		{0, 0},
		{},
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		w := frameReader(t, b)
		rest := b
		for {
			fr, err := w.readFrame()
			if err != nil {
				if errors.Is(err, errBadFrame) && len(rest) >= 4 && binary.BigEndian.Uint32(rest) <= maxFrame {
					return // a complete frame refused for its shape
				}
				if len(rest) >= 4 {
					if n := binary.BigEndian.Uint32(rest); n > maxFrame && !strings.Contains(err.Error(), "reply frame of") {
						t.Fatalf("oversize %d: %v", n, err)
					} else if n <= maxFrame && int(n) <= len(rest)-4 {
						t.Fatalf("a complete frame failed: %v", err)
					}
				}
				return
			}
			if len(rest) < 4 {
				t.Fatalf("a frame from %d bytes", len(rest))
			}
			n := binary.BigEndian.Uint32(rest)
			if n > maxFrame || int(n) > len(rest)-4 {
				t.Fatalf("accepted a frame of %d bytes from %d", n, len(rest))
			}
			if fr.Op == "" && fr.Error != "" {
				t.Fatalf("%+v", fr)
			}
			rest = rest[4+n:]
		}
	})
}

// TestOversizeFrameIsNotAllocated: a length header of 4 GiB is refused
// without reserving it.
func TestOversizeFrameIsNotAllocated(t *testing.T) {
	w := frameReader(t, []byte{0xff, 0xff, 0xff, 0xff})
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	_, err := w.readFrame()
	runtime.ReadMemStats(&after)
	if err == nil || !strings.Contains(err.Error(), "reply frame of 4294967295 bytes") {
		t.Fatalf("%v", err)
	}
	if grew := after.TotalAlloc - before.TotalAlloc; grew > 1<<20 {
		t.Fatalf("refusing the frame allocated %d bytes", grew)
	}
}

// A frame within maxFrame whose body never comes must not make the server
// reserve what its header announced.
func TestAnnouncedFrameIsNotReservedUpFront(t *testing.T) {
	w := frameReader(t, append(binary.BigEndian.AppendUint32(nil, maxFrame), `{"op":"x"`...))
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	_, err := w.readFrame()
	runtime.ReadMemStats(&after)
	if err == nil {
		t.Fatal("a truncated frame was accepted")
	}
	if grew := after.TotalAlloc - before.TotalAlloc; grew > 1<<20 {
		t.Fatalf("reading 9 bytes of a frame that announced %d allocated %d bytes", maxFrame, grew)
	}
}
