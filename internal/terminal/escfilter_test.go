package terminal

import (
	"math/rand/v2"
	"strings"
	"testing"
)

// escCases: what a program prints, what a viewer gets.
var escCases = []struct{ name, in, want string }{
	{"plain text", "hello\r\n\x1b[1;31mred\x1b[0m é £ ✜", "hello\r\n\x1b[1;31mred\x1b[0m é £ ✜"},
	{"OSC 52 with BEL", "a\x1b]52;c;cHduZWQ=\x07b", "ab"},
	{"OSC 52 with ST", "a\x1b]52;c;cHduZWQ=\x1b\\b", "ab"},
	{"OSC 52 read request", "a\x1b]52;c;?\x07b", "ab"},
	{"OSC 52, 8-bit", "a\xc2\x9d52;c;cHduZWQ=\xc2\x9cb", "ab"},
	{"OSC 052", "a\x1b]052;c;eA==\x07b", "ab"},
	{"OSC 52 ended by another ESC", "a\x1b]52;c;eA==\x1b[1mb", "a\x1b[1mb"},
	// A second 8-bit OSC introducer inside an OSC starts a new OSC (a
	// terminal's parser begins again on any C1): that one is OSC 52.
	{"8-bit OSC 52 restarting an OSC", "a\xc2\x9d\xc2\x9d52;c;eA==\x07b", "a\xc2\x9d\x07b"},
	// An OSC cut short by a new sequence passes with a BEL of its own: the
	// sequence after it is taken out, and the text after that must not
	// become the first OSC's (here the URI of a link).
	{"OSC 8 cut by a dropped OSC", "\x1b]8;;\x1b]8\x07javascript:x\x07", "\x1b]8;;\x07javascript:x\x07"},
	{"OSC 0 cut by OSC 52", "\x1b]0;title\x1b]52;c;eA==\x07text", "\x1b]0;title\x07text"},
	{"OSC 8 javascript:", "\x1b]8;;javascript:alert(document.cookie)\x07click\x1b]8;;\x07", "click\x1b]8;;\x07"},
	{"OSC 8 JavaScript: with ST", "\x1b]8;id=1;JavaScript:alert(1)\x1b\\click\x1b]8;;\x1b\\", "click\x1b]8;;\x1b\\"},
	{"OSC 8 data:", "\x1b]8;;data:text/html,<script>alert(1)</script>\x07x", "x"},
	{"OSC 8 file:", "\x1b]8;;file:///etc/passwd\x07x", "x"},
	{"OSC 8 with a space before the scheme", "\x1b]8;; javascript:alert(1)\x07x", "x"},
	{"OSC 8 8-bit javascript:", "\xc2\x9d8;;javascript:alert(1)\xc2\x9cx", "x"},
	{"OSC 8 https", "\x1b]8;;https://example.com/a?b=c\x07link\x1b]8;;\x07", "\x1b]8;;https://example.com/a?b=c\x07link\x1b]8;;\x07"},
	{"OSC 8 HTTP", "\x1b]8;id=x;HTTP://example.com\x1b\\l\x1b]8;;\x1b\\", "\x1b]8;id=x;HTTP://example.com\x1b\\l\x1b]8;;\x1b\\"},
	{"OSC 8 overlong", "\x1b]8;;https://" + strings.Repeat("a", maxHeldOSC) + "\x07x", "x"},
	{"OSC 8 with a lone 0x9c before the scheme", "\x1b]8;;\x9cjavascript:alert(1)\x07x", "x"},
	{"title passes", "\x1b]0;my title\x07\x1b]2;t2\x1b\\", "\x1b]0;my title\x07\x1b]2;t2\x1b\\"},
	{"title report request", "\x1b]0;rm -rf ~\x07\x1b[21t\x1b[20tok", "\x1b]0;rm -rf ~\x07ok"},
	{"title report, 8-bit CSI", "\xc2\x9b21tok", "ok"},
	{"title report with parameters", "\x1b[21;0tok", "ok"},
	{"other window ops pass", "\x1b[8;24;80t\x1b[18t", "\x1b[8;24;80t\x1b[18t"},
	{"cursor and colours pass", "\x1b[2J\x1b[H\x1b]11;?\x07\x1b[6n", "\x1b[2J\x1b[H\x1b]11;?\x07\x1b[6n"},
	// ESC ESC: the first does nothing to a terminal and is not passed on
	// (it would join what follows the dropped OSC: "ESC" + "]52;…").
	{"ESC ESC", "\x1b\x1b]52;c;eA==\x07x", "x"},
	{"ESC ESC before a dropped OSC and its text", "\x1b\x1b]52\x07]52;c;eA==\x07", "]52;c;eA==\x07"},
	{"lone 0xC2 before a dropped OSC", "\xc2\x1b]52\x07\x9d52;c;eA==\x07", "\uFFFD\x9d52;c;eA==\x07"},
	{"CSI cut by a dropped OSC", "\x1b[21\x1b]52\x07t", "t"},
	{"CAN ends an OSC", "\x1b]52;c;eA==\x18x", "x"},
	{"LF after ESC", "\x1b\n]52;c;eA==\x07x", "\nx"},
	{"LF in the OSC's number", "\x1b]5\n2;c;eA==\x07x", "x"},
	{"LF in a CSI", "\x1b[2\n1tx", "\nx"},
	// The CSI cut by ESC is dropped, as a terminal drops it: passed on, it
	// would join the text after the dropped report ("ESC [" + "x").
	{"ESC in a CSI", "\x1b[\x1b[20tx", "x"},
	{"title report 021", "\x1b[021tx", "x"},
	{"title report with a sub-parameter", "\x1b[21:1tx", "x"},
	// Past the held limit: a report request with a long tail of
	// parameters, or with its first parameter padded by zeros, is taken
	// out to its end; a long CSI whose first parameter is another streams.
	{"title report with a long tail", "\x1b[20;" + strings.Repeat("0", 80) + "tx", "x"},
	{"title report padded past the limit", "\x1b[" + strings.Repeat("0", 80) + "21tx", "x"},
	{"long report cut by CAN", "\x1b[21;" + strings.Repeat("1;", 40) + "\x18x", "\x18x"},
	{"long SGR passes", "\x1b[1;" + strings.Repeat("38;5;1;", 12) + "mx", "\x1b[1;" + strings.Repeat("38;5;1;", 12) + "mx"},
	{"long window op passes", "\x1b[8;" + strings.Repeat("0", 80) + "24;80tx", "\x1b[8;" + strings.Repeat("0", 80) + "24;80tx"},
}

