package terminal

import (
	"bytes"
	"strconv"
)

// escFilter takes out of a PTY's output, before it reaches the scrollback
// and the viewers (a browser's xterm.js among them), the escape sequences
// a program in the session could use against the person watching:
//
//   - OSC 52, a clipboard write (or a read request): the session would
//     put what it likes on the viewer's clipboard;
//   - OSC 8 hyperlinks whose URI is not http or https (javascript:, data:,
//     file:…): the text stays, without its link;
//   - CSI 20 t and CSI 21 t, the requests for a report of the icon label
//     and the window title: a terminal that answered would type the
//     title, which the program set, into the shell as input.
//
// Everything else passes as it came. Sequences split across reads are
// held until they end (an OSC 8 up to maxHeldOSC bytes, beyond which it
// is dropped; other OSCs pass on as soon as their number is known). The
// 8-bit C1 introducers xterm.js reads (U+009B CSI, U+009D OSC, U+009C ST,
// as UTF-8) count as their 7-bit forms. Not safe for concurrent use: one
// per PTY, in its reader.
type escFilter struct {
	state   int
	kind    int    // of the OSC under way: oscPass, oscHold or oscDrop
	held    []byte // the sequence so far, while it is being decided
	dropped int    // sequences taken out (for tests)
}

const (
	escNormal = iota
	escEsc    // after ESC
	escC2     // after 0xC2 (a C1 control may follow)
	escCSI    // in a CSI, held
	escCSIRun // in a long CSI that is no report request, streamed
	escCSICut // in a long CSI that could be one, taken out
	escOSCNum // in an OSC, before its number's end, held
	escOSC    // in an OSC's text
	escOSCEsc // in an OSC's text, after ESC
	escOSCC2  // in an OSC's text, after 0xC2: ST, another C1, or text
)

const (
	oscPass = iota // streamed as it comes
	oscHold        // an OSC 8: held until its end, then decided
	oscDrop        // taken out, to its end
)

// maxHeldOSC is the longest OSC 8 (its parameters and URI) held to be
// decided (a longer one is dropped); maxHeldCSI the longest CSI held.
// Beyond it, a CSI whose first parameter has ended and is not 20 or 21
// streams on; any other (a first parameter of 20 or 21 followed by a
// long tail, or padded with zeros past the limit: the terminal reads
// both as a report request) is taken out to its end.
const (
	maxHeldOSC = 8 << 10
	maxHeldCSI = 64
)

// filter returns b without the sequences above, in a new slice (b is
// not changed). Its state carries over to the next call.
func (f *escFilter) filter(b []byte) []byte {
	out := make([]byte, 0, len(b))
	for _, c := range b {
		out = f.step(c, out)
	}
	return out
}

func (f *escFilter) step(c byte, out []byte) []byte {
	switch f.state {
	case escNormal:
		switch c {
		case 0x1b:
			f.state, f.held = escEsc, append(f.held[:0], c)
		case 0xc2:
			f.state, f.held = escC2, append(f.held[:0], c)
		default:
			out = append(out, c)
		}
	case escEsc, escC2:
		if f.state == escEsc && executed(c) {
			// A C0 control after ESC runs and the escape goes on (the VT
			// parser's ESCAPE state): ESC LF ] is still an OSC.
			return append(out, c)
		}
		csi := f.state == escEsc && c == '[' || f.state == escC2 && c == 0x9b
		osc := f.state == escEsc && c == ']' || f.state == escC2 && c == 0x9d
		switch {
		case csi:
			f.state, f.held = escCSI, append(f.held, c)
		case osc:
			f.state, f.held = escOSCNum, append(f.held, c)
		case f.state == escEsc && c == 0x1b:
			// ESC ESC: the first does nothing (a terminal's parser starts
			// again). Passed on, it could join text after a sequence taken
			// out ("ESC" + "]52;…").
			f.held = append(f.held[:0], c)
			return out
		case f.state == escC2 && (c < 0x80 || c > 0xbf):
			// 0xC2 without its continuation byte is not UTF-8: passed on
			// alone it could join a 0x9D after a sequence taken out (an
			// OSC); it shows as U+FFFD, as a terminal shows it.
			out = append(out, "\uFFFD"...)
			f.state, f.held = escNormal, f.held[:0]
			return f.step(c, out)
		default:
			out = append(out, f.held...)
			f.state, f.held = escNormal, f.held[:0]
			return f.step(c, out)
		}
	case escCSI, escCSIRun, escCSICut:
		return f.stepCSI(c, out)
	case escOSCNum:
		if ignoredInOSC(c) {
			break // the terminal ignores it: the number goes on
		}
		if c >= '0' && c <= '9' && len(f.held) < 16 {
			f.held = append(f.held, c)
			break
		}
		switch f.oscNumber() {
		case 52:
			f.kind, f.held = oscDrop, f.held[:0]
		case 8:
			f.kind = oscHold
		default:
			f.kind = oscPass
			out = append(out, f.held...)
			f.held = f.held[:0]
		}
		f.state = escOSC
		return f.step(c, out)
	case escOSC, escOSCEsc, escOSCC2:
		return f.stepOSC(c, out)
	}
	return out
}

