package textedit

import (
	"bytes"
	"errors"
	"strings"
	"testing"
)

func TestReplace(t *testing.T) {
	for _, tc := range []struct {
		name, in, old, new, want string
		edit                     Edit
	}{
		{"one line", "a\nb\nc\n", "b", "B", "a\nB\nc\n", Edit{2, 2, 1}},
		{"more lines", "a\nb\nc\n", "b\n", "x\ny\n", "a\nx\ny\nc\n", Edit{2, 3, 1}},
		{"delete", "a\nb\nc\n", "b\n", "", "a\nc\n", Edit{2, 2, 1}},
		{"span", "a\nb\nc\nd", "b\nc", "bc", "a\nbc\nd", Edit{2, 2, 2}},
		{"crlf", "a\r\nb\r\nc\r\n", "a\nb\n", "A\nB\nB2\n", "A\r\nB\r\nB2\r\nc\r\n", Edit{1, 3, 2}},
		{"crlf sent as crlf", "a\r\nb\r\n", "a\r\nb", "x\r\ny", "x\r\ny\r\n", Edit{1, 2, 2}},
		{"mixed endings taken as given", "a\r\nb\nc\n", "b\nc", "z", "a\r\nz\n", Edit{2, 2, 2}},
		{"unicode", "héllo wörld\n", "wörld", "welt", "héllo welt\n", Edit{1, 1, 1}},
		{"no trailing newline", "x = 1", "1", "2", "x = 2", Edit{1, 1, 1}},
	} {
		out, e, err := Replace([]byte(tc.in), tc.old, tc.new)
		if err != nil || string(out) != tc.want || e != tc.edit {
			t.Errorf("%s: %q %+v %v, want %q %+v", tc.name, out, e, err, tc.want, tc.edit)
		}
	}
}

func TestReplaceMatchCounts(t *testing.T) {
	in := "x\nfoo\ny\nfoo\nz\nfoo\n"
	_, _, err := Replace([]byte(in), "foo", "bar")
	var me *MatchError
	if !errors.As(err, &me) || me.Count != 3 || len(me.Lines) != 3 || me.Lines[0] != 2 || me.Lines[2] != 6 || !errors.Is(err, ErrMatch) {
		t.Fatalf("%#v", err)
	}
	if want := "old_str matches 3 times, at lines 2, 4, 6: add surrounding lines"; !strings.HasPrefix(err.Error(), want) {
		t.Errorf("%q, want %q", err, want)
	}
	_, _, err = Replace([]byte(in), "nope", "bar")
	if !errors.As(err, &me) || me.Count != 0 || !strings.Contains(err.Error(), "0 matches") {
		t.Fatalf("%v", err)
	}
	// Indentation slips: where it would match, loosely.
	py := "def f():\n    if x:\n        return 1\n    return 2\n"
	_, _, err = Replace([]byte(py), "  if x:\n      return 1", "")
	if !errors.As(err, &me) || me.Count != 0 || len(me.Near) != 1 || me.Near[0] != 2 ||
		!strings.HasPrefix(err.Error(), "old_str was not found exactly (0 matches), but it matches at line 2 if the spaces and tabs at the ends of lines are ignored") {
		t.Fatalf("%v", err)
	}
	if _, _, err = Replace([]byte(py), "return", ""); !errors.As(err, &me) || me.Count != 2 || me.Near != nil {
		t.Fatalf("%v", err)
	}
	// Overlapping occurrences are two: which one was meant is unclear.
	if _, _, err = Replace([]byte("aaa\n"), "aa", "b"); !errors.As(err, &me) || me.Count != 2 {
		t.Fatalf("%v", err)
	}
	// Many matches: the first MaxMatchLines lines, then an ellipsis; the
	// count stops past them.
	_, _, err = Replace([]byte(strings.Repeat("foo\n", 50)), "foo", "bar")
	if !errors.As(err, &me) || !me.More || len(me.Lines) != MaxMatchLines || !strings.Contains(err.Error(), "more than 10 times, first at lines 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, …:") {
		t.Fatalf("%v", err)
	}
	// A long old_str over a long file of the same byte: the overlapping
	// occurrences are not all counted (their count times old_str's length
	// would be minutes of a core).
	_, _, err = Replace(bytes.Repeat([]byte("a"), 8<<20), strings.Repeat("a", 3<<20), "b")
	if !errors.As(err, &me) || !me.More {
		t.Fatalf("%v", err)
	}
	for _, bad := range [][2]string{{"", "x"}, {"same", "same"}} {
		if _, _, err := Replace([]byte("same\n"), bad[0], bad[1]); !errors.Is(err, ErrInvalid) {
			t.Errorf("%q: %v", bad, err)
		}
	}
}

