package js

import (
	"context"
	"fmt"
	"strings"
	"testing"
)

// TestTranspileCacheKeys: sources of the same length, and one source under
// another file name or loader, are different entries.
func TestTranspileCacheKeys(t *testing.T) {
	e := newEnv(t, nil)
	for range 2 { // the second round is served from the cache
		check{exactStdout: ptr("➡️ 1\n")}.verify(t, e.run(t, "ts", "const a: number = 1; a"))
		check{exactStdout: ptr("➡️ 2\n")}.verify(t, e.run(t, "ts", "const a: number = 2; a"))
		check{exactStdout: ptr("➡️ 3\n")}.verify(t, e.run(t, "ts", "const b: number = 3; b"))
	}
	c := e.eng.cache
	if n := len(c.byKey); n != 3 {
		t.Fatalf("%d cache entries, want 3", n)
	}

	one, err := c.transpile(context.Background(), "", "let x: number = 1\n", "a.ts", true)
	if err != nil {
		t.Fatal(err)
	}
	other, err := c.transpile(context.Background(), "", "let x: number = 1\n", "b.ts", true)
	if err != nil {
		t.Fatal(err)
	}
	if one == other {
		t.Fatal("two file names share an entry")
	}
	// The same text as JavaScript is an error (a type annotation), as
	// TypeScript it is not.
	if _, err := c.transpile(context.Background(), "", "let x: number = 1\n", "a.ts", false); err == nil {
		t.Fatal("a TypeScript annotation transpiled as JavaScript")
	}
	again, err := c.transpile(context.Background(), "", "let x: number = 1\n", "a.ts", true)
	if err != nil || again != one {
		t.Fatalf("not served from the cache: %v", err)
	}
}

// TestTranspileCacheErrors: a source esbuild refuses gives the same
// complete error every time, from the cache or not, inline and required.
func TestTranspileCacheErrors(t *testing.T) {
	e := newEnv(t, nil)
	want := check{exit: 1, exactStdout: ptr(""), stderr: []string{"SyntaxError: Unexpected \"=\"", "<code>:2:8", "2 | let y: = 2;", "|        ^"}}
	var first string
	for i := range 3 {
		o := e.run(t, "ts", "let x = 1;\nlet y: = 2;\n")
		want.verify(t, o)
		if i == 0 {
			first = o.stderr
		} else if o.stderr != first {
			t.Fatalf("run %d: stderr %q, first run %q", i, o.stderr, first)
		}
	}
	// Another broken source of the same length has its own error.
	check{exit: 1, stderr: []string{"<code>:1:8", "1 | let z: = 3;"}, notStderr: []string{"let y"}}.verify(t, e.run(t, "ts", "let z: = 3;\nlet w = 4;\n"))

	e.write(t, "bad.ts", "export const v: = 1;\n")
	for range 2 {
		check{exit: 1, stderr: []string{"in a required module", "bad.ts:1:17", "1 | export const v: = 1;"}}.verify(t, e.run(t, "js", "require('./bad')"))
	}
}

// TestTranspileCacheEditedModule: a module edited between runs, to a text
// of the same length, is transpiled again.
func TestTranspileCacheEditedModule(t *testing.T) {
	e := newEnv(t, nil)
	for i := range 3 {
		e.write(t, "m.ts", fmt.Sprintf("export const v: number = %d;\n", i))
		check{exactStdout: ptr(fmt.Sprintf("➡️ %d\n", i))}.verify(t, e.run(t, "js", "require('./m').v"))
	}
}

// TestTranspileCacheBounded: the cache holds at most its byte limit,
// dropping the least recently used entries, and keeps no entry larger than
// an eighth of it.
func TestTranspileCacheBounded(t *testing.T) {
	c := newTranspileCache(64 << 10)
	src := func(i int) string { return fmt.Sprintf("const v%d: number = %d;\n", i, i) }
	for i := range 1000 {
		if _, err := c.transpile(context.Background(), "", src(i), "a.ts", true); err != nil {
			t.Fatal(err)
		}
		// Keep entry 0 in use: it must survive.
		if _, err := c.transpile(context.Background(), "", src(0), "a.ts", true); err != nil {
			t.Fatal(err)
		}
		if c.bytes > c.limit {
			t.Fatalf("after %d entries: %d bytes cached, over the limit of %d", i+1, c.bytes, c.limit)
		}
	}
	if n := len(c.byKey); n < 10 || n >= 1000 || n != c.lru.Len() {
		t.Fatalf("%d entries (%d in the list) after 1000 sources in 64 KiB", n, c.lru.Len())
	}
	if _, ok := c.byKey[cacheKey("", src(0), "a.ts", true)]; !ok {
		t.Fatal("the most recently used entry was dropped")
	}
	if _, ok := c.byKey[cacheKey("", src(1), "a.ts", true)]; ok {
		t.Fatal("the least recently used entry was kept")
	}
	big := "const s: string = \"" + strings.Repeat("x", 10<<10) + "\";\n"
	if _, err := c.transpile(context.Background(), "", big, "a.ts", true); err != nil {
		t.Fatal(err)
	}
	if _, ok := c.byKey[cacheKey("", big, "a.ts", true)]; ok {
		t.Fatal("an entry over an eighth of the limit was kept")
	}

	off := newEnv(t, &Options{TranspileCache: -1})
	check{exactStdout: ptr("➡️ 1\n")}.verify(t, off.run(t, "ts", "const a: number = 1; a"))
	if n := len(off.eng.cache.byKey); n != 0 {
		t.Fatalf("cache off: %d entries", n)
	}
}

// TestTranspileCacheIsEachTenants: a tenant's run of a source another
// tenant ran is not served from that tenant's entry (a hit answers in a
// fraction of a miss's time: BenchmarkRunTS against BenchmarkRunTSUncached,
// so a shared entry would tell, by timing, whether another tenant had run
// exactly that source); each tenant's own runs are, inline and required.
func TestTranspileCacheIsEachTenants(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	const probe = `const pin: string = "4711"; pin.length`
	e.write(t, "m.ts", "export const v: number = 7;\n")
	runAs := func(tenant string) {
		t.Helper()
		e.sess.Tenant = tenant
		check{exactStdout: ptr("➡️ 4\n")}.verify(t, e.run(t, "ts", probe))
		check{exactStdout: ptr("➡️ 7\n")}.verify(t, e.run(t, "js", "require('./m').v"))
	}
	runAs("victim")
	c := e.eng.cache
	c.mu.Lock()
	before := len(c.byKey)
	c.mu.Unlock()
	runAs("attacker")
	c.mu.Lock()
	after := len(c.byKey)
	_, shared := c.byKey[cacheKey("", probe, mainName, true)]
	c.mu.Unlock()
	if before != 2 || after != 4 || shared {
		t.Fatalf("cache entries: %d after the victim's runs, %d after the attacker's (want 2 and 4: none shared)", before, after)
	}
	runAs("victim")
	c.mu.Lock()
	defer c.mu.Unlock()
	if n := len(c.byKey); n != 4 {
		t.Fatalf("a tenant's second runs made %d entries, want them served from its own", n)
	}
}
