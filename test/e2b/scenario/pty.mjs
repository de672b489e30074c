// pty: create, sendInput, connect (with the replay), resize, kill, and an exit code.
import assert from 'node:assert/strict'
import { Sandbox, CommandExitError } from 'e2b'
import { check, rejects, tag, waitFor } from './check.mjs'

const enc = new TextEncoder()
const sbx = await Sandbox.create({ metadata: { scenario: tag(), area: 'pty' } })

// A PTY whose output is collected; until(re) waits for it to appear.
async function terminal(opts = {}) {
  const dec = new TextDecoder()
  let out = ''
  let waiters = []
  const h = await sbx.pty.create({
    cols: 80, rows: 24, ...opts,
    onData: (d) => {
      out += dec.decode(d, { stream: true })
      waiters = waiters.filter((w) => !w(out))
    },
  })
  const until = (re) => new Promise((resolve) => {
    const w = (s) => { if (re.test(s)) { resolve(s); return true } return false }
    if (!w(out)) waiters.push(w)
  })
  return { h, until }
}

try {
  await check('pty.create + sendInput runs a shell command', async () => {
    const t = await terminal()
    assert.equal(typeof t.h.pid, 'number')
    await sbx.pty.sendInput(t.h.pid, enc.encode('echo "$((6*7))-$TERM"\n'))
    await t.until(/42-\S+/)
    await sbx.pty.kill(t.h.pid)
  })

  await check('pty.connect replays what the terminal showed before, then follows it', async () => {
    const t = await terminal()
    await sbx.pty.sendInput(t.h.pid, enc.encode('echo "before-$((6*7))"\n'))
    await t.until(/before-42/)
    await t.h.disconnect()
    const dec = new TextDecoder()
    let again = ''
    const h2 = await sbx.pty.connect(t.h.pid, { onData: (d) => { again += dec.decode(d, { stream: true }) } })
    await sbx.pty.sendInput(t.h.pid, enc.encode('echo "after-$((7*8))"; exit\n'))
    await h2.wait()
    assert.match(again, /before-42[\s\S]*after-56/, 'the replay comes first, then what follows')
  })

  await check('pty.resize changes the terminal size', async () => {
    const t = await terminal({ cols: 80, rows: 24 })
    await sbx.pty.sendInput(t.h.pid, enc.encode('stty size\n'))
    await t.until(/24 80/)
    await sbx.pty.resize(t.h.pid, { cols: 100, rows: 30 })
    await sbx.pty.sendInput(t.h.pid, enc.encode('stty size\n'))
    await t.until(/30 100/)
    await sbx.pty.kill(t.h.pid)
  })

  await check('pty.create with cwd and envs', async () => {
    const mk = await terminal()
    await sbx.pty.sendInput(mk.h.pid, enc.encode('mkdir -p /home/user/ptydir && echo "m$((1+1))de"\n'))
    await mk.until(/m2de/)
    await sbx.pty.kill(mk.h.pid)
    const t = await terminal({ cwd: '/home/user/ptydir', envs: { PTY_VAR: 'pv' } })
    await sbx.pty.sendInput(t.h.pid, enc.encode('echo "[$(pwd)][$PTY_VAR]"\n'))
    await t.until(/\[\/home\/user\/ptydir\]\[pv\]/)
    await sbx.pty.kill(t.h.pid)
  })

  await check('pty.kill ends it: wait is a CommandExitError', async () => {
    const t = await terminal()
    assert.equal(await sbx.pty.kill(t.h.pid), true)
    await rejects(() => t.h.wait(), CommandExitError, 'wait after pty.kill')
    assert.equal(await sbx.pty.kill(t.h.pid), false, 'killing it again answers false')
  })

  await check('a shell that exits 5 ends the PTY with exit code 5', async () => {
    const t = await terminal()
    await sbx.pty.sendInput(t.h.pid, enc.encode('exit 5\n'))
    const e = await rejects(() => t.h.wait(), CommandExitError, 'wait after exit 5')
    assert.equal(e.exitCode, 5)
  })
} finally {
  await sbx.kill()
}
