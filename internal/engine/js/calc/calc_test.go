package calc

import (
	"math"
	"strings"
	"testing"
)

func TestEval(t *testing.T) {
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
		got, err := Eval(tc.expr)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("Eval(%.40q) = %v, %v; want error %q", tc.expr, got, err, tc.err)
			}
			continue
		}
		if err != nil || math.Abs(got-tc.want) > 1e-9 {
			t.Errorf("Eval(%q) = %v, %v; want %v", tc.expr, got, err, tc.want)
		}
	}
}

// FuzzEval: Eval never panics and never loops, whatever the input.
func FuzzEval(f *testing.F) {
	for _, s := range []string{"1+2", "2^3^2", "max(1,2,3)", "((((1))))", "-.5e-3", "0x", "sqrt(", "1e999", "é"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		Eval(s)
	})
}
