// The SDK side of bench/e2b (go run ./bench/e2b runs it): E2B's own
// @e2b/code-interpreter 2.8.0 (test/e2b's pinned install, found through
// E2B_NODE_MODULES) against the quro serve named by E2B_API_KEY,
// E2B_API_URL and E2B_SANDBOX_URL. Prints one JSON object of durations in
// microseconds:
//   cold: Sandbox.create() + runCode('print(1)') (createRun) and kill() after it (kill), n times
//   warm: runCode('print(1)') on one sandbox, m times (after a few unmeasured)
import { createRequire } from 'node:module'
import { performance } from 'node:perf_hooks'

const require = createRequire(process.env.E2B_NODE_MODULES.replace(/\/?$/, '/'))
const { Sandbox } = require('@e2b/code-interpreter')
const n = Number(process.argv[2] ?? 10)
const m = Number(process.argv[3] ?? 200)
const us = (a, b) => Math.round((b - a) * 1000)

const out = { create: [], createRun: [], kill: [], warm: [] }
for (let i = 0; i < n; i++) {
  const t0 = performance.now()
  const sbx = await Sandbox.create()
  const t1 = performance.now()
  const ex = await sbx.runCode('print(1)')
  const t2 = performance.now()
  if (ex.logs.stdout.join('') !== '1\n' || ex.error) throw new Error(`runCode: ${JSON.stringify(ex)}`)
  await sbx.kill()
  const t3 = performance.now()
  out.create.push(us(t0, t1))
  out.createRun.push(us(t0, t2))
  out.kill.push(us(t2, t3))
}
const sbx = await Sandbox.create()
try {
  for (let i = 0; i < 20; i++) await sbx.runCode('print(1)')
  for (let i = 0; i < m; i++) {
    const t0 = performance.now()
    const ex = await sbx.runCode('print(1)')
    out.warm.push(us(t0, performance.now()))
    if (ex.logs.stdout.join('') !== '1\n') throw new Error(`runCode: ${JSON.stringify(ex)}`)
  }
} finally {
  await sbx.kill()
}
process.stdout.write(JSON.stringify(out) + '\n')
