package js

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/quro-dev/quro/internal/runcode"
	"github.com/quro-dev/quro/internal/sandbox"
	"github.com/quro-dev/quro/internal/session"
)

// testEnv is a session with a workspace, and an engine.
type testEnv struct {
	eng  *Engine
	sess *session.Session
	ws   string // the workspace directory
}

func newEnv(t *testing.T, opts *Options) *testEnv {
	t.Helper()
	dir := t.TempDir()
	s := &session.Session{ID: "0123456789abcdef0123456789abcdef", Name: "test", Dir: dir, Env: map[string]string{"GREETING": "hello"}, UID: 2999001}
	if err := os.MkdirAll(s.Workspace(), 0o755); err != nil {
		t.Fatal(err)
	}
	return &testEnv{eng: New(opts), sess: s, ws: s.Workspace()}
}

func (e *testEnv) write(t *testing.T, rel, text string) {
	t.Helper()
	p := filepath.Join(e.ws, rel)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
}

type outcome struct {
	res            *runcode.Result
	stdout, stderr string
}

// syncBuffer is a bytes.Buffer that a test may read while the run writes.
type syncBuffer struct {
	mu      sync.Mutex
	b       bytes.Buffer
	onWrite func()
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.onWrite != nil {
		s.onWrite()
	}
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func (e *testEnv) runCtx(t *testing.T, ctx context.Context, lang, code string, timeout time.Duration, stdout *syncBuffer) outcome {
	t.Helper()
	if stdout == nil {
		stdout = &syncBuffer{}
	}
	var stderr syncBuffer
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	res, err := e.eng.Run(ctx, &runcode.Request{Code: code, Lang: lang, Session: e.sess, Timeout: timeout, Stdout: stdout, Stderr: &stderr})
	if err != nil {
		t.Fatalf("engine error: %v\nstdout: %s\nstderr: %s", err, stdout.String(), stderr.String())
	}
	return outcome{res: res, stdout: stdout.String(), stderr: stderr.String()}
}

func (e *testEnv) run(t *testing.T, lang, code string) outcome {
	t.Helper()
	return e.runCtx(t, context.Background(), lang, code, 10*time.Second, nil)
}

// check is one expectation on a run.
type check struct {
	exit        int
	timedOut    bool
	stdout      []string // substrings of stdout
	stderr      []string // substrings of stderr
	notStderr   []string
	errorHas    string // substring of res.Error
	exactStdout *string
}

func (c check) verify(t *testing.T, o outcome) {
	t.Helper()
	if o.res.ExitCode != c.exit {
		t.Errorf("exit code %d, want %d\nstdout: %s\nstderr: %s\nerror: %s", o.res.ExitCode, c.exit, o.stdout, o.stderr, o.res.Error)
	}
	if o.res.TimedOut != c.timedOut {
		t.Errorf("timed out %v, want %v (error %q)", o.res.TimedOut, c.timedOut, o.res.Error)
	}
	if c.timedOut && !o.res.Interrupted {
		t.Errorf("a timed-out run must be marked interrupted")
	}
	for _, s := range c.stdout {
		if !strings.Contains(o.stdout, s) {
			t.Errorf("stdout lacks %q:\n%s", s, o.stdout)
		}
	}
	for _, s := range c.stderr {
		if !strings.Contains(o.stderr, s) {
			t.Errorf("stderr lacks %q:\n%s", s, o.stderr)
		}
	}
	for _, s := range c.notStderr {
		if strings.Contains(o.stderr, s) {
			t.Errorf("stderr has %q:\n%s", s, o.stderr)
		}
	}
	if c.errorHas != "" && !strings.Contains(o.res.Error, c.errorHas) {
		t.Errorf("error %q lacks %q", o.res.Error, c.errorHas)
	}
	if c.errorHas == "" && !c.timedOut && o.res.Error != "" {
		t.Errorf("unexpected engine error %q", o.res.Error)
	}
	if c.exactStdout != nil && o.stdout != *c.exactStdout {
		t.Errorf("stdout %q, want %q", o.stdout, *c.exactStdout)
	}
}

func ptr(s string) *string { return &s }

func TestRun(t *testing.T) {
	e := newEnv(t, nil)
	e.write(t, "lib/util.js", "exports.double = x => x * 2\nexports.boom = () => {\n  null.x\n}\n")
	e.write(t, "lib/data.json", `{"n": 7}`)
	e.write(t, "lib/index.js", "module.exports = 'index'\n")
	e.write(t, "cycle/a.js", "exports.name = 'a'\nconst b = require('./b')\nexports.seen = b.seenA\n")
	e.write(t, "cycle/b.js", "const a = require('./a')\nexports.seenA = a.name\n")
	e.write(t, "esm.mjs", "export const k = 3\nexport default function hi(n) { return 'hi ' + n }\n")
	e.write(t, "shape.ts", "export interface Shape { w: number; h: number }\n"+
		"export function area(s: Shape): number {\n"+
		"  if (s.w < 0) throw new RangeError('negative width')\n"+
		"  return s.w * s.h\n}\n")
	e.write(t, "bad.ts", "export const x: number = ;\n")
	e.write(t, "badsyntax.js", "const ok = 1\nfunction (\n")
	e.write(t, "script.js", "#!/usr/bin/env node\nmodule.exports = 'shebang ok'\n")

	tests := []struct {
		name string
		lang string
		code string
		want check
	}{
		{"no output", "js", "let x = 1", check{exactStdout: ptr("")}},
		{"completion value", "js", "1 + 2", check{exactStdout: ptr("➡️ 3\n")}},
		{"string result is JSON", "js", "'a' + 'b'", check{exactStdout: ptr("➡️ \"ab\"\n")}},
		{"pretty object", "js", "({a: 1, b: [true, null]})", check{exactStdout: ptr("➡️ {\n  \"a\": 1,\n  \"b\": [\n    true,\n    null\n  ]\n}\n")}},
		{"special values", "js", "[NaN, 10n, undefined, () => 1, new Map([[1, 'x']]), new Set([2])]",
			check{stdout: []string{`"NaN"`, `"10n"`, `"[undefined]"`, `"[Function (anonymous)]"`, `"[Map]"`, `"[Set]"`}}},
		{"circular", "js", "const o = {}; o.self = o; o", check{stdout: []string{`"self": "[Circular]"`}}},
		{"console", "js", "console.log('a', 1, {b: 2}, [3]); console.info('%s=%d', 'x', 42); console.warn('w'); console.error('e')",
			check{exactStdout: ptr("a 1 {\"b\":2} [3]\nx=42\n"), stderr: []string{"w\ne\n"}}},
		{"console.log of an error maps its stack", "js", "\n\nconsole.log(new Error('logged'))", check{stdout: []string{"Error: logged\n    at <top level> (<code>:3:"}}},
		{"module.exports is the result", "js", "module.exports = {a: 1}; undefined", check{stdout: []string{"\"a\": 1"}}},
		{"exports.x is the result", "js", "exports.x = 1; void 0", check{stdout: []string{"\"x\": 1"}}},
		{"top-level await", "js", "const v = await Promise.resolve(41); v + 1", check{exactStdout: ptr("➡️ 42\n")}},
		{"async function result awaited", "js", "(async () => { await null; return 'late' })()", check{exactStdout: ptr("➡️ \"late\"\n")}},
		{"timers in order", "js", "setTimeout(() => console.log('b'), 2); setTimeout(() => console.log('a'), 0); const id = setTimeout(() => console.log('never'), 1); clearTimeout(id); Promise.resolve().then(() => console.log('micro'))",
			check{exactStdout: ptr("micro\na\nb\n")}},
		// The interval clears itself on its third tick, then a later timer
		// looks: n stays 3 however slowly the ticks come (a fixed 5 ms
		// wait raced the ticks on a loaded machine).
		{"setInterval cleared", "js", "let n = 0; await new Promise(r => { const i = setInterval(() => { if (++n === 3) { clearInterval(i); r() } }, 0) }); await new Promise(r => setTimeout(r, 5)); n", check{exactStdout: ptr("➡️ 3\n")}},
		{"require with and without extension", "js", "[require('./lib/util').double(2), require('./lib/util.js').double(3), require('./lib/data.json').n, require('./lib')]",
			check{stdout: []string{"4,", "6,", "7,", "\"index\""}}},
		{"require cache", "js", "require('./lib/util') === require('./lib/util.js')", check{exactStdout: ptr("➡️ true\n")}},
		{"require cycle", "js", "require('./cycle/a')", check{stdout: []string{`"seen": "a"`}}},
		{"require ES module", "js", "const m = require('./esm.mjs'); [m.k, m.default(2)]", check{stdout: []string{"3", "\"hi 2\""}}},
		{"require TypeScript", "js", "require('./shape').area({w: 2, h: 3})", check{exactStdout: ptr("➡️ 6\n")}},
		{"error in TypeScript module maps to TS lines", "js", "require('./shape').area({w: -1, h: 3})",
			check{exit: 1, stderr: []string{"Uncaught RangeError: negative width", "at area (shape.ts:3:", "3 |   if (s.w < 0) throw new RangeError('negative width')"}}},
		{"invalid TypeScript module", "js", "require('./bad.ts')", check{exit: 1, stderr: []string{"SyntaxError", "bad.ts:1:26", "Unexpected \";\""}}},
		{"syntax error in module", "js", "require('./badsyntax')", check{exit: 1, stderr: []string{"SyntaxError", "badsyntax.js:2:"}}},
		{"shebang", "js", "require('./script')", check{exactStdout: ptr("➡️ \"shebang ok\"\n")}},
		{"error with stack and excerpt", "js", "function g() {\n  throw new TypeError('boom')\n}\ng()",
			check{exit: 1, stderr: []string{"Uncaught TypeError: boom\n    at g (<code>:2:", "at <top level> (<code>:4:", "2 |   throw new TypeError('boom')"}}},
		{"error in required module", "js", "require('./lib/util').boom()", check{exit: 1, stderr: []string{"lib/util.js:3:", "at <top level> (<code>:1:"}}},
		{"thrown non-error", "js", "throw {code: 7}", check{exit: 1, stderr: []string{`Uncaught {"code":7}`}}},
		{"rejected promise", "js", "await Promise.reject(new Error('nope'))", check{exit: 1, stderr: []string{"Uncaught Error: nope"}}},
		{"error in a timer", "js", "setTimeout(() => { throw new Error('in timer') }, 0)", check{exit: 1, stderr: []string{"Uncaught Error: in timer"}}},
		{"syntax error", "js", "let x = ;", check{exit: 1, stderr: []string{"SyntaxError: unexpected token", "at <code>:1:9", "1 | let x = ;"}}},
		{"typescript", "ts", "interface P { x: number }\nconst p: P = {x: 2}\nenum E { A = 5 }\np.x * E.A", check{exactStdout: ptr("➡️ 10\n")}},
		{"typescript error lines", "ts", "type T = string\n\nfunction f(a: T): never {\n  throw new Error('bad ' + a)\n}\nf('q')",
			check{exit: 1, stderr: []string{"at f (<code>:4:", "4 |   throw new Error('bad ' + a)", "at <top level> (<code>:6:"}}},
		{"invalid typescript", "ts", "const x: number = ;\nlet y = 2", check{exit: 1, stderr: []string{"SyntaxError: Unexpected \";\"", "at <code>:1:19", "1 | const x: number = ;"}}},
		{"typescript with top-level await", "ts", "const n: number = await Promise.resolve(5)\nn", check{exactStdout: ptr("➡️ 5\n")}},
		{"inline ES module syntax", "js", "import { area } from './shape.ts'\nexport const a = area({w: 3, h: 3})", check{stdout: []string{`"a": 9`}}},
		{"ES2023", "js", "class A { #x = 1; get x() { return this.#x } }\n" +
			"async function* gen() { yield 1; yield 2 }\n" +
			"const got = []; for await (const v of gen()) got.push(v)\n" +
			"const p = new Proxy({}, { get: (_, k) => k });\n" +
			"[new A().x, 2n ** 64n, got, p.hello, typeof WeakRef, [3, 1, 2].toSorted(), [1, 2].findLast(x => x < 2)]",
			check{stdout: []string{"1,", "\"18446744073709551616n\"", "\"hello\"", "\"function\""}}},
		{"Tools.Files", "js", "Tools.Files.write('out/a.txt', 'hello'); Tools.Files.write('out/a.txt', ' world', {append: true}); Tools.Files.write('out/o.json', {k: 1});\n" +
			"[Tools.Files.read('out/a.txt'), Tools.Files.exists('out/a.txt'), Tools.Files.exists('nope'), Tools.Files.list('out').map(e => e.name + ':' + e.type), JSON.parse(Tools.Files.read('out/o.json')).k, Tools.Files.remove('out'), Tools.Files.exists('out')]",
			check{stdout: []string{`"hello world"`, "true", "false", `"a.txt:file"`, `"o.json:file"`}}},
		{"Tools.System", "js", "[Tools.System.env('GREETING'), Tools.System.env().GREETING, typeof Tools.System.time().unix_ms, Tools.System.platform().os]",
			check{stdout: []string{`"hello"`, `"number"`, `"linux"`}}},
		{"Tools.calc", "js", "[Tools.calc('2^10 + sqrt(16) * 2'), Tools.calc('max(1, 7, 3) % 4')]", check{stdout: []string{"1032", "3"}}},
		{"Tools.calc refuses code", "js", "Tools.calc('process.exit()')", check{exit: 1, stderr: []string{"Tools.calc: calc: unknown name \"process\""}}},
		{"Data helpers", "js", "const xs = [{k: 'a', v: 2}, {k: 'b', v: 5}, {k: 'a', v: 1}];\n" +
			"[Data.sum(xs, 'v'), Data.countBy(xs, 'k'), Data.sortBy(xs, 'v').map(x => x.v), Data.uniq(xs, 'k').length, Data.chunk([1, 2, 3], 2), Data.range(3), Data.pick({a: 1, b: 2}, ['a']), Data.omit({a: 1, b: 2}, ['a']), Object.keys(Data.groupBy(xs, x => x.k))]",
			check{stdout: []string{"8,", `"a": 2`, "[\n    1,\n    2,\n    5\n  ]"}}},
		{"Tools is frozen", "js", "Tools.Files = null; Tools.Files.read === undefined", check{exactStdout: ptr("➡️ false\n")}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tc.want.verify(t, e.run(t, tc.lang, tc.code))
		})
	}
}

