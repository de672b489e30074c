// files: write/read (text, every byte value, blob, stream), write many,
// list, exists, getInfo, makeDir, rename, remove, watchDir; /home/user
// and relative paths name the same files; file metadata, watch entries,
// signed URLs.
import assert from 'node:assert/strict'
import { createHash, randomBytes } from 'node:crypto'
import { Sandbox, FileType, FilesystemEventType, NotFoundError } from 'e2b'
import { check, rejects, tag, waitFor } from './check.mjs'

const all = Uint8Array.from({ length: 256 }, (_, i) => i)
// The large file's size: 50 MB, a user's large upload, unless
// E2B_SCENARIO_LARGE_FILE_BYTES says (cmd/quro's TestE2BSDK: 6 MB, six of
// the download's 1 MiB gzip pieces; TestSoakE2BSDKLargeFile: the 50 MB).
const largeBytes = Number(process.env.E2B_SCENARIO_LARGE_FILE_BYTES || 50e6)
if (!Number.isSafeInteger(largeBytes) || largeBytes < 1) throw new Error(`E2B_SCENARIO_LARGE_FILE_BYTES=${process.env.E2B_SCENARIO_LARGE_FILE_BYTES}: want a number of bytes`)
const largeMB = Math.round(largeBytes / 1e6)
const sbx = await Sandbox.create({ metadata: { scenario: tag(), area: 'files' } })
try {
  await check('files.write a text file answers its /home/user path', async () => {
    const w = await sbx.files.write('/home/user/hello.txt', 'hello, sandbox\n')
    assert.equal(w.path, '/home/user/hello.txt')
    assert.equal(w.name, 'hello.txt')
    assert.equal(w.type, FileType.FILE)
  })

  await check('files.read text, by absolute and by relative path', async () => {
    assert.equal(await sbx.files.read('/home/user/hello.txt'), 'hello, sandbox\n')
    assert.equal(await sbx.files.read('hello.txt'), 'hello, sandbox\n')
  })

  await check('upload and download every byte value (bytes, blob, stream)', async () => {
    const w = await sbx.files.write('/home/user/bin/all.bin', all.buffer)
    assert.equal(w.path, '/home/user/bin/all.bin')
    assert.deepEqual(await sbx.files.read('/home/user/bin/all.bin', { format: 'bytes' }), all)
    const blob = await sbx.files.read('/home/user/bin/all.bin', { format: 'blob' })
    assert.deepEqual(new Uint8Array(await blob.arrayBuffer()), all)
    const stream = await sbx.files.read('/home/user/bin/all.bin', { format: 'stream' })
    const chunks = []
    for await (const c of stream) chunks.push(...c)
    assert.deepEqual(Uint8Array.from(chunks), all)
    // A Blob upload, read back as bytes.
    await sbx.files.write('/home/user/bin/blob.bin', new Blob([all]))
    assert.deepEqual(await sbx.files.read('/home/user/bin/blob.bin', { format: 'bytes' }), all)
  })

  await check(`a ${largeMB} MB file written and read back whole (SHA-256), within the SDK's default timeouts`, async () => {
    // The download's gzip stream goes out in 1 MiB chunks: in 16 KiB ones
    // node's fetch took over 90 s (past the SDK's 60 s) to decode a 50 MB
    // file.
    const sha = (b) => createHash('sha256').update(b).digest('hex')
    const big = randomBytes(largeBytes)
    const w = await sbx.files.write('/home/user/big/large.bin', big)
    assert.equal(w.path, '/home/user/big/large.bin')
    assert.equal((await sbx.files.getInfo('/home/user/big/large.bin')).size, big.length)
    const got = await sbx.files.read('/home/user/big/large.bin', { format: 'bytes' })
    assert.equal(got.length, big.length)
    assert.equal(sha(got), sha(big))
    // Text compresses: the gzip stream is much smaller than the file.
    const line = 'a line of text that compresses well\n'
    const text = line.repeat(Math.ceil(largeBytes / line.length))
    await sbx.files.write('/home/user/big/large.txt', text)
    assert.equal(sha(await sbx.files.read('/home/user/big/large.txt')), sha(text))
    await sbx.files.remove('/home/user/big')
  })

  await check('files.write many files in one call', async () => {
    const infos = await sbx.files.write([
      { path: '/home/user/many/a.txt', data: 'A' },
      { path: '/home/user/many/b.bin', data: all.buffer },
    ])
    assert.deepEqual(infos.map((i) => i.path).sort(), ['/home/user/many/a.txt', '/home/user/many/b.bin'])
    assert.equal(await sbx.files.read('/home/user/many/a.txt'), 'A')
    assert.deepEqual(await sbx.files.read('/home/user/many/b.bin', { format: 'bytes' }), all)
  })

  await check('files.list', async () => {
    const entries = await sbx.files.list('/home/user/many')
    assert.deepEqual(entries.map((e) => [e.name, e.path, e.type]).sort(), [
      ['a.txt', '/home/user/many/a.txt', FileType.FILE],
      ['b.bin', '/home/user/many/b.bin', FileType.FILE],
    ])
    assert.equal(entries.find((e) => e.name === 'b.bin').size, 256)
    const top = await sbx.files.list('/home/user')
    assert.ok(top.some((e) => e.name === 'many' && e.type === FileType.DIR), `no dir "many" in ${top.map((e) => e.name)}`)
  })

  await check('files.makeDir, exists', async () => {
    assert.equal(await sbx.files.makeDir('/home/user/made/deep'), true)
    assert.equal(await sbx.files.makeDir('/home/user/made/deep'), false, 'a second makeDir answers false')
    assert.equal(await sbx.files.exists('/home/user/made/deep'), true)
    assert.equal(await sbx.files.exists('/home/user/made/nothing'), false)
  })

  await check('files.getInfo', async () => {
    const f = await sbx.files.getInfo('/home/user/hello.txt')
    assert.equal(f.name, 'hello.txt')
    assert.equal(f.path, '/home/user/hello.txt')
    assert.equal(f.type, FileType.FILE)
    assert.equal(f.size, 'hello, sandbox\n'.length)
    const d = await sbx.files.getInfo('/home/user/made')
    assert.equal(d.type, FileType.DIR)
  })

  await check('files.getInfo and list of a symbolic link: its target\'s type, as envd', async () => {
    await sbx.commands.run('ln -sf hello.txt /home/user/link.txt && ln -sfn made /home/user/link.dir')
    const f = await sbx.files.getInfo('/home/user/link.txt')
    assert.equal(f.type, FileType.FILE)
    assert.equal(f.symlinkTarget, '/home/user/hello.txt')
    const d = await sbx.files.getInfo('link.dir')
    assert.equal(d.type, FileType.DIR)
    assert.equal(d.symlinkTarget, '/home/user/made')
    const listed = (await sbx.files.list('/home/user')).find((e) => e.name === 'link.txt')
    assert.equal(listed?.type, FileType.FILE)
    assert.equal(listed?.symlinkTarget, '/home/user/hello.txt')
  })

  await check('files.rename', async () => {
    await sbx.files.write('/home/user/old.txt', 'moved')
    const e = await sbx.files.rename('/home/user/old.txt', '/home/user/made/new.txt')
    assert.equal(e.path, '/home/user/made/new.txt')
    assert.equal(await sbx.files.exists('/home/user/old.txt'), false)
    assert.equal(await sbx.files.read('/home/user/made/new.txt'), 'moved')
  })

  await check('files.remove, and reading a missing file is a NotFoundError', async () => {
    await sbx.files.remove('/home/user/made')
    assert.equal(await sbx.files.exists('/home/user/made'), false)
    await rejects(() => sbx.files.read('/home/user/made/new.txt'), NotFoundError, 'read after remove')
  })

  await check('files in /tmp: written by the SDK, seen by commands, and the other way round', async () => {
    const w = await sbx.files.write('/tmp/test-git/x', 'from the sdk\n')
    assert.equal(w.path, '/tmp/test-git/x')
    const r = await sbx.commands.run('cat /tmp/test-git/x && stat -c %U /tmp/test-git/x')
    assert.equal(r.stdout, 'from the sdk\nuser\n')
    await sbx.commands.run('mkdir -p /tmp/made && echo from a command > /tmp/made/y && ln -s y /tmp/made/l')
    assert.equal(await sbx.files.read('/tmp/made/y'), 'from a command\n')
    const entries = await sbx.files.list('/tmp/made')
    assert.deepEqual(entries.map((e) => [e.name, e.path]).sort(), [['l', '/tmp/made/l'], ['y', '/tmp/made/y']])
    assert.equal(entries.find((e) => e.name === 'y').type, FileType.FILE)
    assert.equal((await sbx.files.getInfo('/tmp/made/y')).path, '/tmp/made/y')
    assert.equal(await sbx.files.exists('/tmp/made/nothing'), false)
    await sbx.files.rename('/tmp/made/y', '/home/user/from-tmp.txt')
    assert.equal(await sbx.files.read('/home/user/from-tmp.txt'), 'from a command\n')
    await sbx.files.remove('/tmp/made')
    assert.equal(await sbx.files.exists('/tmp/made'), false)
    // The box's system directories are not the sandbox user's to write.
    await rejects(() => sbx.files.write('/etc/quro-planted', 'x'), undefined, 'write to /etc')
    assert.match(await sbx.files.read('/etc/passwd'), /^root:/)
  })

  await check('git in /tmp/test-git through the SDK\'s git helpers', async () => {
    const repo = '/tmp/test-git/repo'
    await sbx.git.init(repo)
    await sbx.git.configureUser('Test User', 'test@example.com')
    await sbx.files.write(`${repo}/README.md`, '# test\n')
    await sbx.git.add(repo)
    await sbx.git.commit(repo, 'first commit')
    const st = await sbx.git.status(repo)
    assert.ok(st.currentBranch, `no current branch: ${JSON.stringify(st)}`)
    const log = await sbx.commands.run(`git -C ${repo} log --format=%s`)
    assert.equal(log.stdout, 'first commit\n')
    assert.equal(await sbx.files.read(`${repo}/README.md`), '# test\n')
  })

  await check('files.watchDir reports a write in the directory', async () => {
    await sbx.files.makeDir('/home/user/watched')
    const seen = waitFor((ev) => ev.name === 'x.txt' && (ev.type === FilesystemEventType.WRITE || ev.type === FilesystemEventType.CREATE))
    const h = await sbx.files.watchDir('/home/user/watched', (ev) => seen.feed(ev))
    try {
      await sbx.files.write('/home/user/watched/x.txt', 'x')
      await seen.promise
    } finally {
      await h.stop()
    }
  })

  await check('files.watchDir recursive reports a write in a subdirectory', async () => {
    await sbx.files.makeDir('/home/user/watched2/sub')
    const seen = waitFor((ev) => ev.name === 'sub/y.txt')
    const h = await sbx.files.watchDir('/home/user/watched2', (ev) => seen.feed(ev), { recursive: true })
    try {
      await sbx.files.write('/home/user/watched2/sub/y.txt', 'y')
      await seen.promise
    } finally {
      await h.stop()
    }
  })

  await check('file metadata: written, shown by getInfo and list, cleared by an overwrite', async () => {
    const metadata = { author: 'mish', purpose: 'upload' }
    const w = await sbx.files.write('/home/user/meta/m.txt', 'm', { metadata })
    assert.deepEqual(w.metadata, metadata)
    assert.deepEqual((await sbx.files.getInfo('meta/m.txt')).metadata, metadata)
    assert.deepEqual((await sbx.files.list('meta')).find((e) => e.name === 'm.txt')?.metadata, metadata)
    assert.equal((await sbx.files.write('meta/m.txt', 'again')).metadata, undefined)
    assert.equal((await sbx.files.getInfo('meta/m.txt')).metadata, undefined)
  })

  await check('files.watchDir includeEntry gives the entry of what changed', async () => {
    await sbx.files.makeDir('/home/user/watched3')
    const seen = waitFor((ev) => ev.name === 'z.txt' && ev.entry?.path === '/home/user/watched3/z.txt')
    const h = await sbx.files.watchDir('/home/user/watched3', (ev) => seen.feed(ev), { includeEntry: true, allowNetworkMounts: true })
    try {
      await sbx.files.write('/home/user/watched3/z.txt', 'z')
      const ev = await seen.promise
      assert.equal(ev.entry.type, FileType.FILE)
    } finally {
      await h.stop()
    }
  })

  await check('signed downloadUrl and uploadUrl work from a plain fetch (no sandbox id with E2B_SANDBOX_URL)', async () => {
    await sbx.files.write('signed.txt', 'signed content')
    const down = await sbx.downloadUrl('signed.txt', { useSignatureExpiration: 60_000 })
    const res = await fetch(down)
    assert.equal(res.status, 200)
    assert.equal(await res.text(), 'signed content')
    const form = new FormData()
    form.append('file', 'uploaded')
    const up = await fetch(await sbx.uploadUrl('up.txt'), { method: 'POST', body: form })
    assert.equal(up.status, 200)
    assert.equal(await sbx.files.read('up.txt'), 'uploaded')
    // The signature covers its path: another path with it opens nothing.
    const other = new URL(down)
    other.searchParams.set('path', '/home/user/hello.txt')
    assert.equal((await fetch(other)).status, 401)
  })
} finally {
  await sbx.kill()
}