func TestInsert(t *testing.T) {
	for _, tc := range []struct {
		name, in string
		after    int
		text     string
		want     string
		edit     Edit
	}{
		{"top", "a\nb\n", 0, "x", "x\na\nb\n", Edit{First: 1, Last: 1}},
		{"middle", "a\nb\n", 1, "x\ny\n", "a\nx\ny\nb\n", Edit{First: 2, Last: 3}},
		{"end", "a\nb\n", 2, "x", "a\nb\nx\n", Edit{First: 3, Last: 3}},
		{"end without newline", "a\nb", 2, "x", "a\nb\nx", Edit{First: 3, Last: 3}},
		{"empty file", "", 0, "x", "x\n", Edit{First: 1, Last: 1}},
		{"an empty line", "a\n", 1, "\n", "a\n\n", Edit{First: 2, Last: 2}},
		{"crlf", "a\r\nb\r\n", 1, "x\ny", "a\r\nx\r\ny\r\nb\r\n", Edit{First: 2, Last: 3}},
	} {
		out, e, err := Insert([]byte(tc.in), tc.after, tc.text)
		if err != nil || string(out) != tc.want || e != tc.edit {
			t.Errorf("%s: %q %+v %v, want %q %+v", tc.name, out, e, err, tc.want, tc.edit)
		}
	}
	for _, after := range []int{-1, 3} {
		if _, _, err := Insert([]byte("a\nb\n"), after, "x"); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "has 2 lines") {
			t.Errorf("after %d: %v", after, err)
		}
	}
}

func TestViewLines(t *testing.T) {
	in := []byte("one\r\ntwo\r\nthree\r\nfour")
	v, err := ViewLines(in, 1, -1, Budget{})
	if err != nil || v.Text != "     1\tone\n     2\ttwo\n     3\tthree\n     4\tfour\n" || v.From != 1 || v.To != 4 || v.Lines != 4 || v.Cut {
		t.Fatalf("%+v %v", v, err)
	}
	if v, err = ViewLines(in, 2, 3, Budget{}); err != nil || v.Text != "     2\ttwo\n     3\tthree\n" {
		t.Fatalf("%+v %v", v, err)
	}
	// Past the end reads to the end.
	if v, err = ViewLines(in, 4, 99, Budget{}); err != nil || v.Text != "     4\tfour\n" {
		t.Fatalf("%+v %v", v, err)
	}
	for _, r := range [][2]int{{0, 2}, {5, -1}, {3, 2}} {
		if _, err := ViewLines(in, r[0], r[1], Budget{}); !errors.Is(err, ErrInvalid) {
			t.Errorf("%v: %v", r, err)
		}
	}
	// The budget cuts at a whole line; a long line is cut on a character.
	v, err = ViewLines([]byte(strings.Repeat("0123456789\n", 100)), 1, -1, Budget{Bytes: 100})
	if err != nil || !v.Cut || v.To != 5 || strings.Count(v.Text, "\n") != 5 {
		t.Fatalf("%+v %v", v, err)
	}
	v, err = ViewLines([]byte("ééééé\n"), 1, -1, Budget{LineCut: 5})
	if err != nil || v.Text != "     1\téé… (line cut: 10 bytes in all)\n" {
		t.Fatalf("%q %v", v.Text, err)
	}
	if v, err = ViewLines(nil, 1, -1, Budget{}); err != nil || v.Lines != 0 || v.Text != "" {
		t.Fatalf("%+v %v", v, err)
	}
}

func TestSnippet(t *testing.T) {
	var b strings.Builder
	for i := 1; i <= 100; i++ {
		b.WriteString("line\n")
	}
	in := []byte(b.String())
	if got := Snippet(in, Edit{First: 50, Last: 50}, 2, Budget{}); got != "    48\tline\n    49\tline\n    50\tline\n    51\tline\n    52\tline\n" {
		t.Fatalf("%q", got)
	}
	got := Snippet(in, Edit{First: 10, Last: 60}, 4, Budget{MaxLines: 10})
	if strings.Count(got, "\n") != 11 || !strings.Contains(got, "(lines 11-59 left out: view_range [11, 59] shows them)") {
		t.Fatalf("%s", got)
	}
	if got := Snippet(in, Edit{First: 1, Last: 1}, 4, Budget{}); !strings.HasPrefix(got, "     1\t") {
		t.Fatalf("%q", got)
	}
}

// FuzzEdit: whatever the file and the arguments, an edit that succeeds
// changes only what it says, and views stay within their budget.
func FuzzEdit(f *testing.F) {
	f.Add("a\nb\nc\n", "b", "x\ny", 1)
	f.Add("a\r\nb\r\n", "a\n", "", 0)
	f.Add("", "x", "y", 0)
	f.Fuzz(func(t *testing.T, in, old, new string, line int) {
		b := []byte(in)
		if out, e, err := Replace(b, old, new); err == nil {
			if e.First < 1 || e.Last < e.First || e.Last > max(1, Lines(out)) {
				t.Fatalf("Replace(%q, %q, %q) = %q, %+v", in, old, new, out, e)
			}
			if !CRLF(b) && strings.Replace(in, old, new, 1) != string(out) {
				t.Fatalf("Replace(%q, %q, %q) = %q", in, old, new, out)
			}
		}
		if out, e, err := Insert(b, line, new); err == nil {
			if Lines(out) < Lines(b)+1 || e.First != line+1 {
				t.Fatalf("Insert(%q, %d, %q) = %q, %+v", in, line, new, out, e)
			}
		}
		if v, err := ViewLines(b, max(1, line), -1, Budget{Bytes: 64, LineCut: 16}); err == nil && len(v.Text) > 64+40 {
			t.Fatalf("view of %q: %d bytes", in, len(v.Text))
		}
	})
}