// TestAttacks runs the bad inputs and attacks of the JS sandbox; each must
// end as a clean result and leave the engine usable.
func TestAttacks(t *testing.T) {
	outside := t.TempDir()
	if err := os.WriteFile(filepath.Join(outside, "secret.js"), []byte("module.exports = 'secret'"), 0o644); err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, &Options{MemoryLimit: 32 << 20})
	if err := os.Symlink(outside, filepath.Join(e.ws, "out")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(outside, "secret.js"), filepath.Join(e.ws, "link.js")); err != nil {
		t.Fatal(err)
	}
	outsideFile := filepath.Join(outside, "written.txt")

	tests := []struct {
		name    string
		code    string
		timeout time.Duration
		want    check
	}{
		{"infinite loop", "while (true) {}", 300 * time.Millisecond, check{exit: 1, timedOut: true, errorHas: "timed out"}},
		{"loop that catches the interrupt", "for (;;) { try { while (true) {} } catch (e) {} finally { continue } }", 300 * time.Millisecond, check{exit: 1, timedOut: true, errorHas: "timed out"}},
		// Each job queues the next and keeps nothing: the job queue never
		// empties and memory stays flat, so only the deadline can end it
		// (a chain of promises each resolved with the next also grows
		// memory, and then the 32 MiB limit may win the race).
		{"endless promise chain", "const f = () => { Promise.resolve().then(f) }; f()", 300 * time.Millisecond, check{exit: 1, timedOut: true}},
		{"endless interval", "setInterval(() => {}, 1)", 300 * time.Millisecond, check{exit: 1, timedOut: true}},
		{"timer after the budget", "setTimeout(() => console.log('late'), 60000)", 300 * time.Millisecond, check{exit: 1, timedOut: true, errorHas: "the next timer is due in"}},
		{"catastrophic regexp", "/(a+)+$/.test('a'.repeat(40) + 'b')", 300 * time.Millisecond, check{exit: 1, timedOut: true}},
		{"memory bomb", "const arr = []; while (true) arr.push(new Array(1e6))", 0, check{exit: 1, stderr: []string{"memory limit of 32 MiB"}}},
		{"string bomb", "let s = 'x'; while (true) s += s", 0, check{exit: 1, stderr: []string{"Uncaught"}}},
		{"memory bomb caught, then more work", "function bomb() { const a = []; while (true) a.push(new Array(1e5)) }\nlet n = 0; try { bomb() } catch (e) { n++ } [n, [1, 2, 3].map(x => x * 2)]", 0, check{stdout: []string{"1,", "6"}}},
		{"deep recursion", "function f(n) { return f(n + 1) + 1 }\nf(0)", 0, check{exit: 1, stderr: []string{"InternalError: stack overflow", "repeated", "at f (<code>:1:"}}},
		{"deep recursion is catchable", "function f(n) { return f(n + 1) + 1 }\ntry { f(0) } catch (e) { e.message }", 0, check{exactStdout: ptr("➡️ \"stack overflow\"\n")}},
		{"require ../../etc/passwd", "require('../../etc/passwd')", 0, check{exit: 1, stderr: []string{`require("../../etc/passwd"): "../../etc/passwd" leads out of the session workspace: path leads outside the session workspace`}}},
		{"require absolute path", "require('/etc/passwd')", 0, check{exit: 1, stderr: []string{"path leads outside the session workspace"}}},
		{"require a built-in", "require('child_process')", 0, check{exit: 1, stderr: []string{"only files of the session workspace can be required"}}},
		{"require through a symlink out", "require('./out/secret.js')", 0, check{exit: 1, stderr: []string{"path leads outside the session workspace", "symbolic link"}}},
		{"require a symlink to a file out", "require('./link')", 0, check{exit: 1, stderr: []string{"path leads outside the session workspace"}}},
		{"read /etc/shadow", "Tools.Files.read('/etc/shadow')", 0, check{exit: 1, stderr: []string{`Tools.Files.read: "/etc/shadow" is not inside the session workspace`, "path leads outside the session workspace"}}},
		{"read with ..", "Tools.Files.read('a/../../x')", 0, check{exit: 1, stderr: []string{"path leads outside the session workspace"}}},
		{"read through a symlink out", "Tools.Files.read('out/secret.js')", 0, check{exit: 1, stderr: []string{"path leads outside the session workspace"}}},
		{"list through a symlink out", "Tools.Files.list('out')", 0, check{exit: 1, stderr: []string{"path leads outside the session workspace"}}},
		{"exists through a symlink out", "Tools.Files.exists('out/secret.js')", 0, check{exit: 1, stderr: []string{"path leads outside the session workspace"}}},
		{"write through a symlink out", "Tools.Files.write('out/written.txt', 'x')", 0, check{exit: 1, stderr: []string{"path leads outside the session workspace"}}},
		{"write outside by absolute path", "Tools.Files.write(" + jsString(outsideFile) + ", 'x')", 0, check{exit: 1, stderr: []string{"path leads outside the session workspace"}}},
		{"remove the workspace", "Tools.Files.remove('.')", 0, check{exit: 1, stderr: []string{"cannot remove the workspace itself"}}},
		{"eval and Function cannot reach the host", "[typeof __quro_host, typeof __quro_compile, eval('typeof __quro_host'), Function('return typeof __quro_compile')(),\n" +
			"typeof process, typeof std, typeof os, typeof print, typeof globalThis.Deno, Function('return this')() === globalThis,\n" +
			"Object.getOwnPropertyNames(globalThis).filter(k => k.startsWith('__')).join()]", 0,
			check{exactStdout: ptr("➡️ [\n  \"undefined\",\n  \"undefined\",\n  \"undefined\",\n  \"undefined\",\n  \"undefined\",\n  \"undefined\",\n  \"undefined\",\n  \"undefined\",\n  \"undefined\",\n  true,\n  \"__filename,__dirname\"\n]\n")}},
		{"eval'd code is confined too", "eval(\"Tools.Files.read('/etc/passwd')\")", 0, check{exit: 1, stderr: []string{"path leads outside the session workspace"}}},
		{"Function-built code is confined too", "new Function(\"return require('../../etc/passwd')\")()", 0, check{exit: 1, stderr: []string{"path leads outside the session workspace"}}},
		{"constructor escape finds no host", "Tools.Files.read.constructor('return typeof __quro_host')()", 0, check{exactStdout: ptr("➡️ \"undefined\"\n")}},
		{"never-settling promise", "await new Promise(() => {})", 0, check{exit: 1, stderr: []string{"never settled"}}},
		{"never-settling promise as result", "new Promise(() => {})", 0, check{exit: 1, stderr: []string{"never settled"}}},
		{"fetch without a network policy", "await fetch('http://127.0.0.1:1/')", 0, check{exit: 1, stderr: []string{`network policy is "none"`}}},
		{"fetch of a file URL", "await Tools.Net.fetch('file:///etc/passwd')", 0, check{exit: 1, stderr: []string{"only absolute http and https URLs"}}},
		{"throw null", "throw null", 0, check{exit: 1, stderr: []string{"Uncaught null"}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			timeout := tc.timeout
			if timeout == 0 {
				timeout = 20 * time.Second
			}
			tc.want.verify(t, e.runCtx(t, context.Background(), "js", tc.code, timeout, nil))
		})
	}
	if _, err := os.Stat(outsideFile); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a file was written outside the workspace: %v", err)
	}
	// The engine is still healthy after all that.
	check{exactStdout: ptr("➡️ 2\n")}.verify(t, e.run(t, "js", "1 + 1"))
}

