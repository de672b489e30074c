// Package textedit edits UTF-8 text by lines, as the text-editor tools
// coding agents already know do (view with line numbers, replace a string
// that occurs exactly once, insert after a line): edit_file's semantics,
// apart from how the file is read and written (internal/app,
// internal/workspace).
//
// Every function works on a copy and is safe for concurrent use. The text
// is untrusted (a session's file, a model's arguments): nothing here
// allocates more than a small multiple of its input, and what it returns
// for a model to read is bounded.
package textedit

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"
)

// Errors, to test with errors.Is.
var (
	// ErrBinary: the file is not UTF-8 text (invalid UTF-8 or NUL bytes).
	ErrBinary = errors.New("not UTF-8 text")
	// ErrInvalid: an argument that cannot work (an empty old_str, a line
	// past the end). The message of an error that is ErrInvalid says
	// what is wrong and what to give instead, and ends there.
	ErrInvalid = errors.New("invalid argument")
	// ErrMatch: old_str does not occur exactly once (a *MatchError).
	ErrMatch = errors.New("old_str must match exactly once")
)

// invalidError is an argument error: ErrInvalid, with a message of its own.
type invalidError struct{ msg string }

func (e *invalidError) Error() string        { return e.msg }
func (e *invalidError) Is(target error) bool { return target == ErrInvalid }

func invalid(format string, a ...any) error { return &invalidError{fmt.Sprintf(format, a...)} }

// MaxMatchLines is how many line numbers a MatchError names at most.
const MaxMatchLines = 10

// MatchError is a replacement whose old_str occurs Count times (not once):
// Lines are the line numbers where the first MaxMatchLines occurrences
// start.
// Near, when Count is 0, are the lines where old_str would start if the
// spaces and tabs at the ends of its lines did not count (the usual slip:
// indentation).
type MatchError struct {
	Count int
	// More: the count stopped at MaxMatchLines+1 (counting every
	// overlapping occurrence of a long old_str in a long file would cost
	// their product).
	More  bool
	Lines []int
	Near  []int
}

func (e *MatchError) Error() string {
	if e.Count == 0 && len(e.Near) > 0 {
		return fmt.Sprintf("old_str was not found exactly (0 matches), but it matches at line%s %s if the spaces and tabs at the ends of lines are ignored: "+
			"copy those lines as view shows them, indentation included", plural(len(e.Near)), lineList(e.Near, len(e.Near)))
	}
	if e.Count == 0 {
		return "old_str was not found (0 matches): it must match the file exactly, whitespace and indentation included; view the file and copy the lines"
	}
	if e.More {
		return fmt.Sprintf("old_str matches more than %d times, first at lines %s: add surrounding lines to old_str to make it unique", MaxMatchLines, lineList(e.Lines, e.Count))
	}
	return fmt.Sprintf("old_str matches %d times, at lines %s: add surrounding lines to old_str to make it unique", e.Count, lineList(e.Lines, e.Count))
}

// lineList writes line numbers for a message: "4, 17, 30", with an
// ellipsis when there are more than listed (of count).
func lineList(lines []int, count int) string {
	at := make([]string, len(lines))
	for i, l := range lines {
		at[i] = fmt.Sprint(l)
	}
	s := strings.Join(at, ", ")
	if count > len(lines) {
		s += ", …"
	}
	return s
}

func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}

// maxNearLines bounds the old_str that near looks for: a longer one is
// not searched loosely (the search is lines of the file times lines of
// old_str).
const maxNearLines = 50

// near finds where old would occur if the spaces and tabs at both ends of
// each line were ignored: its first line may end a line of b, its last
// may begin one, and the lines between are whole lines. It returns the
// first MaxMatchLines line numbers.
func near(b []byte, old string) []int {
	want := strings.Split(strings.TrimRight(strings.ReplaceAll(old, "\r\n", "\n"), "\n"), "\n")
	if len(want) > maxNearLines {
		return nil
	}
	for i := range want {
		want[i] = strings.Trim(want[i], " \t\r")
	}
	if strings.Join(want, "") == "" {
		return nil
	}
	lines := strings.Split(string(b), "\n")
	for i := range lines {
		lines[i] = strings.Trim(lines[i], " \t\r")
	}
	var found []int
	for i := 0; i+len(want) <= len(lines) && len(found) < MaxMatchLines; i++ {
		if nearAt(lines[i:i+len(want)], want) {
			found = append(found, i+1)
		}
	}
	return found
}

func nearAt(lines, want []string) bool {
	last := len(want) - 1
	if last == 0 {
		return strings.Contains(lines[0], want[0])
	}
	if !strings.HasSuffix(lines[0], want[0]) || !strings.HasPrefix(lines[last], want[last]) {
		return false
	}
	for j := 1; j < last; j++ {
		if lines[j] != want[j] {
			return false
		}
	}
	return true
}