// TestEscFilter: every case whole, byte by byte, and split at random
// points (a sequence across reads is decided as one).
func TestEscFilter(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for _, tc := range escCases {
		var f escFilter
		if got := string(f.filter([]byte(tc.in))); got != tc.want {
			t.Errorf("%s: got %q, want %q", tc.name, got, tc.want)
		}
		f = escFilter{}
		var b strings.Builder
		for i := 0; i < len(tc.in); i++ {
			b.Write(f.filter([]byte{tc.in[i]}))
		}
		if b.String() != tc.want {
			t.Errorf("%s, byte by byte: got %q, want %q", tc.name, b.String(), tc.want)
		}
		for range 20 {
			f = escFilter{}
			b.Reset()
			in := []byte(tc.in)
			for len(in) > 0 {
				n := 1 + r.IntN(len(in))
				b.Write(f.filter(in[:n]))
				in = in[n:]
			}
			if b.String() != tc.want {
				t.Fatalf("%s, split: got %q, want %q", tc.name, b.String(), tc.want)
			}
		}
	}
}

// FuzzEscFilter: whatever a program prints, and however it is split, the
// output never holds a clipboard write, a link that is not http(s), or a
// title report request, and the filter never panics.
func FuzzEscFilter(f *testing.F) {
	for _, tc := range escCases {
		f.Add([]byte(tc.in), uint8(3))
	}
	f.Fuzz(func(t *testing.T, in []byte, split uint8) {
		var fl escFilter
		var b strings.Builder
		n := int(split)%7 + 1
		for len(in) > 0 {
			k := min(n, len(in))
			b.Write(fl.filter(in[:k]))
			in = in[k:]
		}
		out := b.String()
		// Read the output as a terminal would: normalize the 8-bit
		// introducers and look at every OSC and CSI.
		norm := strings.NewReplacer("\xc2\x9d", "\x1b]", "\xc2\x9b", "\x1b[").Replace(out)
		// C0 controls run beside a sequence (or are ignored in an OSC)
		// without ending it: a terminal reads the sequence without them.
		norm = strings.Map(func(r rune) rune {
			if r < 0x20 && r != 0x1b && r != 0x07 && r != 0x18 && r != 0x1a {
				return -1
			}
			return r
		}, norm)
		for i := 0; i+2 < len(norm); i++ {
			if norm[i] != 0x1b {
				continue
			}
			rest := norm[i+2:]
			switch norm[i+1] {
			case ']':
				num := strings.TrimLeft(rest, "0")
				if strings.HasPrefix(num, "52;") {
					t.Fatalf("an OSC 52 passed: %q", out)
				}
				if strings.HasPrefix(num, "8;") {
					_, after, _ := strings.Cut(num[2:], ";")
					l := strings.ToLower(after)
					end := strings.IndexAny(l, "\x07\x1b\x18\x1a")
					if end >= 0 {
						l = l[:end]
					}
					l = strings.TrimSuffix(l, "\xc2")
					if l != "" && !strings.HasPrefix(l, "http://") && !strings.HasPrefix(l, "https://") && end >= 0 {
						t.Fatalf("an OSC 8 to %q passed: %q", l, out)
					}
				}
			case '[':
				// The CSI's parameters run to its final byte.
				end := strings.IndexFunc(rest, func(r rune) bool { return r >= 0x40 && r <= 0x7e || r < 0x20 })
				if end >= 0 && rest[end] == 't' {
					first, _, _ := strings.Cut(strings.ReplaceAll(rest[:end], ":", ";"), ";")
					if first = strings.TrimLeft(first, "0"); first == "20" || first == "21" {
						t.Fatalf("a title report request passed: %q", out)
					}
				}
			}
		}
	})
}

