// python: one Python per sandbox. commands.run's python and python3 (a
// login shell, as E2B runs every command) and the PTY's are runCode's
// interpreter, and none of them names a host path (sys.prefix, sys.path,
// tracebacks, pip's location, TMPDIR and pip's cache); what commands.run('pip install …')
// installs, runCode imports. And no root: user 'root' and sudo say why and what to use.
// E2B_SCENARIO_WHEEL names a wheel the server's pip index has
// (cmd/quro's TestE2BSDK serves one); without it that check is skipped.
import assert from 'node:assert/strict'
import { Sandbox } from '@e2b/code-interpreter'
import { CommandExitError } from 'e2b'
import { check, rejects, tag, waitFor } from './check.mjs'

const enc = new TextEncoder()
const probe = 'import sys; print(sys.executable, sys.version.split()[0])'
const sbx = await Sandbox.create({ metadata: { scenario: tag(), area: 'python' } })
try {
  const ex = await sbx.runCode(probe)
  assert.equal(ex.error, undefined, JSON.stringify(ex.error))
  const want = ex.logs.stdout.join('').trim()

  await check("commands.run's python and python3 are runCode's", async () => {
    // a box path: /run/quro/python (the embedded interpreter) or /usr/bin (a rootfs's)
    assert.match(want, /^\/(run\/quro\/python|usr)\/bin\/python3\S* 3\.\d+\.\d+$/)
    for (const py of ['python', 'python3']) {
      const r = await sbx.commands.run(`${py} -c '${probe}'`)
      assert.equal(r.stdout.trim(), want, py)
    }
    const pips = await sbx.commands.run('pip --version; pip3 --version')
    const [major, minor] = want.split(' ')[1].split('.')
    for (const l of pips.stdout.trim().split('\n')) assert.match(l, new RegExp(`\\(python ${major}\\.${minor}\\)$`))
  })

  await check("the PTY's python is runCode's", async () => {
    const dec = new TextDecoder()
    let out = ''
    let done
    const seen = new Promise((resolve) => { done = resolve })
    const h = await sbx.pty.create({
      cols: 200, rows: 24,
      onData: (d) => { out += dec.decode(d, { stream: true }); if (/PY=\/\S+ 3\.\d+\.\d+/.test(out.replaceAll('\r', ''))) done() },
    })
    await sbx.pty.sendInput(h.pid, enc.encode(`python -c 'import sys; print("PY=" + sys.executable, sys.version.split()[0])'\n`))
    await seen
    await sbx.pty.kill(h.pid)
    assert.match(out.replaceAll('\r', ''), new RegExp(`PY=${want.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')}\\n`))
  })

  // E2B_SCENARIO_HOST_PATHS: the server's data directory (where it
  // extracted its Python), which no answer may name.
  const hostPaths = (process.env.E2B_SCENARIO_HOST_PATHS ?? '').split(':').filter(Boolean)
  const noHost = (what, text) => {
    for (const d of hostPaths) assert.ok(!text.includes(d), `${what} names the host path ${d}:\n${text}`)
  }
  await check("Python's view names box paths only: runCode, commands.run, the PTY", async () => {
    const tree = '/run/quro/python'
    const ex = await sbx.runCode('import json, sys; print(json.dumps([sys.prefix, sys.base_prefix, sys.path]))')
    assert.equal(ex.error, undefined, JSON.stringify(ex.error))
    const [prefix, base, path] = JSON.parse(ex.logs.stdout.join(''))
    noHost("runCode's sys", JSON.stringify([prefix, base, path]))
    if (want.startsWith(tree)) {
      assert.equal(prefix, tree)
      assert.equal(base, tree)
      assert.ok(path.some((p) => p.startsWith(`${tree}/lib/python3`)), `sys.path ${path}`)
    }
    // The session's temporary directory at its box path, one for runCode
    // and commands: what one writes there the other reads.
    const tmp = await sbx.runCode('import os, tempfile; open(os.path.join(tempfile.gettempdir(), "from-code"), "w").write("kept"); print(os.environ["TMPDIR"], tempfile.gettempdir())')
    assert.equal(tmp.error, undefined, JSON.stringify(tmp.error))
    noHost("runCode's TMPDIR", tmp.logs.stdout.join(''))
    assert.equal(tmp.logs.stdout.join(''), '/run/quro/tmp /run/quro/tmp\n')
    const t = await sbx.commands.run(`echo "$TMPDIR"; pip cache dir; python3 -c 'import tempfile; print(tempfile.gettempdir())'; cat "$TMPDIR/from-code"`)
    noHost("commands.run's TMPDIR", t.stdout + t.stderr)
    assert.equal(t.stdout, '/run/quro/tmp\n/run/quro/tmp/pip-cache\n/run/quro/tmp\nkept')

    const tb = await sbx.runCode('import json\njson.loads("x")')
    assert.equal(tb.error?.name, 'JSONDecodeError')
    noHost("runCode's traceback", tb.error.traceback)

    const r = await sbx.commands.run(
      `python3 -c 'import sys; print(sys.prefix, *sys.path)'; pip --version; pip show pip | grep ^Location; python -c 'import json; json.loads("x")' || true`)
    const out = r.stdout + r.stderr
    noHost('commands.run', out)
    if (want.startsWith(tree)) {
      assert.match(out, new RegExp(`^${tree} `))
      assert.match(out, /^pip \S+ from \/run\/quro\/pip\/pip /m)
      assert.match(out, /^Location: \/run\/quro\/pip$/m)
      assert.match(out, new RegExp(`File "${tree}/lib/python3\\.\\d+/json/`))
    }

    const dec = new TextDecoder()
    let term = ''
    const { promise, feed } = waitFor((t) => /PIP-END/.test(t))
    const h = await sbx.pty.create({ cols: 200, rows: 24, onData: (d) => feed(term += dec.decode(d, { stream: true })) })
    await sbx.pty.sendInput(h.pid, enc.encode(`pip --version; python -c 'import sys; print(sys.prefix)'; echo "T=$TMPDIR"; echo PIP-""END\n`))
    await promise
    await sbx.pty.kill(h.pid)
    noHost('the PTY', term)
    assert.match(term.replaceAll('\r', ''), /^T=\/run\/quro\/tmp$/m)
    if (want.startsWith(tree)) assert.match(term, /from \/run\/quro\/pip\/pip /)
  })

  const wheel = process.env.E2B_SCENARIO_WHEEL
  if (wheel) await check("commands.run('pip install X'), then runCode('import X')", async () => {
    const r = await sbx.commands.run(`pip install ${wheel}`, { timeoutMs: 300_000 })
    assert.equal(r.exitCode, 0, r.stderr)
    const ex = await sbx.runCode(`import ${wheel}; print(${wheel}.VALUE)`)
    assert.equal(ex.error, undefined, JSON.stringify(ex.error))
    assert.equal(ex.logs.stdout.join(''), 'e2b\n')
  })

  await check("user 'root' is refused with why and what to use instead", async () => {
    const e = await rejects(() => sbx.commands.run('id -u', { user: 'root' }), Error, 'user root')
    assert.match(e.message, /has no root/)
    assert.match(e.message, /apt-get install/)
    assert.match(e.message, /pip install/)
  })

  await check('sudo says the same; sudo apt-get is the apt stand-in', async () => {
    const e = await rejects(() => sbx.commands.run('sudo id -u'), CommandExitError, 'sudo id')
    assert.equal(e.exitCode, 1)
    assert.match(e.stderr, /no root in a Quro sandbox/)
    assert.equal((await sbx.commands.run('sudo -u user id -un')).stdout, 'user\n')
    const apt = await rejects(() => sbx.commands.run('sudo apt-get install -y jq'), CommandExitError, 'sudo apt-get')
    assert.doesNotMatch(apt.stderr, /no root in a Quro sandbox/)
    assert.match(apt.stdout + apt.stderr, /install_packages/)
  })
} finally {
  await sbx.kill()
}
