// The Quro prelude: evaluated in every fresh VM before the user's code.
//
// It receives the two host functions (registered as globals by the engine and
// deleted here, so that user code — eval and Function included — can only
// reach the host through the confined API below) and returns the private
// controller that the Go side drives: run timers, settle the result, report
// the outcome. Everything the user sees is documented in prelude.go.
(function (host, compile) {
  'use strict';
  const G = globalThis;
  // The prelude's own JSON: the code may replace JSON's methods, which must
  // not change what the host is told or how its answers are read.
  const { stringify, parse } = JSON;
  delete G.__quro_host;
  delete G.__quro_compile;

  const call = (op, ...args) => {
    try {
      return host(op, ...args);
    } catch (e) {
      // Host failures arrive as TypeError; give them a plain Error with the
      // message the host wrote, thrown from the caller's frame. Anything
      // else (out of memory, for one) goes on as it is.
      if (!(e instanceof TypeError)) throw e;
      throw new Error(e.message);
    }
  };

  // ---- values to text -------------------------------------------------

  // plain turns any value into something JSON.stringify can show faithfully.
  function plain(v, seen) {
    switch (typeof v) {
      case 'undefined': return '[undefined]';
      case 'function': return '[Function' + (v.name ? ': ' + v.name : ' (anonymous)') + ']';
      case 'bigint': return v.toString() + 'n';
      case 'symbol': return v.toString();
      case 'number': return Number.isFinite(v) ? v : String(v);
      case 'string': case 'boolean': return v;
    }
    if (v === null) return null;
    if (seen.includes(v)) return '[Circular]';
    if (v instanceof Error) return { name: v.name, message: v.message };
    if (v instanceof Date) return isNaN(v) ? 'Invalid Date' : v.toISOString();
    if (v instanceof RegExp) return v.toString();
    if (typeof v.toJSON === 'function') return plain(v.toJSON(), seen);
    seen.push(v);
    let out;
    if (Array.isArray(v) || ArrayBuffer.isView(v)) {
      out = Array.from(v, (x) => plain(x, seen));
    } else if (v instanceof Map) {
      out = { '[Map]': Array.from(v, ([k, x]) => [plain(k, seen), plain(x, seen)]) };
    } else if (v instanceof Set) {
      out = { '[Set]': Array.from(v, (x) => plain(x, seen)) };
    } else if (typeof v.then === 'function') {
      out = '[Promise]';
    } else {
      out = {};
      for (const k of Object.keys(v)) out[k] = plain(v[k], seen);
    }
    seen.pop();
    return out;
  }

  // pretty is the ➡️ result form: strings quoted, objects as indented JSON.
  function pretty(v) {
    if (typeof v === 'number' && !Number.isFinite(v)) return String(v);
    const p = plain(v, []);
    return stringify(p, null, 2);
  }

  // inspect is console.log's form of one argument.
  function inspect(v) {
    if (typeof v === 'string') return v;
    if (v instanceof Error) return call('stack', errorText(v));
    if (v === undefined) return 'undefined';
    if (typeof v !== 'object' || v === null) {
      const p = plain(v, []);
      return typeof p === 'string' ? p : stringify(p);
    }
    const one = stringify(plain(v, []));
    return one.length <= 80 ? one : stringify(plain(v, []), null, 2);
  }

  function errorText(e) {
    const head = (e.name || 'Error') + (e.message ? ': ' + e.message : '');
    return e.stack ? head + '\n' + e.stack.replace(/\n$/, '') : head;
  }

  function format(args) {
    let i = 0;
    let out = '';
    if (typeof args[0] === 'string' && args.length > 1 && /%[sdifjoO%]/.test(args[0])) {
      i = 1;
      out = args[0].replace(/%([sdifjoO%])/g, (m, c) => {
        if (c === '%') return '%';
        if (i >= args.length) return m;
        const a = args[i++];
        switch (c) {
          case 's': return typeof a === 'string' ? a : inspect(a);
          case 'd': case 'i': return String(c === 'i' ? Math.trunc(Number(a)) : Number(a));
          case 'f': return String(Number(a));
          default: return inspect(a);
        }
      });
      if (i < args.length) out += ' ';
    }
    return out + args.slice(i).map(inspect).join(' ');
  }

  const console = {};
  for (const [name, fd] of [['log', 1], ['info', 1], ['debug', 1], ['dir', 1], ['warn', 2], ['error', 2]]) {
    console[name] = (...args) => { call('print', fd, format(args) + '\n'); };
  }
  G.console = console;

  // ---- timers -----------------------------------------------------------

  let timerSeq = 0;
  const timers = new Map();
  function addTimer(fn, ms, args, repeat) {
    if (typeof fn !== 'function') throw new TypeError('the callback must be a function');
    const delay = Math.max(0, Number(ms) || 0);
    const id = ++timerSeq;
    timers.set(id, { at: Date.now() + delay, fn, args, every: repeat ? Math.max(1, delay) : 0 });
    return id;
  }
  G.setTimeout = (fn, ms, ...args) => addTimer(fn, ms, args, false);
  G.setInterval = (fn, ms, ...args) => addTimer(fn, ms, args, true);
  G.clearTimeout = G.clearInterval = (id) => { timers.delete(id); };
  G.queueMicrotask = (fn) => { Promise.resolve().then(fn); };

  // ---- require ----------------------------------------------------------

  const cache = Object.create(null);
  function dirOf(p) {
    const i = p.lastIndexOf('/');
    return i < 0 ? '.' : p.slice(0, i);
  }
  function makeRequire(dir) {
    function require(spec) {
      if (typeof spec !== 'string') throw new TypeError('require: the module name must be a string');
      const r = parse(call('resolve', dir, spec));
      const cached = cache[r.path];
      if (cached) return cached.exports;
      const module = { id: r.path, filename: r.path, exports: {}, loaded: false };
      cache[r.path] = module;
      try {
        if (r.kind === 'json') {
          module.exports = parse(call('read', r.path));
        } else {
          const fn = compile(r.path);
          if (typeof fn !== 'function') throw makeError(parse(call('compileError')));
          module.require = makeRequire(dirOf(r.path));
          fn.call(module.exports, module.exports, module.require, module, r.path, dirOf(r.path));
        }
        module.loaded = true;
      } catch (e) {
        delete cache[r.path];
        throw e;
      }
      return module.exports;
    }
    require.resolve = (spec) => parse(call('resolve', dir, String(spec))).path;
    require.cache = cache;
    return require;
  }
  function makeError(info) {
    const E = info.name === 'SyntaxError' ? SyntaxError : Error;
    const e = new E(info.message);
    return e;
  }

  // ---- Tools: the host API, confined to the session ----------------------

  const str = (v, what) => {
    if (typeof v !== 'string') throw new TypeError(what + ' must be a string');
    return v;
  };
  const Files = Object.freeze({
    read: (path) => call('read', str(path, 'path')),
    write: (path, data, opts) => {
      const text = typeof data === 'string' ? data : stringify(plain(data, []), null, 2);
      return call('write', str(path, 'path'), text, !!(opts && opts.append));
    },
    list: (path) => parse(call('list', path === undefined ? '.' : str(path, 'path'))),
    exists: (path) => call('exists', str(path, 'path')),
    remove: (path) => call('remove', str(path, 'path')),
  });

  function fetch(url, opts) {
    return new Promise((resolve) => {
      const o = opts || {};
      const headers = {};
      for (const [k, v] of Object.entries(o.headers || {})) headers[k] = String(v);
      const req = {
        url: String(url),
        method: o.method ? String(o.method) : 'GET',
        headers,
        body: o.body === undefined || o.body === null ? '' : typeof o.body === 'string' ? o.body : stringify(o.body),
      };
      const r = parse(call('fetch', stringify(req)));
      const lower = {};
      for (const [k, v] of Object.entries(r.headers)) lower[k.toLowerCase()] = v;
      resolve(Object.freeze({
        url: r.url,
        status: r.status,
        statusText: r.statusText,
        ok: r.status >= 200 && r.status < 300,
        headers: Object.freeze({ get: (name) => { const v = lower[String(name).toLowerCase()]; return v === undefined ? null : v; }, entries: () => Object.entries(lower) }),
        text: async () => r.body,
        json: async () => parse(r.body),
      }));
    });
  }

  const System = Object.freeze({
    time: () => parse(call('time')),
    env: (name) => {
      const env = parse(call('env'));
      return name === undefined ? env : (Object.prototype.hasOwnProperty.call(env, name) ? env[name] : undefined);
    },
    platform: () => parse(call('platform')),
  });

  G.Tools = Object.freeze({
    Files,
    Net: Object.freeze({ fetch }),
    System,
    calc: (expr) => call('calc', str(expr, 'the expression')),
  });
  G.fetch = fetch;

  // ---- Data: small helpers for arrays and objects -------------------------

  const keyFn = (key) => (typeof key === 'function' ? key : key === undefined ? (x) => x : (x) => (x == null ? undefined : x[key]));
  const arr = (a) => {
    if (a == null || typeof a[Symbol.iterator] !== 'function') throw new TypeError('expected an array');
    return Array.isArray(a) ? a : Array.from(a);
  };
  G.Data = Object.freeze({
    sum: (a, key) => { const f = keyFn(key); return arr(a).reduce((s, x) => s + Number(f(x)), 0); },
    mean: (a, key) => { const xs = arr(a); return xs.length ? G.Data.sum(xs, key) / xs.length : NaN; },
    groupBy: (a, key) => {
      const f = keyFn(key); const out = {};
      for (const x of arr(a)) (out[f(x)] ||= []).push(x);
      return out;
    },
    countBy: (a, key) => {
      const f = keyFn(key); const out = {};
      for (const x of arr(a)) { const k = f(x); out[k] = (out[k] || 0) + 1; }
      return out;
    },
    sortBy: (a, key, desc) => {
      const f = keyFn(key); const s = desc ? -1 : 1;
      return arr(a).slice().sort((x, y) => { const p = f(x), q = f(y); return p < q ? -s : p > q ? s : 0; });
    },
    uniq: (a, key) => {
      const f = keyFn(key); const seen = new Set(); const out = [];
      for (const x of arr(a)) { const k = f(x); if (!seen.has(k)) { seen.add(k); out.push(x); } }
      return out;
    },
    chunk: (a, n) => {
      const size = Math.floor(n); if (!(size >= 1)) throw new RangeError('chunk size must be at least 1');
      const xs = arr(a); const out = [];
      for (let i = 0; i < xs.length; i += size) out.push(xs.slice(i, i + size));
      return out;
    },
    range: (start, end, step) => {
      if (end === undefined) { end = start; start = 0; }
      step = step === undefined ? (start <= end ? 1 : -1) : step;
      if (!step) throw new RangeError('step must not be 0');
      const out = [];
      for (let x = start; step > 0 ? x < end : x > end; x += step) {
        if (out.length >= 1e7) throw new RangeError('range is too long (more than 10,000,000 values)');
        out.push(x);
      }
      return out;
    },
    pick: (o, keys) => { const out = {}; for (const k of keys) if (o != null && k in Object(o)) out[k] = o[k]; return out; },
    omit: (o, keys) => { const drop = new Set(keys); const out = {}; for (const k of Object.keys(Object(o))) if (!drop.has(k)) out[k] = o[k]; return out; },
  });

  // ---- the controller, for the Go side only --------------------------------

  const state = { status: 'pending', value: undefined, error: undefined, main: undefined };

  function fail(e) {
    if (state.status !== 'rejected') {
      state.status = 'rejected';
      state.error = e;
    }
  }

  function describe(e) {
    if (e instanceof Error || (e && typeof e === 'object' && typeof e.stack === 'string' && 'message' in e)) {
      return { name: String(e.name || 'Error'), message: String(e.message), stack: String(e.stack || '') };
    }
    let text;
    try { text = typeof e === 'string' ? stringify(e) : inspect(e); } catch (_) { text = String(e); }
    return { name: '', message: text, stack: '', isNull: e === null };
  }

  return {
    // reset makes a kept VM (a code context) ready for its next run.
    reset() {
      state.status = 'pending';
      state.value = undefined;
      state.error = undefined;
      state.main = undefined;
      timers.clear();
    },
    // setMain defines require, module, exports, __filename and __dirname
    // for the main script.
    setMain(filename) {
      const module = { id: '.', filename, exports: {}, loaded: false };
      state.main = module;
      module.require = makeRequire('.');
      G.module = module;
      G.exports = module.exports;
      G.require = module.require;
      G.__filename = filename;
      G.__dirname = '.';
    },
    // settle attaches to the promise of the main script (async eval: it
    // resolves to {value}).
    // A completion value that is a Promise (or thenable) is awaited too.
    settle(p) {
      const done = (v) => {
        if (state.status === 'pending') { state.status = 'fulfilled'; state.value = v; }
      };
      Promise.resolve(p).then((r) => {
        const v = r && r.value;
        if (v && typeof v.then === 'function') Promise.resolve(v).then(done, fail);
        else done(v);
      }, fail);
    },
    nextTimer() {
      if (state.status === 'rejected' || timers.size === 0) return -1;
      let at = Infinity;
      for (const t of timers.values()) at = Math.min(at, t.at);
      return Math.max(0, at - Date.now());
    },
    // runTimer runs the one timer that is due first, if any.
    runTimer() {
      const now = Date.now();
      let id = 0, t;
      for (const [k, x] of timers) if (x.at <= now && (!t || x.at < t.at)) { id = k; t = x; }
      if (!t) return false;
      if (t.every) t.at = now + t.every; else timers.delete(id);
      try { t.fn(...t.args); } catch (e) { fail(e); }
      return true;
    },
    outcome() {
      const out = { status: state.status };
      if (state.status === 'rejected') {
        out.error = describe(state.error);
      } else if (state.status === 'fulfilled') {
        let v = state.value;
        const m = state.main;
        if (v === undefined && m && m.exports !== undefined && !(m.exports && typeof m.exports === 'object' && Object.getPrototypeOf(m.exports) === Object.prototype && Object.keys(m.exports).length === 0)) {
          v = m.exports;
        }
        if (v !== undefined) out.result = pretty(v);
      }
      return stringify(out);
    },
  };
})(__quro_host, __quro_compile)
