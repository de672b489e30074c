package transpile

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/quro-dev/quro/internal/session"
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

// TestTransformTimeout: an arrow chain esbuild takes minutes over (its
// time grows faster than the square of the length) is cut at the timeout.
// 3,000 arrows (9 KB): shallow enough for the child's stack even in a
// race-detector build, whose frames are larger.
func TestTransformTimeout(t *testing.T) {
	t.Parallel()
	src := "let x = " + strings.Repeat("a=>", 3000) + "1"
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

// TestChildIsConfined reads, from /proc, the children a transform left
// idle: nobody (when the server is root), no capability, no_new_privs,
// and the address-space and CPU limits. Not parallel: it runs before the
// parallel tests, so that no other child is starting (not yet confined)
// while it reads /proc.
func TestChildIsConfined(t *testing.T) {
	if _, err := Transform(context.Background(), &Request{Src: "let a: number = 1", File: "a.ts", TS: true, Target: ES2022}); err != nil {
		t.Fatal(err)
	}
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	seen := 0
	for _, d := range dirs {
		cmd, err := os.ReadFile(d + "/cmdline")
		if err != nil || !strings.Contains(string(cmd), Arg) {
			continue
		}
		status, err := os.ReadFile(d + "/status")
		if err != nil || !strings.Contains(string(status), fmt.Sprintf("PPid:\t%d\n", os.Getpid())) {
			continue
		}
		seen++
		st := string(status)
		if os.Geteuid() == 0 && !strings.Contains(st, "Uid:\t65534\t65534\t65534\t65534") {
			t.Errorf("child not nobody:\n%s", st)
		}
		for _, want := range []string{"CapEff:\t0000000000000000", "CapPrm:\t0000000000000000", "NoNewPrivs:\t1"} {
			if !strings.Contains(st, want) {
				t.Errorf("child lacks %q:\n%s", want, st)
			}
		}
		limits, _ := os.ReadFile(d + "/limits")
		for _, want := range []string{fmt.Sprintf("Max address space         %d", childAddressSpace), fmt.Sprintf("Max cpu time              %d", childCPU)} {
			if !strings.Contains(string(limits), want) {
				t.Errorf("child lacks %q:\n%s", want, limits)
			}
		}
	}
	if seen == 0 {
		t.Fatal("no idle child found")
	}
}

func TestReadFrameIsBounded(t *testing.T) {
	t.Parallel()
	if _, err := readFrame(bytes.NewReader([]byte{0, 0, 1, 0, 'x'}), 255); err == nil || !strings.Contains(err.Error(), "over its bound") {
		t.Fatalf("got %v", err)
	}
	if _, err := readFrame(bytes.NewReader([]byte{0, 0, 0, 5, 'x'}), 255); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("got %v", err)
	}
}

// TestTransformConcurrent: transforms at once share the kept children,
// each getting its own answer.
func TestTransformConcurrent(t *testing.T) {
	t.Parallel()
	errs := make(chan error, 8)
	for i := range 8 {
		go func() {
			want := fmt.Sprintf("v%d", i)
			r, err := Transform(context.Background(), &Request{Src: fmt.Sprintf("let %s: number = %d", want, i), File: "a.ts", TS: true, Target: ESNext})
			if err == nil && !strings.Contains(r.Code, fmt.Sprintf("let %s = %d", want, i)) {
				err = fmt.Errorf("transform %d: %q", i, r.Code)
			}
			errs <- err
		}()
	}
	for range 8 {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
}

// waitEntered waits until name has n transforms in Transform.
func waitEntered(name string, n int) {
	ownersMu.Lock()
	defer ownersMu.Unlock()
	for owners[name] == nil || owners[name].entered < n {
		ownersCh.Wait()
	}
}

// TestOneTenantCannotHoldEveryChild runs the starvation attack: tenant a
// sends more sources esbuild takes minutes over than there are slots
// (each would hold its slot until its timeout, one after another);
// tenant b's snippet, sent after them, still compiles while every one of
// a's is running or waiting.
func TestOneTenantCannotHoldEveryChild(t *testing.T) {
	t.Parallel()
	actx, cancel := context.WithCancel(session.WithTenant(context.Background(), "a"))
	slow := "let x = " + strings.Repeat("a=>", 3000) + "1"
	n := cap(slots) + 2
	aDone := make(chan error, n)
	for range n {
		go func() {
			_, err := Transform(actx, &Request{Src: slow, File: "a.ts", TS: true, Target: ES2022, Timeout: 5 * time.Minute})
			aDone <- err
		}()
	}
	defer func() {
		cancel()
		for range n {
			<-aDone
		}
	}()
	waitEntered("a", n)
	// A generous bound, for a loaded machine: without the owner's line b
	// waits behind a's timeouts, minutes.
	bctx, bcancel := context.WithTimeout(session.WithTenant(context.Background(), "b"), time.Minute)
	defer bcancel()
	r, err := Transform(bctx, &Request{Src: "let b: number = 1", File: "b.ts", TS: true, Target: ES2022})
	if err != nil || !strings.Contains(r.Code, "let b = 1") {
		t.Fatalf("tenant b's transform while a's run: %v, %+v", err, r)
	}
	if got := len(aDone); got > 0 {
		t.Fatalf("%d of a's transforms ended before b's answered: the test did not hold the slots", got)
	}
}
