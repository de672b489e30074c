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
  // E2B's JavaScript kernel is Node: where the box has node, Quro's JS
  // contexts run on a resident Node worker in the sandbox (Node's
  // modules, the workspace's node_modules, top-level await).
  const hasNode = (await sbx.commands.run('command -v node || true')).stdout.trim() !== ''

  await check('runCode javascript runs on Node: require(\'fs\') reads the sandbox', async () => {
    if (!hasNode) return
    await sbx.files.write('/home/user/seen-by-node.txt', 'hello node')
    const r = await sbx.runCode("require('fs').readdirSync('.')", { language: 'js' })
    assert.equal(r.error, undefined, JSON.stringify(r.error))
    assert.match(r.text, /seen-by-node\.txt/)
    const t = await sbx.runCode("require('fs').readFileSync('seen-by-node.txt', 'utf8')", { language: 'js' })
    assert.equal(t.text, 'hello node')
  })

  await check('runCode javascript: an npm module from /home/user/node_modules, top-level await', async () => {
    if (!hasNode) return
    await sbx.files.write('/home/user/node_modules/shout-lite/package.json', '{"name":"shout-lite","main":"main.js"}')
    await sbx.files.write('/home/user/node_modules/shout-lite/main.js', 'module.exports = (s) => s.toUpperCase() + "!"')
    const r = await sbx.runCode("const shout = require('shout-lite'); const w = await Promise.resolve('hey'); shout(w)", { language: 'js' })
    assert.equal(r.error, undefined, JSON.stringify(r.error))
    assert.equal(r.text, 'HEY!')
    assert.equal((await sbx.runCode('shout("again")', { language: 'javascript' })).text, 'AGAIN!')
  })

  await check('runCode typescript runs on Node with its types stripped', async () => {
    if (!hasNode) return
    const ctx = await sbx.createCodeContext({ language: 'ts' })
    const r = await sbx.runCode("import os from 'os'\nconst n: number = 6\ntypeof os.cpus + ':' + (n * 7)", { context: ctx })
    assert.equal(r.error, undefined, JSON.stringify(r.error))
    assert.equal(r.text, 'function:42')
    await sbx.removeCodeContext(ctx)
  })
} finally {
  await sbx.kill()
}
