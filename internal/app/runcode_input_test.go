package app

import (
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/quro-dev/quro/internal/capability"
	"github.com/quro-dev/quro/internal/runcode"
)

// TestRunCodeInputLimits: stdin over 4 MiB, more than 1024 args and args
// over 100 KiB in all are refused before anything runs, as invalid_argument
// naming the field and the limit.
func TestRunCodeInputLimits(t *testing.T) {
	t.Parallel()
	a := newApp(t, nil)
	many := make([]string, 1025)
	for i := range many {
		many[i] = "x"
	}
	for _, tc := range []struct {
		name  string
		in    RunCodeInput
		texts []string
	}{
		{"stdin", RunCodeInput{Lang: "c", Code: "int main(){return 0;}", Stdin: strings.Repeat("a", 4<<20+1)}, []string{"stdin is", "the limit is 4.0 MiB"}},
		{"args count", RunCodeInput{Lang: "c", Code: "int main(){return 0;}", Args: many}, []string{"1025 args", "the limit is 1024"}},
		{"args size", RunCodeInput{Lang: "c", Code: "int main(){return 0;}", Args: []string{strings.Repeat("a", 60<<10), strings.Repeat("b", 60<<10)}}, []string{"args are", "the limit is 100 KiB"}},
	} {
		_, err := call(t, a, "run_code", tc.in)
		if capCode(err) != capability.InvalidArgument {
			t.Errorf("%s: %v, want invalid_argument", tc.name, err)
			continue
		}
		for _, s := range tc.texts {
			if !strings.Contains(err.Error(), s) {
				t.Errorf("%s: %q lacks %q", tc.name, err, s)
			}
		}
	}
	// At the limits, the input is taken (the run itself may find no
	// compiler: that is not a refusal of the input).
	for name, in := range map[string]RunCodeInput{
		"stdin 4 MiB": {Lang: "c", Code: "int main(){return 0;}", Stdin: strings.Repeat("a", 4<<20)},
		"1024 args":   {Lang: "c", Code: "int main(){return 0;}", Args: many[:1024]},
	} {
		if _, err := call(t, a, "run_code", in); capCode(err) == capability.InvalidArgument {
			t.Errorf("%s: refused: %v", name, err)
		}
	}
}

// TestCompileTimeoutDefaultDocumented: run_code's schema states the
// default compile budget that runcode applies (a struct tag cannot name
// the constant).
func TestCompileTimeoutDefaultDocumented(t *testing.T) {
	f, _ := reflect.TypeFor[RunCodeInput]().FieldByName("CompileTimeoutMS")
	want := "default " + strconv.FormatInt(runcode.DefaultCompileTimeout.Milliseconds(), 10) + ";"
	if !strings.Contains(f.Tag.Get("jsonschema"), want) {
		t.Errorf("compile_timeout_ms's schema %q does not say %q", f.Tag.Get("jsonschema"), want)
	}
}
