// Quro's resident Node worker (internal/engine/node): one per session, in
// its box. It reads requests from fd 3 and writes replies to fd 4, one
// JSON object per line each; fd 1 and 2 belong to the code it runs. After
// a run it writes the run's sync token to fd 1 and fd 2, so the server
// knows it has all of the run's output, then the reply.
//
// Each code context is a REPL server of its own (node:repl, never shown a
// terminal: its input never gets a line and its output is dropped); a cell
// is handed to the REPL's eval, which keeps top-level const, let, class
// and function declarations in the context between cells, runs top-level
// await (declarations hoisted, as the interactive REPL does) and gives the
// last expression's value. An error thrown by a cell, or later by a
// callback it left (a timer, a promise), reaches the REPL's domain: the
// first is the cell's exception, the others are printed to stderr.
'use strict';
const fs = require('fs');
const repl = require('repl');
const util = require('util');
const { PassThrough, Writable } = require('stream');

const REQ = 3, REP = 4;
const contexts = new Map(); // id -> {server, count}
let pending = null; // the run in progress: resolves with [err, value]

function reply(obj) {
  const line = Buffer.from(JSON.stringify(obj) + '\n');
  let off = 0;
  while (off < line.length) {
    try {
      off += fs.writeSync(REP, line, off);
    } catch (e) {
      if (e.code !== 'EAGAIN') throw e;
    }
  }
}

function writeAll(fd, s) {
  const b = Buffer.from(s);
  let off = 0;
  while (off < b.length) {
    try {
      off += fs.writeSync(fd, b, off);
    } catch (e) {
      if (e.code !== 'EAGAIN') throw e;
    }
  }
}

function contextOf(id, cwd) {
  let c = contexts.get(id);
  if (c) return c;
  // The REPL's require resolves from the directory it was made in.
  try { process.chdir(cwd); } catch (e) { /* the run reports it */ }
  const sink = new Writable({ write(chunk, enc, cb) { cb(); } });
  const server = repl.start({
    input: new PassThrough(), output: sink, terminal: false, prompt: '',
    useGlobal: false, ignoreUndefined: true, preview: false,
  });
  // The REPL gives its context a console on its output: the cell's
  // console is the process's (fd 1 and 2).
  const useConsole = () => { server.context.console = console; };
  useConsole();
  server.on('reset', useConsole);
  server._domain.removeAllListeners('error');
  server._domain.on('error', (e) => {
    if (pending) {
      const p = pending;
      pending = null;
      p([e]);
    } else {
      writeAll(2, 'Uncaught ' + cleanStack(e) + '\n');
    }
  });
  c = { server, count: 0, cwd };
  contexts.set(id, c);
  return c;
}

// cleanStack is an error's stack without the frames of the worker and of
// node's REPL that ran the cell.
function cleanStack(e) {
  if (!(e instanceof Error) && !(e && typeof e.stack === 'string')) {
    return util.inspect(e);
  }
  const lines = String(e.stack || e).split('\n');
  const out = [];
  for (const l of lines) {
    if (/^\s+at /.test(l) && /node:vm|node:repl|node:domain|\[eval\]|ContextifyScript|REPLServer|new Promise \(<anonymous>\)/.test(l)) {
      break;
    }
    out.push(l);
  }
  return out.join('\n');
}

function exception(e) {
  if (e && e.name === 'SyntaxError' && e.err) e = e.err; // a Recoverable: the cell ended early
  if (e instanceof Error || (e && typeof e === 'object' && 'message' in e)) {
    return { name: String(e.name || 'Error'), value: String(e.message), traceback: cleanStack(e) };
  }
  return { name: 'Error', value: util.inspect(e), traceback: 'Uncaught ' + util.inspect(e) };
}

function evaluate(c, code) {
  return new Promise((resolve) => {
    pending = resolve;
    try {
      c.server.eval(code, c.server.context, '<cell>', (err, value) => {
        if (pending === resolve) {
          pending = null;
          resolve([err, value]);
        }
      });
    } catch (e) {
      if (pending === resolve) {
        pending = null;
        resolve([e]);
      }
    }
  });
}

async function run(req) {
  const c = contextOf(req.ctx || '', req.cwd);
  let err = null, value;
  // The session's variables changed since the last run
  // (set_session_env): they apply from now on, as in a new process.
  for (const k of req.sdrop || []) delete process.env[k];
  for (const [k, v] of Object.entries(req.senv || {})) process.env[k] = v;
  const saved = {};
  for (const [k, v] of Object.entries(req.env || {})) {
    saved[k] = process.env[k];
    process.env[k] = v;
  }
  try {
    process.chdir(c.cwd);
  } catch (e) {
    err = e;
  }
  if (!err) {
    [err, value] = await evaluate(c, req.code);
    if (!err && value && typeof value.then === 'function') {
      try {
        value = await value;
      } catch (e) {
        err = e;
      }
    }
  }
  for (const [k, v] of Object.entries(saved)) {
    if (v === undefined) delete process.env[k];
    else process.env[k] = v;
  }
  c.count++;
  const out = { op: 'done', id: req.id, count: c.count };
  if (err) {
    out.exc = exception(err);
    if (!req.rich) writeAll(2, out.exc.traceback + '\n');
  } else if (value !== undefined) {
    const text = util.inspect(value, { depth: 4, maxArrayLength: 200, maxStringLength: 100000 });
    if (req.rich) out.results = [{ main: true, data: { 'text/plain': text } }];
    else writeAll(1, text + '\n');
  }
  writeAll(1, req.token);
  writeAll(2, req.token);
  reply(out);
}

process.on('uncaughtException', (e) => writeAll(2, 'Uncaught ' + cleanStack(e) + '\n'));
process.on('unhandledRejection', (e) => writeAll(2, 'Uncaught (in promise) ' + cleanStack(e) + '\n'));

const queue = [];
let busy = false;
async function pump() {
  if (busy) return;
  busy = true;
  while (queue.length) {
    const req = queue.shift();
    if (req.op === 'run') {
      await run(req);
    } else if (req.op === 'drop') {
      const c = contexts.get(req.ctx);
      if (c) c.server.close();
      contexts.delete(req.ctx);
      reply({ op: 'dropped', id: req.id });
    }
  }
  busy = false;
}

let buf = '';
const input = fs.createReadStream(null, { fd: REQ, highWaterMark: 1 << 20 });
input.setEncoding('utf8');
input.on('data', (chunk) => {
  buf += chunk;
  let i;
  while ((i = buf.indexOf('\n')) >= 0) {
    const line = buf.slice(0, i);
    buf = buf.slice(i + 1);
    if (line) queue.push(JSON.parse(line));
  }
  pump();
});
input.on('end', () => process.exit(0));
reply({ op: 'hello', version: process.version });