// TestSymlinkSwap replaces a directory the code used by a symlink that
// leads out: the next access is refused.
func TestSymlinkSwap(t *testing.T) {
	outside := t.TempDir()
	if err := os.WriteFile(filepath.Join(outside, "f.txt"), []byte("outside"), 0o644); err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, nil)
	e.write(t, "d/f.txt", "inside")
	check{exactStdout: ptr("➡️ \"inside\"\n")}.verify(t, e.run(t, "js", "Tools.Files.read('d/f.txt')"))
	if err := os.RemoveAll(filepath.Join(e.ws, "d")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, filepath.Join(e.ws, "d")); err != nil {
		t.Fatal(err)
	}
	check{exit: 1, stderr: []string{"path leads outside the session workspace"}, notStderr: []string{"outside\""}}.verify(t,
		e.run(t, "js", "Tools.Files.read('d/f.txt')"))
	check{exit: 1, stderr: []string{"path leads outside the session workspace"}}.verify(t,
		e.run(t, "js", "Tools.Files.write('d/g.txt', 'x')"))
	if _, err := os.Stat(filepath.Join(outside, "g.txt")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("write followed the swapped symlink: %v", err)
	}
}

// TestBigScript runs a 10 MB script: it runs, or fails cleanly.
func TestBigScript(t *testing.T) {
	e := newEnv(t, nil)
	var b strings.Builder
	line := "total += 1; // padding padding padding padding padding padding\n"
	b.WriteString("let total = 0;\n")
	for b.Len() < 10<<20 {
		b.WriteString(line)
	}
	b.WriteString("total\n")
	// Clean: the total, a memory error, or (on a slow build such as -race)
	// a timeout.
	clean := func(o outcome) bool {
		return o.res.ExitCode == 0 && strings.HasPrefix(o.stdout, "➡️ ") ||
			o.res.TimedOut || strings.Contains(o.stderr, "memory")
	}
	o := e.run(t, "js", b.String())
	if !clean(o) {
		t.Errorf("a 10 MB script: %+v, stdout %q, stderr %q", o.res, o.stdout, o.stderr)
	}
	t.Logf("10 MB script: exit %d, timed out %v, stdout %q, stderr %q", o.res.ExitCode, o.res.TimedOut, o.stdout, o.stderr)
	// The same script as a workspace file, required.
	e.write(t, "big.js", b.String())
	o = e.run(t, "js", "require('./big.js')")
	if !clean(o) {
		t.Errorf("a 10 MB module: %+v, stdout %q, stderr %q", o.res, o.stdout, o.stderr)
	}
}

