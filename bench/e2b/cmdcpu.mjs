// CPU per commands.run('true') on two quro serve side by side (A, B), in
// alternating blocks of commands: the box's cgroup (cpuacct.usage, cgroup v1:
// the zygote, bash, true), the server's process (utime+stime), node's own;
// and the wall time. CPU is steadier than wall time on a loaded machine.
//
//   QURO_A="URL KEY SERVER_PID" QURO_B="URL KEY SERVER_PID" \
//   E2B_NODE_MODULES=test/e2b/node_modules node bench/e2b/cmdcpu.mjs BLOCKS PER_BLOCK
//
// (KEY: quro token create --data DIR --tenant bench --scopes read,exec; run
// as root, to read the box's cgroup and the server's /proc entry.)
import { createRequire } from 'node:module'
import { readFileSync, readdirSync } from 'node:fs'
import { resolve } from 'node:path'
import { performance } from 'node:perf_hooks'
const require = createRequire(resolve(process.env.E2B_NODE_MODULES) + '/')
const { Sandbox } = require('e2b')
const blocks = +process.argv[2], per = +process.argv[3]
const tick = 100 // USER_HZ
function boxCgroup(id) {
  for (const p of readdirSync('/proc')) {
    if (!/^\d+$/.test(p)) continue
    let cl
    try { cl = readFileSync(`/proc/${p}/cmdline`, 'utf8') } catch { continue }
    if (!cl.startsWith('bwrap') || !cl.includes(`/sessions/${id}/workspace`)) continue
    for (const c of readdirSync('/proc')) {
      if (!/^\d+$/.test(c)) continue
      try {
        const st = readFileSync(`/proc/${c}/stat`, 'utf8')
        if (st.slice(st.lastIndexOf(')') + 2).split(' ')[1] !== p) continue
        const cg = readFileSync(`/proc/${c}/cgroup`, 'utf8').split('\n').find(l => l.includes(':cpuacct:'))
        return `/sys/fs/cgroup/cpuacct${cg.split(':')[2]}/cpuacct.usage`
      } catch {}
    }
  }
  throw new Error('no box for ' + id)
}
const procCPU = (pid) => { const f = readFileSync(`/proc/${pid}/stat`, 'utf8'); const x = f.slice(f.lastIndexOf(')') + 2).split(' '); return (+x[11] + +x[12]) / tick * 1000 }
const sides = []
for (const name of ['A', 'B']) {
  const [url, key, pid] = process.env['QURO_' + name].trim().split(/\s+/)
  const sbx = await Sandbox.create({ apiKey: key, apiUrl: url + '/e2b', sandboxUrl: url, timeoutMs: 3_600_000 })
  for (let i = 0; i < 10; i++) await sbx.commands.run('true')
  sides.push({ name, sbx, pid, cg: boxCgroup(sbx.sandboxId), box: 0, srv: 0, node: 0, wall: [] })
}
for (let b = 0; b < blocks; b++) {
  for (const s of (b % 2 ? [...sides].reverse() : sides)) {
    const c0 = BigInt(readFileSync(s.cg, 'utf8')), p0 = procCPU(s.pid), n0 = process.cpuUsage()
    for (let i = 0; i < per; i++) { const t0 = performance.now(); await s.sbx.commands.run('true'); s.wall.push(performance.now() - t0) }
    const n1 = process.cpuUsage(n0)
    s.box += Number(BigInt(readFileSync(s.cg, 'utf8')) - c0) / 1e6
    s.srv += procCPU(s.pid) - p0
    s.node += (n1.user + n1.system) / 1000
  }
}
for (const s of sides) {
  const n = s.wall.length
  s.wall.sort((a, b) => a - b)
  console.log(`${s.name}: ${n} commands.run('true'): box CPU ${(s.box / n).toFixed(2)} ms, server CPU ${(s.srv / n).toFixed(2)} ms, node CPU ${(s.node / n).toFixed(2)} ms per command; wall median ${s.wall[n >> 1].toFixed(1)} ms, min ${s.wall[0].toFixed(1)} ms`)
  await s.sbx.kill()
}
