package transpile

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

func TestTransformTS(t *testing.T) {
	t.Parallel()
	r, err := Transform(context.Background(), &Request{Src: "let x: number = 1\nexport const y = x", File: "main.ts", TS: true, Target: ES2022, SourceMap: true})
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Errors) > 0 || !strings.Contains(r.Code, "x = 1") || strings.Contains(r.Code, "number") || len(r.Map) == 0 {
		t.Fatalf("result %+v", r)
	}
	// A refused source: esbuild's errors with their positions.
	r, err = Transform(context.Background(), &Request{Src: "let x = ;", File: "<cell>", TS: true, Target: ESNext})
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Errors) != 1 || r.Errors[0].Line != 1 || r.Errors[0].Column != 9 || r.Code != "" {
		t.Fatalf("result %+v", r)
	}
	// Top-level await keeps ES syntax.
	r, err = Transform(context.Background(), &Request{Src: "const a = await Promise.resolve(1)\nexport {a}", File: "m.ts", TS: true, Target: ES2022})
	if err != nil || len(r.Errors) > 0 || !strings.Contains(r.Code, "await") {
		t.Fatalf("result %+v, %v", r, err)
	}
}

// TestTransformDeepNestingIsAnError runs the attack that killed the
// server when esbuild ran in it: deeply nested code overflows esbuild's
// stack. The child dies; the caller (this test process) gets an error and
// lives, and the next transform works.
func TestTransformDeepNestingIsAnError(t *testing.T) {
	t.Parallel()
	for name, src := range map[string]string{
		"arrows": "let x = " + strings.Repeat("a=>", 100000) + "1",
		"not":    "let x = " + strings.Repeat("!", 256<<10) + "1",
		"parens": "let x = " + strings.Repeat("(", 1<<20) + "1",
		"calls":  "let x = " + strings.Repeat("f(", 1<<20) + "1",
	} {
		_, err := Transform(context.Background(), &Request{Src: src, File: "main.ts", TS: true, Target: ES2022})
		var e *Error
		if !errors.As(err, &e) {
			t.Fatalf("%s: got %v, want an *Error", name, err)
		}
		t.Logf("%s: %v", name, err)
	}
	// The next transform works, and nesting far beyond real code's is
	// within the child's stack.
	nested := "let y: string = " + strings.Repeat("(", 2000) + "'ok'" + strings.Repeat(")", 2000) + "\nlet f = " + strings.Repeat("a=>", 300) + "1"
	if r, err := Transform(context.Background(), &Request{Src: nested, File: "main.ts", TS: true, Target: ESNext}); err != nil || !strings.Contains(r.Code, "ok") {
		t.Fatalf("after the attacks: %v, %v", r, err)
	}
}

// TestTransformTimeout: an arrow chain esbuild takes minutes over is cut
// at the timeout.
func TestTransformTimeout(t *testing.T) {
	t.Parallel()
	src := "let x = " + strings.Repeat("a=>", 32<<10/3) + "1"
	_, err := Transform(context.Background(), &Request{Src: src, File: "main.ts", TS: true, Target: ES2022, Timeout: 2 * time.Second})
	var e *Error
	if !errors.As(err, &e) || e.Kind != TimedOut {
		t.Fatalf("got %v, want a timeout", err)
	}
	if !strings.Contains(err.Error(), "compiling took longer than 2s") {
		t.Fatalf("message %q", err)
	}
}

func TestDecodeReplyIsStrict(t *testing.T) {
	t.Parallel()
	for _, bad := range []string{
		`{"code":"x","extra":1}`,
		`{"code":"x"} {}`,
		`{"errors":[{"text":"a","line":-1,"column":1}]}`,
		`{"errors":[{"text":"a","line":1,"column":0}]}`,
		`{"code":"x","errors":[{"text":"a","line":1,"column":1}]}`,
		`{"errors":[` + strings.Repeat(`{"text":"a"},`, 100) + `{"text":"a"}]}`,
		`[]`, ``,
	} {
		if _, err := decodeReply([]byte(bad)); err == nil {
			t.Errorf("accepted %q", bad)
		}
	}
	if r, err := decodeReply([]byte(`{"code":"x","map":null,"errors":null}` + "\n")); err != nil || r.Code != "x" {
		t.Fatalf("%+v %v", r, err)
	}
}
