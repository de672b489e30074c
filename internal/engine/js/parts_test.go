package js

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/quro-dev/quro/internal/workspace"
)

func TestWorkspaceRel(t *testing.T) {
	dir := t.TempDir()
	w, err := workspace.Open(dir, workspace.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	tests := []struct {
		base, p, want string
		outside       bool
	}{
		{".", "a.txt", "a.txt", false},
		{".", "./a/../b.txt", "b.txt", false},
		{"lib", "./x.js", "lib/x.js", false},
		{"lib", "../x.js", "x.js", false},
		{".", ".", ".", false},
		{".", filepath.Join(w.Dir(), "in.txt"), "in.txt", false},
		{".", "..", "", true},
		{"lib", "../../x", "", true},
		{".", "/etc/passwd", "", true},
		{".", w.Dir() + "-other/x", "", true},
	}
	for _, tc := range tests {
		got, err := wsRel(w, tc.base, tc.p)
		if tc.outside {
			if !errors.Is(err, ErrOutside) {
				t.Errorf("wsRel(%q, %q) = %q, %v; want ErrOutside", tc.base, tc.p, got, err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("wsRel(%q, %q) = %q, %v; want %q", tc.base, tc.p, got, err, tc.want)
		}
	}
	for _, bad := range []string{"a\x00b", ""} {
		if _, err := wsRel(w, ".", bad); !errors.Is(err, workspace.ErrInvalid) {
			t.Errorf("%q: %v", bad, err)
		}
	}
}

func TestSourceMapAndVLQ(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want []int
	}{
		{"A", []int{0}}, {"C", []int{1}}, {"D", []int{-1}}, {"gB", []int{16}}, {"AAgBC", []int{0, 0, 16, 1}},
	} {
		got, err := decodeVLQ(tc.in)
		if err != nil || len(got) != len(tc.want) {
			t.Fatalf("decodeVLQ(%q) = %v, %v", tc.in, got, err)
		}
		for i := range got {
			if got[i] != tc.want[i] {
				t.Errorf("decodeVLQ(%q) = %v, want %v", tc.in, got, tc.want)
			}
		}
	}
	for _, bad := range []string{"g", "!", "gggggggggB"} {
		if _, err := decodeVLQ(bad); err == nil {
			t.Errorf("decodeVLQ(%q) accepted", bad)
		}
	}
	tr, err := transpile(context.Background(), "type T = number\n\nconst x: T = 1\nthrow new Error('x' + x)\n", "a.ts", true)
	if err != nil {
		t.Fatal(err)
	}
	// Generated line 2 is "throw ..." (line 4 of the original).
	gen := strings.Split(tr.code, "\n")
	for i, l := range gen {
		if strings.HasPrefix(l, "throw") {
			if line, _, ok := tr.sm.lookup(i+1, 1); !ok || line != 4 {
				t.Errorf("generated line %d maps to %d, %v; want 4", i+1, line, ok)
			}
		}
	}
}

func TestStackFolding(t *testing.T) {
	s := newSources()
	s.add("<code>", "f()\n", "f()\n", nil, false)
	raw := strings.Repeat("    at f (<eval>:1:1)\n", 100) + "    at g (<eval>:1:2)\n" + "    at h (<input>:5:6)\n" + "    at Array.prototype.map (native)\n"
	got, at := s.stack(raw)
	want := "    at f (<code>:1:1)\n    ... the frame above repeated 99 more times\n    at g (<code>:1:2)\n    at h (eval code:5:6)\n    at Array.prototype.map (native)"
	if got != want {
		t.Errorf("stack:\n%s\nwant:\n%s", got, want)
	}
	if at == nil || at.line != 1 || at.col != 1 {
		t.Errorf("first position %v", at)
	}
}
