// The code interpreter's JavaScript (@e2b/code-interpreter): runCode with
// language 'js' / 'javascript' keeps state across calls (E2B runs a
// JavaScript kernel per context), prints to logs, and a thrown error is
// ex.error.
import assert from 'node:assert/strict'
import { Sandbox } from '@e2b/code-interpreter'
import { check, tag } from './check.mjs'

const sbx = await Sandbox.create({ metadata: { scenario: tag(), area: 'code-js' } })
try {
  await check('runCode javascript keeps state across calls', async () => {
    const a = await sbx.runCode('var jsv = 20; jsv + 1', { language: 'js' })
    assert.equal(a.error, undefined, JSON.stringify(a.error))
    assert.equal(a.text, '21')
    const b = await sbx.runCode('console.log("js out"); jsv * 2', { language: 'javascript' })
    assert.equal(b.text, '40')
    assert.equal(b.logs.stdout.join(''), 'js out\n')
  })

  await check('runCode javascript: a thrown error is ex.error', async () => {
    const ex = await sbx.runCode('throw new TypeError("bad thing")', { language: 'js' })
    assert.equal(ex.error?.name, 'TypeError')
    assert.equal(ex.error.value, 'bad thing')
  })

  await check('createCodeContext for javascript', async () => {
    const ctx = await sbx.createCodeContext({ language: 'js' })
    await sbx.runCode('var inCtx = 5', { context: ctx })
    assert.equal((await sbx.runCode('inCtx * 2', { context: ctx })).text, '10')
    await sbx.removeCodeContext(ctx)
  })
} finally {
  await sbx.kill()
}
