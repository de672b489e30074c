package runcode

import (
	"strings"
	"testing"
	"unicode/utf8"
)

// TestTextShowsRichForms: what a rich run showed is in the text a model
// reads: values (text/plain), the other forms named, the exception, and
// an artifact's text repr, within one budget.
func TestTextShowsRichForms(t *testing.T) {
	r := &Result{
		Results: []RichResult{
			{Data: map[string]any{"text/plain": "   a\n0  1", "text/html": "<table/>"}},
			{Main: true, Data: map[string]any{"text/plain": "42", "image/png": "iVBO"}},
		},
		Exception: &Exception{Name: "ValueError", Value: "bad"},
		Artifacts: []Artifact{{Kind: "html", Name: "output-1-1.html", Data: "<table/>", Text: "frame text"}},
	}
	got := r.Text()
	want := "⚠️ ValueError: bad\n   a\n0  1\n📎 also as text/html\nOut: 42\n📎 also as image/png\n" +
		"📎 html artifact \"output-1-1.html\" (8 bytes)\nframe text"
	if got != want {
		t.Errorf("text:\n%s\nwant:\n%s", got, want)
	}

	long := strings.Repeat("é", richTextMax) // two bytes each
	r = &Result{Results: []RichResult{{Main: true, Data: map[string]any{"text/plain": long}}, {Data: map[string]any{"text/plain": "next"}}}}
	got = r.Text()
	if len(got) > richTextMax+200 || !strings.Contains(got, "cut) …") || !utf8.ValidString(got) {
		t.Errorf("a long value: %d bytes, valid UTF-8 %v", len(got), utf8.ValidString(got))
	}
	if !strings.Contains(got, "text left out: the reply's text budget is spent") {
		t.Errorf("the value after the budget is spent:\n%s", got[len(got)-200:])
	}
}
