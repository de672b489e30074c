// The control plane: Sandbox.create/connect/list/getInfo/setTimeout/kill,
// pause and resume, a sandbox that its timeout kills, and a bad API key.
import assert from 'node:assert/strict'
import { Sandbox, AuthenticationError, SandboxNotFoundError } from 'e2b'
import { check, rejects, tag, until } from './check.mjs'

const mark = tag()
let sbx
// The checks after the first need its sandbox.
const need = () => assert.ok(sbx, 'no sandbox: Sandbox.create failed')

await check('Sandbox.create with metadata and timeoutMs', async () => {
  sbx = await Sandbox.create({ metadata: { scenario: mark, area: 'control' }, timeoutMs: 300_000 })
  assert.match(sbx.sandboxId, /^[a-z0-9]+$/, 'sandbox id')
})

await check('sandbox.isRunning', async () => {
  need()
  assert.equal(await sbx.isRunning(), true)
})

await check('sandbox.getInfo', async () => {
  need()
  const info = await sbx.getInfo()
  assert.equal(info.sandboxId, sbx.sandboxId)
  assert.deepEqual(info.metadata, { scenario: mark, area: 'control' })
  assert.equal(info.state, 'running')
  assert.ok(info.startedAt instanceof Date && !isNaN(info.startedAt), `startedAt ${info.startedAt}`)
  assert.ok(info.endAt > info.startedAt, `endAt ${info.endAt} after startedAt ${info.startedAt}`)
  assert.match(info.envdVersion, /^\d+\.\d+\.\d+/)
  const again = await Sandbox.getInfo(sbx.sandboxId)
  assert.equal(again.sandboxId, sbx.sandboxId)
})

await check('Sandbox.connect to a running sandbox', async () => {
  need()
  const other = await Sandbox.connect(sbx.sandboxId)
  assert.equal(other.sandboxId, sbx.sandboxId)
  assert.equal(await other.isRunning(), true)
})

await check('Sandbox.list filtered by metadata', async () => {
  need()
  const mine = await Sandbox.list({ query: { metadata: { scenario: mark } } }).nextItems()
  assert.deepEqual(mine.map((s) => s.sandboxId), [sbx.sandboxId])
  assert.equal(mine[0].state, 'running')
  assert.deepEqual(mine[0].metadata, { scenario: mark, area: 'control' })
  const none = await Sandbox.list({ query: { metadata: { scenario: mark + '-nobody' } } }).nextItems()
  assert.deepEqual(none, [])
})

await check("another tenant's key finds nothing of this sandbox", async () => {
  need()
  const apiKey = process.env.E2B_OTHER_API_KEY
  assert.ok(apiKey, 'E2B_OTHER_API_KEY (a key of another tenant) is not set')
  await rejects(() => Sandbox.connect(sbx.sandboxId, { apiKey }), SandboxNotFoundError, "connect with another tenant's key")
  await rejects(() => Sandbox.getInfo(sbx.sandboxId, { apiKey }), SandboxNotFoundError, "getInfo with another tenant's key")
  await rejects(() => Sandbox.setTimeout(sbx.sandboxId, 1_000, { apiKey }), SandboxNotFoundError, "setTimeout with another tenant's key")
  assert.equal(await Sandbox.kill(sbx.sandboxId, { apiKey }), false, "kill with another tenant's key answers false")
  const theirs = await Sandbox.list({ apiKey, query: { metadata: { scenario: mark } } }).nextItems()
  assert.deepEqual(theirs, [])
  assert.equal(await sbx.isRunning(), true, 'the sandbox still runs')
})

await check('sandbox.setTimeout moves endAt', async () => {
  need()
  const before = (await sbx.getInfo()).endAt
  await sbx.setTimeout(1_200_000)
  const after = (await sbx.getInfo()).endAt
  assert.ok(after > before, `endAt ${after} not after ${before}`)
})

await check('sandbox.pause, then Sandbox.connect resumes', async () => {
  need()
  assert.equal(await sbx.pause(), true)
  assert.equal((await sbx.getInfo()).state, 'paused')
  const paused = await Sandbox.list({ query: { metadata: { scenario: mark }, state: ['paused'] } }).nextItems()
  assert.deepEqual(paused.map((s) => s.sandboxId), [sbx.sandboxId])
  const running = await Sandbox.list({ query: { metadata: { scenario: mark }, state: ['running'] } }).nextItems()
  assert.deepEqual(running, [])
  const resumed = await Sandbox.connect(sbx.sandboxId)
  assert.equal(resumed.sandboxId, sbx.sandboxId)
  assert.equal((await sbx.getInfo()).state, 'running')
})

await check('sandbox.kill, then the sandbox is gone', async () => {
  need()
  await sbx.kill()
  assert.equal(await sbx.isRunning(), false)
  assert.equal(await Sandbox.kill(sbx.sandboxId), false, 'a second kill answers false')
  await rejects(() => sbx.getInfo(), SandboxNotFoundError, 'getInfo after kill')
  const mine = await Sandbox.list({ query: { metadata: { scenario: mark } } }).nextItems()
  assert.deepEqual(mine, [])
})

await check('a sandbox whose timeout passes is killed', async () => {
  const short = await Sandbox.create({ metadata: { scenario: mark, area: 'timeout' }, timeoutMs: 2_000 })
  // Nothing streams a sandbox's end to the control plane: ask until it is gone.
  await until('the sandbox to be killed by its timeout', async () =>
    !(await short.isRunning()))
  await rejects(() => short.getInfo(), SandboxNotFoundError, 'getInfo after the timeout')
})

await check('a wrong API key is an AuthenticationError', async () => {
  await rejects(() => Sandbox.create({ apiKey: 'quro_000000000000_bm9wZQ' }), AuthenticationError, 'create with a wrong key')
  await rejects(() => Sandbox.list({ apiKey: 'quro_000000000000_bm9wZQ' }).nextItems(), AuthenticationError, 'list with a wrong key')
})
