package terminal

import (
	"bytes"
	"strings"
	"testing"

	"github.com/charmbracelet/x/vt"
)

// hostile and normal inputs for the screen model, each about 64 KiB.
var vtInputs = []struct {
	name string
	data []byte
}{
	{"Normal", bytes.Repeat([]byte("total 48 drwxr-xr-x  5 user user 4096 Nov 30 12:00 \x1b[01;34msrc\x1b[0m\r\n"), 900)},
	{"REPFlood", bytes.Repeat([]byte("x\x1b[65535b"), 6500)},
	{"ScrollFlood", bytes.Repeat([]byte("\x1b[65535S"), 8000)},
	{"TabFlood", bytes.Repeat([]byte("\x1b[65535I\x1b[65535Z"), 4000)},
	{"EraseFlood", bytes.Repeat([]byte("\x1b[65535X\x1b[2J"), 5000)},
	{"LongCSIParams", []byte("\x1b[" + strings.Repeat("9999999999;", 6000) + "b")},
	{"DeepOSC", append(append([]byte("\x1b]0;"), bytes.Repeat([]byte("t"), 64<<10)...), 7)},
	{"ManyOSC", bytes.Repeat([]byte("\x1b]2;title\x07"), 6500)},
}

// BenchmarkVTModel is the screen model's parse throughput (counts clamped)
// on normal output and on floods; BenchmarkVTRaw is the unguarded emulator
// on the same inputs, for comparison.
//
//	go test -run '^$' -bench 'BenchmarkVT' -benchtime 20x ./internal/terminal/
func BenchmarkVTModel(b *testing.B) {
	for _, in := range vtInputs {
		b.Run(in.name, func(b *testing.B) {
			m := newModel(120, 32, 0)
			b.SetBytes(int64(len(in.data)))
			for b.Loop() {
				for p := in.data; len(p) > 0; {
					n := min(len(p), modelPiece)
					m.write(p[:n])
					p = p[n:]
				}
			}
			b.ReportMetric(float64(m.stats().RepeatCells)/float64(b.N), "REPcells/op")
		})
	}
}

func BenchmarkVTRaw(b *testing.B) {
	for _, in := range vtInputs {
		if in.name == "LongCSIParams" || in.name == "Normal" || in.name == "DeepOSC" || in.name == "ManyOSC" {
			continue // no counts to clamp: the same as the model
		}
		b.Run(in.name, func(b *testing.B) {
			e := vt.NewEmulator(120, 32)
			go drain(e)
			data := in.data[:min(len(in.data), 2048)] // unclamped, 64 KiB takes minutes
			b.SetBytes(int64(len(data)))
			for b.Loop() {
				e.Write(data)
			}
		})
	}
}

func drain(e *vt.Emulator) {
	buf := make([]byte, 4096)
	for {
		if _, err := e.Read(buf); err != nil {
			return
		}
	}
}

// A flood that outruns the parser is dropped from the model, oldest first,
// and counted; the queue never holds more than modelPending bytes, and the
// latest output is what stays.
func TestModelQueueIsBounded(t *testing.T) {
	m := newModel(80, 24, 0) // run is not started: nothing is parsed
	chunk := bytes.Repeat([]byte("y"), 32<<10)
	for range 20 {
		m.feed(chunk)
	}
	m.feed([]byte("LAST"))
	st := m.stats()
	if len(m.pending) != modelPending || st.Dropped != int64(20*len(chunk)+4-modelPending) || st.Read != int64(20*len(chunk)+4) {
		t.Fatalf("queue %d bytes, %+v", len(m.pending), st)
	}
	if !bytes.HasSuffix(m.pending, []byte("LAST")) {
		t.Fatal("the latest output was dropped")
	}
	// The shell ended: what is queued is parsed, or, past the budget,
	// dropped up to the last modelTail bytes; the final screen stays.
	go m.run()
	m.end()
	for {
		changed := m.changed()
		if st := m.stats(); st.Parsed+st.Dropped == st.Read {
			break
		}
		<-changed
	}
	if !strings.Contains(m.screen(), "LAST") {
		t.Fatalf("screen:\n%s", m.screen())
	}
}