// TestCancel: a caller that goes away interrupts the code; the run is
// interrupted, not timed out.
func TestCancel(t *testing.T) {
	e := newEnv(t, nil)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var once sync.Once
	out := &syncBuffer{onWrite: func() { once.Do(cancel) }}
	o := e.runCtx(t, ctx, "js", "console.log('started'); while (true) {}", 20*time.Second, out)
	if !o.res.Interrupted || o.res.TimedOut || !strings.Contains(o.res.Error, "canceled") {
		t.Errorf("result %+v, want interrupted by cancel", o.res)
	}
	if o.stdout != "started\n" {
		t.Errorf("stdout %q", o.stdout)
	}
}

// TestFetch: with a network policy that allows it, fetch reaches a server
// on the loopback; the policy is asked for every redirect too.
func TestFetch(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/json":
			w.Header().Set("Content-Type", "application/json")
			w.Write([]byte(`{"method": "` + r.Method + `"}`))
		case "/redirect":
			http.Redirect(w, r, "/forbidden", http.StatusFound)
		default:
			http.NotFound(w, r)
		}
	}))
	defer srv.Close()
	var asked []string
	var mu sync.Mutex
	e := newEnv(t, &Options{Network: func(sessionID string, u *url.URL) error {
		mu.Lock()
		defer mu.Unlock()
		asked = append(asked, sessionID+" "+u.Path)
		if u.Path == "/forbidden" {
			return errors.New("not on the allowlist")
		}
		return nil
	}})
	e.sess.Network = sandbox.NetworkHost
	o := e.run(t, "js", "const r = await fetch("+jsString(srv.URL+"/json")+", {method: 'POST', body: {a: 1}});\n[r.status, r.ok, r.headers.get('content-type'), (await r.json()).method]")
	check{stdout: []string{"200,", "true,", `"application/json"`, `"POST"`}}.verify(t, o)
	o = e.run(t, "js", "await fetch("+jsString(srv.URL+"/redirect")+")")
	check{exit: 1, stderr: []string{"not on the allowlist"}}.verify(t, o)
	if len(asked) != 3 || !strings.HasPrefix(asked[0], e.sess.ID+" ") {
		t.Errorf("policy asked %q", asked)
	}
}