// TestPTYEscapesAgainstTheViewer: a program in the session prints a
// clipboard write (OSC 52, 7- and 8-bit), a javascript: link (OSC 8) and
// a title followed by a title report request (the title would come back
// as typed input); a viewer attached live and
// one that attaches after (the scrollback replay) get none of them, and
// get the http link and the title.
func TestPTYEscapesAgainstTheViewer(t *testing.T) {
	p, _ := newPTY(t)
	v, _ := p.Attach()
	var seen strings.Builder
	// Each printf is a write of its own (sequences split inside one
	// read are TestEscFilter's); the marker is printed last. The shell's
	// echo of the command line shows the sequences as text, not bytes.
	p.Write([]byte(`printf '\033]52;c;cHduZWQ=\007' ; printf '\302\23552;c;eA==\302\234' ; ` +
		`printf '\033]8;;javascript:alert(document.cookie)\033\\JSLINK\033]8;;\033\\' ; ` +
		`printf '\033]8;;https://example.com/\007WEBLINK\033]8;;\007' ; ` +
		`printf '\033]0;touch /tmp/pwned\007\033[21t\033[20t' ; echo END$((6*7))` + "\r"))
	readUntil(t, v, &seen, "END42")
	check := func(what, out string) {
		t.Helper()
		for _, bad := range []string{"\x1b]52", "\xc2\x9d52", "\x1b]8;;javascript:", "\x1b[21t", "\x1b[20t"} {
			if strings.Contains(out, bad) {
				t.Errorf("%s holds %q: %q", what, bad, out)
			}
		}
		for _, good := range []string{"JSLINK", "\x1b]8;;https://example.com/\x07WEBLINK", "\x1b]0;touch /tmp/pwned\x07"} {
			if !strings.Contains(out, good) {
				t.Errorf("%s lacks %q: %q", what, good, out)
			}
		}
	}
	check("the live viewer's bytes", seen.String())
	_, replay := p.Attach()
	check("the scrollback replay", string(replay))
}
