// The files side of bench/e2b (go run ./bench/e2b -files N runs it): a
// 50 MB file (-files-mb) of random bytes written and read back through
// E2B's own SDK (e2b 2.51.0, test/e2b's pinned install, found through
// E2B_NODE_MODULES: files.write of the bytes, files.read as bytes, the
// content checked by SHA-256), beside curl on the same /files URL with the
// same headers: a plain GET, a GET with --compressed (gzip, as the SDK's
// fetch asks), and a POST of the bytes (application/octet-stream). The
// steps alternate round by round. Prints one JSON object of durations in
// microseconds.
import { createRequire } from 'node:module'
import { createHash, randomBytes } from 'node:crypto'
import { execFileSync } from 'node:child_process'
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { performance } from 'node:perf_hooks'

const require = createRequire(process.env.E2B_NODE_MODULES.replace(/\/?$/, '/'))
const { Sandbox } = require('e2b')
const rounds = Number(process.argv[2] ?? 3)
const size = Number(process.argv[3] ?? 50) * 1e6
const boxDir = process.argv[4] ?? '/home/user'
const us = (a, b) => Math.round((b - a) * 1000)
const sha = (b) => createHash('sha256').update(b).digest('hex')

const data = randomBytes(size)
const want = sha(data)
const dir = mkdtempSync(join(tmpdir(), 'quro-bench-files-'))
const local = join(dir, 'data.bin')
writeFileSync(local, data)

// curl's own total time (-w %{time_total}), so its start-up is not counted.
function curl(args) {
  const out = execFileSync('curl', ['-sS', '-f', '-o', '/dev/null', '-w', '%{time_total}', ...args], { encoding: 'utf8' })
  return Math.round(Number(out) * 1e6)
}

const out = { sdkWrite: [], sdkRead: [], curlRead: [], curlReadGzip: [], curlWrite: [] }
const sbx = await Sandbox.create({ timeoutMs: 3_600_000 })
try {
  const base = process.env.E2B_SANDBOX_URL.replace(/\/$/, '')
  const headers = ['-H', `E2b-Sandbox-Id: ${sbx.sandboxId}`, '-H', 'E2b-Sandbox-Port: 49983', '-H', `X-Access-Token: ${sbx.envdAccessToken}`]
  const url = (p) => `${base}/files?path=${encodeURIComponent(p)}&username=user`
  for (let i = 0; i < rounds; i++) {
    let t = performance.now()
    await sbx.files.write(boxDir + '/big.bin', data)
    out.sdkWrite.push(us(t, performance.now()))
    t = performance.now()
    const got = await sbx.files.read(boxDir + '/big.bin', { format: 'bytes', requestTimeoutMs: 600_000 })
    out.sdkRead.push(us(t, performance.now()))
    if (got.length !== size || sha(got) !== want) throw new Error(`files.read gave ${got.length} bytes, not the ${size} written`)
    out.curlRead.push(curl([...headers, url(boxDir + '/big.bin')]))
    out.curlReadGzip.push(curl(['--compressed', ...headers, url(boxDir + '/big.bin')]))
    out.curlWrite.push(curl([...headers, '-H', 'Content-Type: application/octet-stream', '--data-binary', '@' + local, url(boxDir + '/curl.bin')]))
  }
} finally {
  await sbx.kill()
  rmSync(dir, { recursive: true, force: true })
}
process.stdout.write(JSON.stringify(out) + '\n')