// stepOSC is step in an OSC's text.
func (f *escFilter) stepOSC(c byte, out []byte) []byte {
	switch f.state {
	case escOSC:
		if c == 0x1b { // ST's start, or the OSC's end (see escOSCEsc)
			f.state = escOSCEsc
			break
		}
		if c == 0xc2 { // ST (U+009C), another C1, or text (see escOSCC2)
			f.state = escOSCC2
			break
		}
		if ignoredInOSC(c) && f.kind != oscPass {
			break
		}
		out = f.keep(c, out)
		switch {
		case c == 0x07 || c == 0x18 || c == 0x1a:
			return f.done(out)
		case f.kind == oscHold && len(f.held) > maxHeldOSC:
			f.kind, f.held = oscDrop, f.held[:0]
		}
	case escOSCC2:
		switch {
		case c == 0x9c: // ST
			return f.done(f.keep(c, f.keep(0xc2, out)))
		case c >= 0x80 && c <= 0x9f:
			// Another C1 control (U+009D OSC, U+009B CSI…) ends the OSC
			// and starts its own sequence, as ESC does: a second OSC
			// introducer begins a new OSC, whose number is looked at.
			out = f.cut(out)
			f.state, f.held = escC2, append(f.held[:0], 0xc2)
			return f.step(c, out)
		}
		out = f.keep(0xc2, out)
		f.state = escOSC
		return f.stepOSC(c, out)
	case escOSCEsc:
		if c == '\\' {
			out = f.keep(c, f.keep(0x1b, out))
			return f.done(out)
		}
		// ESC and anything else ends the OSC (as xterm.js reads it) and
		// starts a new sequence.
		out = f.cut(out)
		f.state, f.held = escEsc, append(f.held[:0], 0x1b)
		return f.step(c, out)
	}
	return out
}

// executed: a C0 control a VT parser runs in the middle of an escape
// sequence without ending it (not ESC, CAN, SUB).
func executed(c byte) bool { return c < 0x20 && c != 0x1b && c != 0x18 && c != 0x1a }

// ignoredInOSC: a C0 control an OSC's text ignores (not BEL, CAN, SUB, ESC).
func ignoredInOSC(c byte) bool { return executed(c) && c != 0x07 }

// keep is c of the OSC under way: passed on, held or dropped.
func (f *escFilter) keep(c byte, out []byte) []byte {
	switch f.kind {
	case oscPass:
		out = append(out, c)
	case oscHold:
		f.held = append(f.held, c)
	}
	return out
}

// done ends the OSC under way: a held OSC 8 passes if its URI is empty
// (a link's end) or http(s).
func (f *escFilter) done(out []byte) []byte {
	switch {
	case f.kind == oscHold && linkAllowed(f.held):
		out = append(out, f.held...)
	case f.kind != oscPass:
		f.dropped++
	}
	f.state, f.held = escNormal, f.held[:0]
	return out
}

// cut ends the OSC under way where a new sequence starts (ESC, or a C1
// control) as done does, and gives what passes a BEL to end it: the
// sequence that ended it may be taken out, and the text after it must not
// become the passed OSC's (a held OSC 8 "ESC ] 8 ; ;" then a dropped
// sequence, then "x BEL", would read as a link to x).
func (f *escFilter) cut(out []byte) []byte {
	n := len(out)
	out = f.done(out)
	if f.kind == oscPass || len(out) > n {
		out = append(out, 0x07)
	}
	return out
}