// Unwrap makes a MatchError ErrMatch.
func (e *MatchError) Unwrap() error { return ErrMatch }

// IsText reports whether b is valid UTF-8 without NUL bytes.
func IsText(b []byte) bool { return utf8.Valid(b) && bytes.IndexByte(b, 0) < 0 }

// CRLF reports whether b's line endings are all \r\n (and there is at
// least one): then an edit writes its lines with \r\n too.
func CRLF(b []byte) bool {
	n := bytes.Count(b, []byte("\n"))
	return n > 0 && bytes.Count(b, []byte("\r\n")) == n
}

// Lines is the number of lines of b: a last line without a newline counts.
func Lines(b []byte) int {
	n := bytes.Count(b, []byte("\n"))
	if len(b) > 0 && b[len(b)-1] != '\n' {
		n++
	}
	return n
}

// lineStart is the offset where line n (1-based) starts; past the last
// line, len(b).
func lineStart(b []byte, n int) int {
	off := 0
	for i := 1; i < n; i++ {
		j := bytes.IndexByte(b[off:], '\n')
		if j < 0 {
			return len(b)
		}
		off += j + 1
	}
	return off
}

// eol converts s's line endings to the file's: \r\n when crlf (a model
// writes \n, also for a file it viewed with \r\n endings), else as given.
func eol(s string, crlf bool) string {
	if !crlf {
		return s
	}
	return strings.ReplaceAll(strings.ReplaceAll(s, "\r\n", "\n"), "\n", "\r\n")
}

// Edit says where an edit put its text, in lines of the new file: First to
// Last (a deletion: the line where the text was). Removed is how many
// lines (whole or in part) the replaced text spanned.
type Edit struct {
	First, Last int
	Removed     int
}

// Replace replaces the one occurrence of old in b with new. old must occur
// exactly once (occurrences may overlap): else the error is a *MatchError
// with the count and the lines. In a file with \r\n line endings, old and
// new are taken with \r\n endings.
func Replace(b []byte, old, new string) ([]byte, Edit, error) {
	if old == "" {
		return nil, Edit{}, invalid("old_str is empty: name the text to replace (to add lines use insert; to replace the whole file, write_file)")
	}
	if old == new {
		return nil, Edit{}, invalid("old_str and new_str are the same: nothing to change")
	}
	crlf := CRLF(b)
	o, n := []byte(eol(old, crlf)), eol(new, crlf)
	me := &MatchError{}
	first, line, counted := -1, 1, 0
	for from := 0; from <= len(b)-len(o); {
		i := bytes.Index(b[from:], o)
		if i < 0 {
			break
		}
		at := from + i
		me.Count++
		if me.Count > MaxMatchLines {
			me.More = true
			break
		}
		if first < 0 {
			first = at
		}
		if len(me.Lines) < MaxMatchLines {
			line += bytes.Count(b[counted:at], []byte("\n"))
			counted = at
			me.Lines = append(me.Lines, line)
		}
		// The next occurrence may overlap this one; old starts with a
		// whole UTF-8 character, so one starting mid-character cannot
		// match.
		from = at + 1
	}
	if me.Count == 0 {
		me.Near = near(b, old)
	}
	if me.Count != 1 {
		return nil, Edit{}, me
	}
	out := make([]byte, 0, len(b)-len(o)+len(n))
	out = append(out, b[:first]...)
	out = append(out, n...)
	out = append(out, b[first+len(o):]...)
	e := Edit{First: me.Lines[0], Removed: 1 + bytes.Count(o[:len(o)-1], []byte("\n"))}
	e.Last = e.First
	if n != "" {
		// The line of new's last byte (a newline ends its own line).
		e.Last += strings.Count(n[:len(n)-1], "\n")
	}
	// A deletion at the end of the file: its line may be gone.
	if total := max(1, Lines(out)); e.Last > total {
		e.First, e.Last = min(e.First, total), total
	}
	return out, e, nil
}