// The model is never bigger than modelMaxCols x modelMaxRows, whatever a
// viewer asks for, and every count is cut to it.
func TestModelSizeAndCountsAreClamped(t *testing.T) {
	m := newModel(1000, 1000, 0)
	if w, h := m.emu.Width(), m.emu.Height(); w != modelMaxCols || h != modelMaxRows {
		t.Fatalf("model %dx%d", w, h)
	}
	m.resize(10, 3)
	m.write([]byte("\x1b[2;1Hab\x1b[99999999999999999999b\x1b[3;1H\x9b65535bZ"))
	// b repeated a screen width (10): 9 fill row 2, one wraps to row 3.
	// Then the raw C1 CSI (0x9b) REP, a CSI too, cut to 10 as well: 10 b's
	// on row 3, and Z wraps, scrolling the screen up one row.
	if got := m.screen(); got != "abbbbbbbbb\nbbbbbbbbbb\nZ" {
		t.Fatalf("screen:\n%q", got)
	}
	if st := m.stats(); st.RepeatCells != 20 || st.Clamped != 2 {
		t.Fatalf("%+v\n%s", st, m.screen())
	}
	m.resize(5000, 5000)
	if w, h := m.emu.Width(), m.emu.Height(); w != modelMaxCols || h != modelMaxRows {
		t.Fatalf("resized to %dx%d", w, h)
	}
}

// FuzzVTModel feeds arbitrary bytes to the screen model, split at an
// arbitrary point with a resize in between: it never panics (a recovered
// emulator panic counts as a failure here), and REP prints at most one
// screen width per sequence (a CSI takes at least two bytes: 0x9b b).
//
//	go test -run '^$' -fuzz FuzzVTModel -fuzztime 60s ./internal/terminal/
func FuzzVTModel(f *testing.F) {
	for _, in := range vtInputs {
		f.Add(in.data[:min(len(in.data), 512)], uint8(40), uint8(10), uint16(7))
	}
	for _, s := range []string{
		"x\x1b[65535b", "\x9b65535b", "\xc2\x9b65535b", "\x1b[1;65535r\x1b[65535L", "\x1b[?1049h\x1b[65535M\x1b[?1049l",
		"\x1b[8;1000;1000t", "\x1bP" + strings.Repeat("q", 300) + "\x1b\\", "\x1b]8;;http://x\x07link\x1b]8;;\x07",
		"\x1b[" + strings.Repeat(":", 100) + "b", "\x1b[?2048h\x1b[65535@\x1b[65535P", "é\x1b[99999b\u200d\x1b[5b",
		"\x1bH\x1bH\x1b[3g\x1b[65535I", "\x1b#8\x1b[65535T", "\x1b[4h\x1b[65535b",
	} {
		f.Add([]byte(s), uint8(80), uint8(24), uint16(3))
	}
	f.Fuzz(func(t *testing.T, data []byte, cols, rows uint8, split uint16) {
		m := newModel(int(cols), int(rows), 0)
		defer closeInput(m.emu)
		at := int(split) % (len(data) + 1)
		m.write(data[:at])
		m.resize(int(rows)*3, int(cols)/2) // 0 becomes 1
		m.write(data[at:])
		_ = m.screen()
		st := m.stats()
		if st.Panics != 0 {
			t.Fatalf("the emulator panicked on %q", data)
		}
		widest := int64(max(int(cols), int(rows)*3, 1))
		if st.RepeatCells > int64(len(data)/2+1)*widest {
			t.Fatalf("REP printed %d cells for %d bytes", st.RepeatCells, len(data))
		}
	})
}

// BenchmarkVTScreenDuringFlood is read_screen's latency (ns/op) while the
// model parses a REP flood as fast as its budget lets it: the reader waits
// for one piece at most, never for the flood.
func BenchmarkVTScreenDuringFlood(b *testing.B) {
	m := newModel(120, 32, 0)
	go m.run()
	stop := make(chan struct{})
	fed := make(chan struct{})
	flood := bytes.Repeat([]byte("x\x1b[65535b\x1b[65535S\x1b[2J"), 1500)
	go func() {
		defer close(fed)
		for {
			select {
			case <-stop:
				return
			default:
			}
			m.feed(flood)
			<-m.changed()
		}
	}()
	for b.Loop() {
		_ = m.screen()
	}
	b.StopTimer()
	close(stop)
	<-fed
	m.end()
	st := m.stats()
	b.ReportMetric(float64(st.Dropped)/float64(max(st.Read, 1))*100, "%dropped")
}
