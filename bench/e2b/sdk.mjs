// The SDK side of bench/e2b (go run ./bench/e2b drives it): E2B's own SDKs
// (@e2b/code-interpreter 2.8.0 over e2b 2.51.0, test/e2b's pinned install,
// found through E2B_NODE_MODULES) against the quro serve named by
// E2B_API_KEY, E2B_API_URL and E2B_SANDBOX_URL.
//
// One step per line read on stdin, one JSON line answered on stdout (the
// step's duration in microseconds as us, or error), so that the Go side
// can alternate each SDK step with its REST peer round by round:
//
//   cold          Sandbox.create() + runCode('print(1)') and kill() after it:
//                 {create, createRun, kill}
//   warm          runCode('print(1)') on the one warm sandbox: {us}
//   cmd           commands.run('true') on the warm sandbox: {us}
//   files FILE    load FILE (the bytes to write) and answer what curl needs
//                 to reach the warm sandbox's /files: {id, token}
//   write PATH    files.write(PATH, the bytes): {us}
//   read PATH     files.read(PATH, {format: 'bytes'}), checked by SHA-256: {us}
//   plain URL     a second handle on the warm sandbox whose envd is URL
//                 (a plain Go file server with the same bytes): {}
//   plainread PATH  read's files.read through that handle: {us}
//   quit          kill the warm sandbox and end
import { createRequire } from 'node:module'
import { createHash } from 'node:crypto'
import { readFileSync } from 'node:fs'
import { createInterface } from 'node:readline'
import { performance } from 'node:perf_hooks'

const require = createRequire(process.env.E2B_NODE_MODULES.replace(/\/?$/, '/'))
const { Sandbox } = require('@e2b/code-interpreter')
const us = (a, b) => Math.round((b - a) * 1000)
const sha = (b) => createHash('sha256').update(b).digest('hex')

function checkPrint(ex) {
  if (ex.logs.stdout.join('') !== '1\n' || ex.error) throw new Error(`runCode('print(1)'): ${JSON.stringify(ex)}`)
}

const warm = await Sandbox.create({ timeoutMs: 3_600_000 })
for (let i = 0; i < 20; i++) checkPrint(await warm.runCode('print(1)'))
let data, want, plain

const steps = {
  async cold() {
    const t0 = performance.now()
    const sbx = await Sandbox.create()
    const t1 = performance.now()
    const ex = await sbx.runCode('print(1)')
    const t2 = performance.now()
    checkPrint(ex)
    await sbx.kill()
    const t3 = performance.now()
    return { create: us(t0, t1), createRun: us(t0, t2), kill: us(t2, t3) }
  },
  async warm() {
    const t0 = performance.now()
    const ex = await warm.runCode('print(1)')
    const t1 = performance.now()
    checkPrint(ex)
    return { us: us(t0, t1) }
  },
  async cmd() {
    const t0 = performance.now()
    const r = await warm.commands.run('true')
    const t1 = performance.now()
    if (r.exitCode !== 0) throw new Error(`commands.run('true'): ${JSON.stringify(r)}`)
    return { us: us(t0, t1) }
  },
  async files(file) {
    data = readFileSync(file)
    want = sha(data)
    return { id: warm.sandboxId, token: warm.envdAccessToken ?? '' }
  },
  async write(path) {
    const t0 = performance.now()
    await warm.files.write(path, data)
    return { us: us(t0, performance.now()) }
  },
  // plain URL: a handle on the warm sandbox whose envd URL is URL (a
  // plain Go file server sending the same bytes), for plainread.
  async plain(url) {
    plain = await Sandbox.connect(warm.sandboxId, { sandboxUrl: url })
    return {}
  },
  async plainread(path) {
    const t0 = performance.now()
    const got = await plain.files.read(path, { format: 'bytes', requestTimeoutMs: 600_000 })
    const t1 = performance.now()
    if (got.length !== data.length || sha(got) !== want) throw new Error(`files.read from the plain server gave ${got.length} bytes, not the ${data.length} written`)
    return { us: us(t0, t1) }
  },
  async read(path) {
    const t0 = performance.now()
    const got = await warm.files.read(path, { format: 'bytes', requestTimeoutMs: 600_000 })
    const t1 = performance.now()
    if (got.length !== data.length || sha(got) !== want) throw new Error(`files.read gave ${got.length} bytes, not the ${data.length} written`)
    return { us: us(t0, t1) }
  },
}

process.stdout.write(JSON.stringify({ ready: true }) + '\n')
for await (const line of createInterface({ input: process.stdin })) {
  const [step, arg] = line.split(' ')
  if (step === 'quit') break
  let answer
  try {
    if (!steps[step]) throw new Error(`unknown step ${step}`)
    answer = await steps[step](arg)
  } catch (e) {
    answer = { error: String(e?.stack ?? e) }
  }
  process.stdout.write(JSON.stringify(answer) + '\n')
}
await warm.kill()
