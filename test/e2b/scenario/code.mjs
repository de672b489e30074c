// The code interpreter (@e2b/code-interpreter): runCode in Python with
// state kept across calls, the main result, display()
// results (html, svg, png), errors with a traceback, streamed stdout,
// per-call envs, timeouts, and code contexts.
import assert from 'node:assert/strict'
import { Sandbox } from '@e2b/code-interpreter'
import { TimeoutError } from 'e2b'
import { check, rejects, tag, waitFor } from './check.mjs'

// A 1x1 PNG.
const PNG = 'iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg=='

const sbx = await Sandbox.create({ metadata: { scenario: tag(), area: 'code' } })
try {
  await check('runCode python: the last expression is the main result', async () => {
    const ex = await sbx.runCode('x = 41\nx + 1')
    assert.equal(ex.error, undefined, JSON.stringify(ex.error))
    assert.equal(ex.text, '42')
    assert.equal(ex.results.length, 1)
    assert.equal(ex.results[0].isMainResult, true)
  })

  await check('runCode python keeps state across calls', async () => {
    const ex = await sbx.runCode('x * 2')
    assert.equal(ex.text, '82')
  })

  await check('runCode python: stdout and stderr in logs', async () => {
    const ex = await sbx.runCode('import sys\nprint("out")\nprint("err", file=sys.stderr)')
    assert.equal(ex.logs.stdout.join(''), 'out\n')
    assert.equal(ex.logs.stderr.join(''), 'err\n')
    assert.equal(ex.text, undefined)
  })

  await check('runCode python: a str result is its text without quotes', async () => {
    assert.equal((await sbx.runCode('"a" + "b"')).text, 'ab')
  })

  await check('runCode python: display() gives html, svg and png results', async () => {
    const code = [
      'import base64',
      'class H:',
      '    def _repr_html_(self): return "<b>bold</b>"',
      'class S:',
      '    def _repr_svg_(self): return \'<svg xmlns="http://www.w3.org/2000/svg" width="1" height="1"></svg>\'',
      'class P:',
      `    def _repr_png_(self): return base64.b64decode("${PNG}")`,
      'display(H())',
      'display(S())',
      'display(P())',
    ].join('\n')
    const seen = []
    const ex = await sbx.runCode(code, { onResult: (r) => seen.push(r) })
    assert.equal(ex.error, undefined, JSON.stringify(ex.error))
    assert.equal(ex.results.length, 3, JSON.stringify(ex.results))
    assert.equal(ex.results[0].html, '<b>bold</b>')
    assert.match(ex.results[1].svg, /^<svg /)
    assert.equal(ex.results[2].png, PNG)
    assert.ok(ex.results.every((r) => !r.isMainResult), 'display() results are not the main result')
    assert.equal(seen.length, 3, 'onResult saw every result')
  })

  await check('runCode python: an exception is ex.error with a traceback', async () => {
    let cb
    const ex = await sbx.runCode('def f():\n    return 1 / 0\nf()', { onError: (e) => { cb = e } })
    assert.equal(ex.error?.name, 'ZeroDivisionError')
    assert.equal(ex.error.value, 'division by zero')
    assert.match(ex.error.traceback, /ZeroDivisionError/)
    assert.match(ex.error.traceback, /f\(\)/)
    assert.equal(cb?.name, 'ZeroDivisionError', 'onError was called')
    assert.equal(ex.logs.stderr.join(''), '', 'the traceback is not also on stderr')
  })

  await check('runCode python streams stdout while it runs (onStdout)', async () => {
    // The code waits for a file that only the onStdout callback writes:
    // it ends only if its first line reaches the client before it does.
    const lines = []
    const ex = await sbx.runCode(
      'import os\nprint("ready", flush=True)\nwhile not os.path.exists("/home/user/go"):\n    pass\nprint("done")',
      {
        onStdout: async (m) => {
          lines.push(m.line)
          if (m.line.includes('ready')) await sbx.files.write('/home/user/go', '1')
        },
      })
    assert.equal(ex.error, undefined, JSON.stringify(ex.error))
    assert.equal(lines.join(''), 'ready\ndone\n')
  })

  await check('runCode python: a print to stderr reaches onStderr in one call', async () => {
    const calls = []
    const ex = await sbx.runCode('import sys\nprint("This is an error message", file=sys.stderr)', { onStderr: (m) => calls.push(m.line) })
    assert.deepEqual(calls, ['This is an error message\n'])
    assert.deepEqual(ex.logs.stderr, ['This is an error message\n'])
  })

  await check('runCode envs apply to that call only', async () => {
    const ex = await sbx.runCode('import os\nos.environ.get("CALL_VAR", "unset")', { envs: { CALL_VAR: 'set' } })
    assert.equal(ex.text, 'set')
    assert.equal((await sbx.runCode('import os\nos.environ.get("CALL_VAR", "unset")')).text, 'unset')
  })

  await check('runCode past its timeoutMs is a TimeoutError; the sandbox goes on', async () => {
    await rejects(() => sbx.runCode('import time\ntime.sleep(600)', { timeoutMs: 1_000 }), TimeoutError, 'sleep 600 with timeoutMs 1000')
    assert.equal((await sbx.runCode('x')).text, '41', 'state survives the abandoned run')
  })

  await check('createCodeContext: a namespace of its own', async () => {
    const ctx = await sbx.createCodeContext({ language: 'python' })
    assert.equal(ctx.language, 'python')
    await sbx.runCode('only_here = 7', { context: ctx })
    assert.equal((await sbx.runCode('only_here', { context: ctx })).text, '7')
    const outside = await sbx.runCode('only_here')
    assert.equal(outside.error?.name, 'NameError')
    const listed = await sbx.listCodeContexts()
    assert.ok(listed.some((c) => c.id === ctx.id), `context ${ctx.id} not listed`)
    await sbx.restartCodeContext(ctx)
    assert.equal((await sbx.runCode('only_here', { context: ctx })).error?.name, 'NameError', 'restart empties it')
    await sbx.removeCodeContext(ctx)
    assert.ok(!(await sbx.listCodeContexts()).some((c) => c.id === ctx.id), 'removed context still listed')
  })

  await check('runCode python cwd is /home/user', async () => {
    assert.equal((await sbx.runCode('import os\nos.getcwd()')).text, '/home/user')
  })
} finally {
  await sbx.kill()
}
