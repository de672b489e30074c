package js

import _ "embed"

// The prelude (prelude.js) is what user code finds in its fresh VM besides
// the ECMAScript built-ins (ES2023: classes, private fields, BigInt,
// async/await, async generators, Proxy, WeakRef, …). There is no process, no
// node module and no Intl.
//
// console.log, info, debug, dir write a line to stdout; warn and error to
// stderr. Strings print as they are, other values as compact JSON (indented
// when longer than 80 characters), errors as name, message and stack in the
// user's files and lines; a first string argument may use %s %d %i %f %o %O
// %j.
//
// The result. Inline code runs as a global script in which top-level await is
// allowed. Its completion value (the value of the last expression statement,
// awaited when it is a Promise) is printed last on stdout as
// "➡️ <pretty JSON>"; when it is undefined, module.exports is printed instead
// unless it is still an empty object. Values JSON cannot hold are shown as
// strings: "NaN", "10n", "[Function: f]", "[undefined]", "[Circular]",
// {"[Map]": [[k, v]…]}, {"[Set]": […]}. Promise jobs and timers run until
// none is left; a Promise still pending when nothing is left to run is an error, as is an
// uncaught exception or rejection (stderr, exit code 1).
//
// require(path) loads a workspace file as a CommonJS module: a relative
// path from the requiring file ("./util", "../lib/x.js") or an absolute path
// inside the workspace, tried as written, then with .js .ts .mjs .cjs .mts
// .cts .json, then as a directory with index.js, index.ts or index.json.
// TypeScript and ES modules (import/export) are transpiled by esbuild; JSON
// is parsed. Modules are cached by path and cycles see the partial exports,
// as in node. Anything else — a bare name such as "fs", a path out of the
// workspace, a symbolic link that leads out — is an error. Each module has
// module, exports, require, __filename and __dirname (workspace-relative).
//
// setTimeout, setInterval, clearTimeout, clearInterval and queueMicrotask
// work within the run's time budget; a timer due after the budget ends the
// run at once as timed out.
//
// Tools is the host API, frozen:
//
//	Tools.Files.read(path) → string                  (UTF-8 text; at most the read limit)
//	Tools.Files.write(path, data, {append}) → bytes   (non-strings as pretty JSON; creates directories)
//	Tools.Files.list(path = ".") → [{name, type, size}]  (type: file, dir, symlink, other)
//	Tools.Files.exists(path) → boolean
//	Tools.Files.remove(path) → true                   (a file, a link, or a directory tree)
//	Tools.Net.fetch(url, {method, headers, body}) → Promise<{status, statusText, ok, url, headers.get(), text(), json()}>
//	Tools.System.time() → {iso, unix_ms, timezone}
//	Tools.System.env(name?) → the session's variables (not the server's), or one of them
//	Tools.System.platform() → {os, arch, engine, language, session, memory_limit, network}
//	Tools.calc(expression) → number                   (arithmetic only, see calc.Eval)
//
// Paths are relative to the workspace root, or absolute inside it; every
// call is checked by Workspace's rules (no "..", no absolute path elsewhere,
// no symbolic link out), so eval, Function and anything else user code can
// build reach the host only through these. fetch (also the global fetch) is
// allowed only when Options.Network says so for the session and URL, for
// the first request and every redirect.
//
// Data holds small helpers for arrays and objects; key is a property name or
// a function of the item:
//
//	Data.sum(xs, key?)  Data.mean(xs, key?)   Data.groupBy(xs, key)  Data.countBy(xs, key)
//	Data.sortBy(xs, key, desc?) (a copy)      Data.uniq(xs, key?)    Data.chunk(xs, n)
//	Data.range(end) / Data.range(start, end, step?)  Data.pick(obj, keys)  Data.omit(obj, keys)
//
//go:embed prelude.js
var preludeSource string