// Insert puts text as lines after line after (0: at the top). One
// trailing newline of text ends its last line and is not an empty line of
// its own. In a file with \r\n line endings, the lines get \r\n.
func Insert(b []byte, after int, text string) ([]byte, Edit, error) {
	total := Lines(b)
	if after < 0 || after > total {
		return nil, Edit{}, invalid("insert_line %d is outside the file, which has %d lines: give 0 (the top) to %d (after the last line)", after, total, total)
	}
	crlf := CRLF(b)
	nl := "\n"
	if crlf {
		nl = "\r\n"
	}
	t := strings.TrimSuffix(strings.TrimSuffix(eol(text, crlf), "\n"), "\r")
	at := lineStart(b, after+1)
	var ins string
	if at == len(b) && len(b) > 0 && b[len(b)-1] != '\n' {
		// After a last line without a newline: the file keeps ending
		// without one (unless the line put there is empty).
		ins = nl + t
		if t == "" {
			ins += nl
		}
	} else {
		ins = t + nl
	}
	out := make([]byte, 0, len(b)+len(ins))
	out = append(out, b[:at]...)
	out = append(out, ins...)
	out = append(out, b[at:]...)
	return out, Edit{First: after + 1, Last: after + 1 + strings.Count(t, "\n")}, nil
}

// View is a range of lines, numbered as cat -n numbers them.
type View struct {
	Text     string // "     1\tline\n" per line shown
	From, To int    // the lines shown (To < From: none)
	Lines    int    // the file's lines
	Cut      bool   // the budget ended the view before the range did
}

// Budget bounds what View and Snippet return.
type Budget struct {
	Bytes    int // of Text; 0: no bound
	LineCut  int // a longer line shows its first LineCut bytes and how many it has; 0: whole lines
	MaxLines int // Snippet: lines shown before the middle is left out; 0: no bound
}

// ViewLines numbers lines from to to of b (1-based, inclusive; to -1 or
// past the end: to the end), within budget: a view cut by it has Cut set
// and To is the last line shown.
func ViewLines(b []byte, from, to int, budget Budget) (*View, error) {
	total := Lines(b)
	v := &View{Lines: total}
	if total == 0 {
		if from > 1 {
			return nil, invalid("view_range starts at line %d, but the file is empty", from)
		}
		return v, nil
	}
	if from < 1 || from > total {
		return nil, invalid("view_range starts at line %d: the file has lines 1 to %d", from, total)
	}
	if to != -1 && to < from {
		return nil, invalid("view_range [%d, %d] ends before it starts (-1 as the end means to the end of the file)", from, to)
	}
	if to == -1 || to > total {
		to = total
	}
	var s strings.Builder
	v.From, v.To = from, from-1
	off := lineStart(b, from)
	for n := from; n <= to; n++ {
		line, next := nextLine(b, off)
		before := s.Len()
		writeLine(&s, n, line, budget.LineCut)
		if budget.Bytes > 0 && s.Len() > budget.Bytes && n > from {
			v.Text, v.Cut = s.String()[:before], true
			return v, nil
		}
		v.To, off = n, next
	}
	v.Text = s.String()
	return v, nil
}

// nextLine is the line at offset off of b without its line ending, and
// the offset of the line after it.
func nextLine(b []byte, off int) ([]byte, int) {
	end, next := len(b), len(b)
	if i := bytes.IndexByte(b[off:], '\n'); i >= 0 {
		end, next = off+i, off+i+1
	}
	return bytes.TrimSuffix(b[off:end], []byte("\r")), next
}

func writeLine(s *strings.Builder, n int, line []byte, cut int) {
	fmt.Fprintf(s, "%6d\t", n)
	if cut > 0 && len(line) > cut {
		k := cut
		for k > 0 && !utf8.RuneStart(line[k]) {
			k--
		}
		fmt.Fprintf(s, "%s… (line cut: %d bytes in all)\n", line[:k], len(line))
		return
	}
	s.Write(line)
	s.WriteByte('\n')
}

// Snippet shows an edit: its lines of b (the edited text) with context
// lines on either side, numbered; past budget.MaxLines the middle of the
// edit is left out with a note.
func Snippet(b []byte, e Edit, context int, budget Budget) string {
	total := Lines(b)
	from, to := max(1, e.First-context), min(total, e.Last+context)
	if to < from {
		return ""
	}
	var s strings.Builder
	off := lineStart(b, from)
	skipFrom, skipTo := 0, -1
	if budget.MaxLines > 0 && to-from+1 > budget.MaxLines {
		half := budget.MaxLines / 2
		skipFrom, skipTo = from+half, to-(budget.MaxLines-half)
	}
	for n := from; n <= to; n++ {
		line, next := nextLine(b, off)
		off = next
		switch {
		case n == skipFrom:
			fmt.Fprintf(&s, "     …\t(lines %d-%d left out: view_range [%d, %d] shows them)\n", skipFrom, skipTo, skipFrom, skipTo)
			continue
		case n > skipFrom && n <= skipTo:
			continue
		}
		writeLine(&s, n, line, budget.LineCut)
		if budget.Bytes > 0 && s.Len() > budget.Bytes {
			fmt.Fprintf(&s, "     …\t(cut: view_range [%d, %d] shows the rest)\n", n+1, to)
			break
		}
	}
	return s.String()
}
