package js

import (
	"context"
	"errors"
	"math"
	"path/filepath"
	"strings"
	"testing"

	"github.com/quro-dev/quro/internal/workspace"
)

func TestCalc(t *testing.T) {
	tests := []struct {
		expr string
		want float64
		err  string
	}{
		{"1 + 2 * 3", 7, ""},
		{"(1 + 2) * 3", 9, ""},
		{"2 ^ 3 ^ 2", 512, ""},
		{"2 ** 10", 1024, ""},
		{"-2 ^ 2", -4, ""}, // power binds tighter than unary minus, as in mathematics
		{"10 % 4", 2, ""},
		{"0x1f + 1e3 + .5", 1031.5, ""},
		{"sqrt(16) + abs(-2) + max(1, 9, 3) + min(4, 2)", 17, ""},
		{"round(2.5) + floor(-1.5) + ceil(1.2)", 3, ""},
		{"pi", math.Pi, ""},
		{"PI * 2 - tau", 0, ""},
		{"", 0, "unexpected end of expression"},
		{"1 +", 0, "unexpected end of expression"},
		{"1 2", 0, "expected an operator"},
		{"(1 + 2", 0, "expected ')'"},
		{"1 / 0", 0, "division by zero"},
		{"x + 1", 0, "unknown name \"x\""},
		{"alert(1)", 0, "unknown function \"alert\""},
		{"sqrt(1, 2)", 0, "takes 1 argument"},
		{"1; 2", 0, "unexpected character ';'"},
		{"1 $ 2", 0, "unexpected character '$'"},
		{"0xZ", 0, "bad hexadecimal number"},
		{"1..2", 0, "bad number"},
		{strings.Repeat("(", 300) + "1" + strings.Repeat(")", 300), 0, "nested too deeply"},
		{strings.Repeat("1+", 6000) + "1", 0, "longer than"},
	}
	for _, tc := range tests {
		got, err := Calc(tc.expr)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("Calc(%.40q) = %v, %v; want error %q", tc.expr, got, err, tc.err)
			}
			continue
		}
		if err != nil || math.Abs(got-tc.want) > 1e-9 {
			t.Errorf("Calc(%q) = %v, %v; want %v", tc.expr, got, err, tc.want)
		}
	}
}

// FuzzCalc: Calc never panics and never loops, whatever the input.
func FuzzCalc(f *testing.F) {
	for _, s := range []string{"1+2", "2^3^2", "max(1,2,3)", "((((1))))", "-.5e-3", "0x", "sqrt(", "1e999", "é"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		Calc(s)
	})
}

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
