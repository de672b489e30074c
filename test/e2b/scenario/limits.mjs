// limits: what an agent builder does in the first hour — many sandboxes at
// once, each with a long-lived background process — works at the server's
// defaults: a background process counts against the process limits (64
// per sandbox, 256 per tenant), not against the calls running code at
// once, so commands, files and kill go on. With E2B_LIMITED_API_KEY (a
// tenant whose operator set its processes to 2) the process limit, once
// hit, is a RateLimitError that names the limit and how to raise it, and
// kill and files still work at it.
import assert from 'node:assert/strict'
import { Sandbox, RateLimitError } from 'e2b'
import { check, rejects, tag } from './check.mjs'

const N = 20

await check(`${N} sandboxes at once, each with a background process, then a command, a file and kill in each`, async () => {
  const scenario = tag()
  const made = await Promise.allSettled(Array.from({ length: N }, () => Sandbox.create({ metadata: { scenario, area: 'limits' } })))
  const sbxs = made.filter((r) => r.status === 'fulfilled').map((r) => r.value)
  try {
    const failed = made.filter((r) => r.status === 'rejected').map((r) => `${r.reason?.name}: ${r.reason?.message}`)
    assert.deepEqual(failed, [], `${failed.length} of ${N} Sandbox.create failed`)
    // The background processes run on (a server; here a sleep) and hold
    // their streams while the rest goes on. timeoutMs: 0, as a long-lived
    // process is started with E2B: the SDK's default (60 s) kills it, and
    // at load the steps below took longer than that.
    const handles = await Promise.all(sbxs.map((s) => s.commands.run('sleep 100000', { background: true, timeoutMs: 0 })))
    const results = await Promise.allSettled(sbxs.map(async (s, i) => {
      const r = await s.commands.run(`echo sandbox ${i}`)
      assert.equal(r.stdout, `sandbox ${i}\n`)
      await s.files.write(`/home/user/note-${i}.txt`, `note ${i}`)
      assert.equal(await s.files.read(`/home/user/note-${i}.txt`), `note ${i}`)
      const listed = await s.commands.list()
      assert.ok(listed.some((p) => p.pid === handles[i].pid), `sandbox ${i}: its background process is not listed`)
    }))
    const errs = results.map((r, i) => r.status === 'rejected' ? `sandbox ${i}: ${r.reason?.name}: ${r.reason?.message}` : '').filter(Boolean)
    assert.deepEqual(errs, [], `${errs.length} of ${N} sandboxes failed a command or a file`)
    const killed = await Promise.all(handles.map((h) => h.kill()))
    assert.ok(killed.every(Boolean), 'a background process was not killed')
  } finally {
    const kills = await Promise.allSettled(sbxs.map((s) => s.kill()))
    const bad = kills.filter((k) => k.status === 'rejected').map((k) => k.reason?.message)
    assert.deepEqual(bad, [], 'Sandbox.kill failed')
  }
})

if (process.env.E2B_LIMITED_API_KEY) {
  await check('past the tenant\'s process limit: a RateLimitError naming it; kill and files work at it', async () => {
    const sbx = await Sandbox.create({ apiKey: process.env.E2B_LIMITED_API_KEY, metadata: { scenario: tag(), area: 'limits' } })
    try {
      const a = await sbx.commands.run('sleep 100000', { background: true, timeoutMs: 0 })
      const b = await sbx.commands.run('sleep 100000', { background: true, timeoutMs: 0 })
      const e = await rejects(() => sbx.commands.run('echo a third'), RateLimitError, 'a third process of 2')
      for (const want of ['tenant already runs 2 background processes (its limit is 2)', '--processes-per-tenant', 'set_tenant_limits processes']) {
        assert.ok(e.message.includes(want), `${e.message} does not say ${want}`)
      }
      await sbx.files.write('/home/user/at-the-limit.txt', 'yes')
      assert.equal(await sbx.files.read('/home/user/at-the-limit.txt'), 'yes')
      assert.equal(await a.kill(), true)
      await a.wait().catch(() => {}) // ended by the kill: its place is free once it has ended
      const r = await sbx.commands.run('echo after a kill')
      assert.equal(r.stdout, 'after a kill\n')
      assert.equal(await b.kill(), true)
    } finally {
      await sbx.kill()
    }
  })
}