// oscNumber is the number of the held OSC introducer and digits (-1:
// none).
func (f *escFilter) oscNumber() int {
	n, err := strconv.Atoi(string(f.held[2:]))
	if err != nil {
		return -1
	}
	return n
}

// linkAllowed: seq is a whole OSC 8 (introducer to terminator), whose URI
// follows the second ';'.
func linkAllowed(seq []byte) bool {
	_, rest, ok := bytes.Cut(seq, []byte(";"))
	if !ok {
		return false
	}
	_, uri, ok := bytes.Cut(rest, []byte(";"))
	if !ok {
		return false
	}
	// One terminator, exactly: ST (ESC \ or C1 0x9c), BEL, or the
	// CAN/SUB/ESC that cut it. A backslash of the URI itself stays.
	switch {
	case bytes.HasSuffix(uri, []byte("\x1b\\")), bytes.HasSuffix(uri, []byte("\xc2\x9c")):
		uri = uri[:len(uri)-2]
	case len(uri) > 0 && bytes.IndexByte([]byte("\x07\x18\x1a\x1b"), uri[len(uri)-1]) >= 0:
		uri = uri[:len(uri)-1]
	}
	if len(uri) == 0 {
		return true
	}
	l := bytes.ToLower(uri)
	return bytes.HasPrefix(l, []byte("http://")) || bytes.HasPrefix(l, []byte("https://"))
}

// stepCSI is step in a CSI: held while it is decided, or, past
// maxHeldCSI, streamed (escCSIRun) or taken out (escCSICut) to its end.
func (f *escFilter) stepCSI(c byte, out []byte) []byte {
	if f.state != escCSI {
		switch {
		case executed(c):
			return append(out, c)
		case c == 0x1b, c == 0xc2:
			f.state = escNormal
			return f.step(c, out)
		case c >= 0x40 && c <= 0x7e, c < 0x20:
			if f.state == escCSIRun || c < 0x20 {
				out = append(out, c)
			}
			f.state = escNormal
		case f.state == escCSIRun:
			out = append(out, c)
		}
		return out
	}
	switch {
	case executed(c): // runs, and the CSI goes on
		return append(out, c)
	case c == 0x1b, c == 0xc2:
		// The CSI is cut short by ESC or a C1 control (U+009D OSC…):
		// a terminal drops it and starts the new sequence. Passed on,
		// it could join text after a sequence taken out ("ESC [ 21" +
		// "t", a title report), or hide an OSC in its parameters.
		f.dropped++
		f.state, f.held = escNormal, f.held[:0]
		return f.step(c, out)
	}
	f.held = append(f.held, c)
	switch {
	case c >= 0x40 && c <= 0x7e: // its final byte
		if f.titleReport() {
			f.dropped++
		} else {
			out = append(out, f.held...)
		}
		f.state, f.held = escNormal, f.held[:0]
	case c < 0x20: // CAN or SUB: the CSI is cancelled
		out = append(out, f.held...)
		f.state, f.held = escNormal, f.held[:0]
	case len(f.held) > maxHeldCSI:
		if f.mayReport() {
			f.dropped++
			f.state, f.held = escCSICut, f.held[:0]
		} else {
			out = append(out, f.held...)
			f.state, f.held = escCSIRun, f.held[:0]
		}
	}
	return out
}

// titleReport reports whether the held CSI asks for a report of the icon
// label or the window title (CSI 20 t, CSI 21 t).
func (f *escFilter) titleReport() bool {
	p := f.held
	if p[len(p)-1] != 't' {
		return false
	}
	first := p[2 : len(p)-1]
	if i := bytes.IndexAny(first, ";:"); i >= 0 {
		first = first[:i]
	}
	n := string(bytes.TrimLeft(first, "0"))
	return n == "20" || n == "21"
}

// mayReport reports whether the held CSI, too long to hold further and
// not yet ended, could still end as a title report request: its first
// parameter has not ended, or it is 20 or 21.
func (f *escFilter) mayReport() bool {
	params := f.held[2:]
	i := bytes.IndexAny(params, ";:")
	if i < 0 {
		return true
	}
	n := string(bytes.TrimLeft(params[:i], "0"))
	return n == "20" || n == "21"
}