// TestEntries runs the code of run_js_file and call_js_function.
func TestEntries(t *testing.T) {
	e := newEnv(t, nil)
	e.write(t, "app.js", "console.log('running')\nmodule.exports = { ok: true }\n")
	e.write(t, "quiet.js", "console.log('just output')\n")
	e.write(t, "math.ts", "export function add(a: number, b: number): number { return a + b }\n"+
		"export async function later(x: {n: number}): Promise<number> { await null; return x.n * 2 }\n"+
		"export default function () { return 'default' }\n")

	rel, err := CheckFile(e.ws, "app.js")
	if err != nil {
		t.Fatal(err)
	}
	check{stdout: []string{"running\n➡️ {\n  \"ok\": true\n}\n"}}.verify(t, e.run(t, "js", FileEntry(rel)))
	check{exactStdout: ptr("just output\n")}.verify(t, e.run(t, "js", FileEntry("quiet.js")))

	calls := []struct {
		fn   string
		args []string
		want check
	}{
		{"add", []string{"2", "3"}, check{exactStdout: ptr("➡️ 5\n")}},
		{"later", []string{`{"n": 21}`}, check{exactStdout: ptr("➡️ 42\n")}},
		{"default", nil, check{exactStdout: ptr("➡️ \"default\"\n")}},
		{"missing", nil, check{exit: 1, stderr: []string{`math.ts has no exported function missing; it exports: add, default, later`}}},
	}
	for _, c := range calls {
		var args []json.RawMessage
		for _, a := range c.args {
			args = append(args, json.RawMessage(a))
		}
		code, err := CallEntry("math.ts", c.fn, args)
		if err != nil {
			t.Fatal(err)
		}
		c.want.verify(t, e.run(t, "js", code))
	}

	for _, bad := range []struct{ path, want string }{
		{"../x.js", "outside"},
		{"/etc/passwd", "outside"},
		{"nope.js", "no such file"},
		{"data.txt", "not a .js or .ts file"},
	} {
		if _, err := CheckFile(e.ws, bad.path); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("CheckFile(%q) = %v, want %q", bad.path, err, bad.want)
		}
	}
	if _, err := CheckFile(e.ws, "nope.js"); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a missing file must match os.ErrNotExist: %v", err)
	}
	if _, err := CallEntry("math.ts", "a-b", nil); err == nil {
		t.Error("a function name that is not an identifier was accepted")
	}
	if _, err := CallEntry("math.ts", "add", []json.RawMessage{json.RawMessage("1); process.exit(")}); err == nil {
		t.Error("an argument that is not JSON was accepted")
	}
}

// TestConcurrentRuns: runs share nothing; run them at once under -race.
func TestConcurrentRuns(t *testing.T) {
	e := newEnv(t, nil)
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			code := "globalThis.mine = (globalThis.mine || 0) + " + string(rune('0'+i)) + "; mine"
			check{exactStdout: ptr("➡️ " + string(rune('0'+i)) + "\n")}.verify(t, e.run(t, "js", code))
		}()
	}
	wg.Wait()
}

func TestProbeAndNames(t *testing.T) {
	e := New(nil)
	if err := e.Probe(context.Background()); err != nil {
		t.Fatal(err)
	}
	if e.Name() != "js/quickjs" || e.TS().Name() != "ts/quickjs+esbuild" {
		t.Errorf("names %q %q", e.Name(), e.TS().Name())
	}
	if e.MemoryLimit() != 64<<20 {
		t.Errorf("default memory limit %d", e.MemoryLimit())
	}
}
