// commands: run in the foreground with callbacks, exit codes, cwd, envs,
// user, background processes with stdin, list, connect, kill, timeouts.
import assert from 'node:assert/strict'
import { Sandbox, AuthenticationError, CommandExitError, InvalidArgumentError, TimeoutError } from 'e2b'
import { check, rejects, tag, waitFor } from './check.mjs'

const sbx = await Sandbox.create({ metadata: { scenario: tag(), area: 'commands' }, envs: { SBX_VAR: 'from-create' } })
try {
  await check('commands.run in the foreground with onStdout/onStderr', async () => {
    let out = ''
    let err = ''
    const r = await sbx.commands.run('echo hello; echo oops >&2', {
      onStdout: (d) => { out += d },
      onStderr: (d) => { err += d },
    })
    assert.equal(r.exitCode, 0)
    assert.equal(r.stdout, 'hello\n')
    assert.equal(r.stderr, 'oops\n')
    assert.equal(out, 'hello\n')
    assert.equal(err, 'oops\n')
  })

  await check('a non-zero exit code is a CommandExitError', async () => {
    const e = await rejects(() => sbx.commands.run('echo partial; exit 3'), CommandExitError, 'exit 3')
    assert.equal(e.exitCode, 3)
    assert.equal(e.stdout, 'partial\n')
  })

  await check('the working directory is /home/user, and cwd changes it', async () => {
    assert.equal((await sbx.commands.run('pwd')).stdout, '/home/user\n')
    await sbx.commands.run('mkdir -p sub/dir')
    assert.equal((await sbx.commands.run('pwd', { cwd: '/home/user/sub/dir' })).stdout, '/home/user/sub/dir\n')
  })

  await check('envs of the call and of Sandbox.create', async () => {
    const r = await sbx.commands.run('echo "$CALL_VAR $SBX_VAR"', { envs: { CALL_VAR: 'from-call' } })
    assert.equal(r.stdout, 'from-call from-create\n')
  })

  await check('user "user" runs the command', async () => {
    const r = await sbx.commands.run('echo "$HOME"; id -u', { user: 'user' })
    assert.equal(r.exitCode, 0)
    assert.equal(r.stdout.split('\n')[0], '/home/user')
  })

  await check('background + sendStdin + wait, listed while it runs', async () => {
    const h = await sbx.commands.run('read line; echo "got $line"', { background: true, stdin: true })
    assert.equal(typeof h.pid, 'number')
    const listed = await sbx.commands.list()
    assert.ok(listed.some((p) => p.pid === h.pid), `pid ${h.pid} not in ${JSON.stringify(listed.map((p) => p.pid))}`)
    await sbx.commands.sendStdin(h.pid, 'abc\n')
    const r = await h.wait()
    assert.equal(r.exitCode, 0)
    assert.equal(r.stdout, 'got abc\n')
  })

  await check('disconnect stops nothing; commands.connect sees the rest', async () => {
    const ready = waitFor((s) => s.includes('first'))
    let seen = ''
    const h = await sbx.commands.run('echo first; read x; echo "second $x"', {
      background: true, stdin: true, onStdout: (d) => { seen += d; ready.feed(seen) },
    })
    await ready.promise
    await h.disconnect()
    let later = ''
    const again = await sbx.commands.connect(h.pid, { onStdout: (d) => { later += d } })
    await sbx.commands.sendStdin(h.pid, 'x\n')
    const r = await again.wait()
    assert.equal(r.exitCode, 0)
    assert.match(later, /second x\n$/)
  })

  await check('commands.kill ends a background command with a CommandExitError', async () => {
    const h = await sbx.commands.run('sleep 600', { background: true, timeoutMs: 0 })
    assert.equal(await sbx.commands.kill(h.pid), true)
    const e = await rejects(() => h.wait(), CommandExitError, 'wait after kill')
    assert.notEqual(e.exitCode, 0)
    assert.equal(await sbx.commands.kill(h.pid), false, 'killing it again answers false')
  })

  await check('handle.kill', async () => {
    const h = await sbx.commands.run('sleep 600', { background: true, timeoutMs: 0 })
    assert.equal(await h.kill(), true)
    await rejects(() => h.wait(), CommandExitError, 'wait after handle.kill')
  })

  await check('a command past its timeoutMs is a TimeoutError', async () => {
    await rejects(() => sbx.commands.run('sleep 600', { timeoutMs: 1_000 }), TimeoutError, 'sleep 600 with timeoutMs 1000')
  })

  await check("envd's error classes: a missing cwd, an unknown user, stdin closed twice", async () => {
    const e = await rejects(() => sbx.commands.run('pwd', { cwd: '/home/user/no-such-dir' }), InvalidArgumentError, 'run in a missing cwd')
    assert.match(e.message, /cwd \/home\/user\/no-such-dir does not exist/)
    await rejects(() => sbx.commands.run('true', { user: 'quro-no-such-user' }), AuthenticationError, 'run as a user the sandbox has not')
    const eof = waitFor((s) => s.includes('eof'))
    let out = ''
    const h = await sbx.commands.run('cat >/dev/null; echo eof; exec sleep 600', {
      background: true, stdin: true, timeoutMs: 0, onStdout: (d) => { out += d; eof.feed(out) },
    })
    await sbx.commands.closeStdin(h.pid)
    await eof.promise
    await sbx.commands.closeStdin(h.pid) // closed already: nothing to do, as envd answers
    assert.equal(await h.kill(), true)
  })

  await check('a command is in the sandbox: state is kept between commands', async () => {
    await sbx.commands.run('echo kept > state.txt')
    assert.equal((await sbx.commands.run('cat /home/user/state.txt')).stdout, 'kept\n')
  })
} finally {
  await sbx.kill()
}
