package terminal

import (
	"bytes"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// FuzzStatusRecord feeds arbitrary bytes, as a box could write them, to
// the status stream's splitter and parser: nothing may panic, memory stays
// bounded, and a record is accepted only when it is exactly
// "<32 hex>:<0-255>:<1-64 digits>".
func FuzzStatusRecord(f *testing.F) {
	for _, s := range []string{
		"0123456789abcdef0123456789abcdef:0:12345\x00",
		"0123456789abcdef0123456789abcdef:255:1\x00",
		"0123456789abcdef0123456789abcdef:256:1\x00",
		"0123456789abcdef0123456789abcdef:-1:1\x00",
		"0123456789abcdef0123456789abcdef:0:/etc\x00", // the old format
		"0123456789ABCDEF0123456789abcdef:0:1\x00",
		"x:0:1\x00\x00\x00:::\x00",
		"0123456789abcdef0123456789abcdef:00000000000000000000000000000:1\x00",
		"0123456789abcdef0123456789abcdef:1:2:3\x00",
		strings.Repeat("a", 1000) + "\x000123456789abcdef0123456789abcdef:7:9\x00",
	} {
		f.Add([]byte(s), uint8(7))
	}
	f.Fuzz(func(t *testing.T, data []byte, cut uint8) {
		var got []statusRecord
		sp := splitter{max: maxStatusChunk}
		fn := func(chunk []byte, overflow bool) {
			if len(chunk) > maxStatusChunk {
				t.Fatalf("chunk of %d bytes", len(chunk))
			}
			if overflow && chunk != nil {
				t.Fatal("overflow with bytes")
			}
			if rec, ok := parseStatus(chunk); ok && !overflow {
				if rec.code < 0 || rec.code > 255 || len(rec.nonce) != 32 || rec.marker == "" || len(rec.marker) > 64 {
					t.Fatalf("accepted %+v from %q", rec, chunk)
				}
				if string(chunk) != rec.nonce+":"+strconv.Itoa(rec.code)+":"+rec.marker && !leadingZeros(chunk) {
					t.Fatalf("accepted %+v from %q", rec, chunk)
				}
				got = append(got, rec)
			}
		}
		// Split the input at an arbitrary point: the result must not
		// depend on how the pipe delivered it.
		c := int(cut) % (len(data) + 1)
		sp.feed(data[:c], fn)
		sp.feed(data[c:], fn)
		if cap(sp.buf) > 2*maxStatusChunk+4096 {
			t.Fatalf("buffer grew to %d", cap(sp.buf))
		}
		var whole []statusRecord
		sp2 := splitter{max: maxStatusChunk}
		sp2.feed(data, func(chunk []byte, overflow bool) {
			if rec, ok := parseStatus(chunk); ok && !overflow {
				whole = append(whole, rec)
			}
		})
		if len(got) != len(whole) {
			t.Fatalf("split at %d: %d records, whole: %d", c, len(got), len(whole))
		}
	})
}

func leadingZeros(chunk []byte) bool {
	f := bytes.Split(chunk, []byte(":"))
	return len(f) == 3 && len(f[1]) > 1 && f[1][0] == '0'
}

// FuzzStateStream feeds arbitrary bytes to the state stream's splitter and
// parser: nothing may panic, a state is accepted only with a valid nonce,
// mode and absolute cwd (no NUL, at most 4096 bytes), a blob never holds a
// NUL and never exceeds the limit, and end markers are digits only.
func FuzzStateStream(f *testing.F) {
	n := "0123456789abcdef0123456789abcdef"
	for _, s := range []string{
		"\x00S" + n + ":k:/work/dir\x00Bdeclare -- X=\"1\"\n\x00\x00E123\x00",
		"\x00S" + n + ":x:/\x00B\x00",
		"\x00S" + n + ":k:relative\x00Bx\x00",
		"\x00S" + n + ":q:/a\x00Bx\x00",
		"\x00S" + n + ":k:/a\x00\x00E1\x00", // a header cut short by a marker
		"\x00S" + n + ":k:/a\x00E1\x00",     // no blob, a marker instead
		"\x00S" + n + ":k:/a:b:c\x00Bx\x00", // colons in the cwd
		"\x00Ex\x00\x00E\x00\x00E-1\x00",    // bad markers
		"\x00S" + n + ":k:/" + strings.Repeat("d", 5000) + "\x00Bx\x00",
		"\x00E" + strings.Repeat("9", 65) + "\x00",
		"S" + n + ":k:/a\x00B" + strings.Repeat("z", 3000),
	} {
		f.Add([]byte(s), uint16(5))
	}
	f.Fuzz(func(t *testing.T, data []byte, cut uint16) {
		// A small blob limit so that overflow is reached.
		const max = 2048
		sp := splitter{max: max}
		var p stateParser
		fn := func(chunk []byte, overflow bool) {
			ev := p.feed(chunk, overflow)
			if ev == nil {
				return
			}
			switch ev.kind {
			case 'S':
				if !isHex([]byte(ev.nonce), 32) || ev.cwd == "" || !filepath.IsAbs(ev.cwd) || len(ev.cwd) > maxCwd || strings.IndexByte(ev.cwd, 0) >= 0 {
					t.Fatalf("accepted state %+v", ev)
				}
				if strings.IndexByte(ev.blob, 0) >= 0 || len(ev.blob) >= max {
					t.Fatalf("blob of %d bytes with NUL %v", len(ev.blob), strings.IndexByte(ev.blob, 0) >= 0)
				}
				if ev.big && ev.blob != "" {
					t.Fatal("a blob over the limit kept bytes")
				}
			case 'E':
				if !isDigits([]byte(ev.marker), 1, 64) {
					t.Fatalf("accepted marker %q", ev.marker)
				}
			default:
				t.Fatalf("event kind %q", ev.kind)
			}
		}
		c := int(cut) % (len(data) + 1)
		sp.feed(data[:c], fn)
		sp.feed(data[c:], fn)
		if len(sp.buf) > max {
			t.Fatalf("buffer holds %d bytes", len(sp.buf))
		}
	})
}

// TestStateParserOnAStream is the parser on a stream such as a subshell
// writes it, delivered byte by byte.
func TestStateParserOnAStream(t *testing.T) {
	n := "0123456789abcdef0123456789abcdef"
	stream := "junk\x00S" + n + ":k:/a\x00Bdeclare -- X=\"1\"\n\x00\x00S" + n + ":x:/b c\x00B\x00\x00E42\x00"
	var evs []*stateEvent
	var p stateParser
	sp := splitter{max: 1 << 10}
	for i := 0; i < len(stream); i++ { // byte by byte
		sp.feed([]byte{stream[i]}, func(c []byte, o bool) {
			if ev := p.feed(c, o); ev != nil {
				evs = append(evs, ev)
			}
		})
	}
	if len(evs) != 3 || evs[0].cwd != "/a" || evs[0].blob != "declare -- X=\"1\"\n" || evs[0].exited ||
		evs[1].cwd != "/b c" || !evs[1].exited || evs[2].kind != 'E' || evs[2].marker != "42" {
		for _, e := range evs {
			t.Logf("%+v", *e)
		}
		t.Fatal("wrong events")
	}
}
