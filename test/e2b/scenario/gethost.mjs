// gethost: a server the sandbox runs in the background (commands.run
// {background: true}) answered through sandbox.getHost(port), E2B's
// PORT-ID.DOMAIN, with the sandbox's trafficAccessToken in
// e2b-traffic-access-token; refused without it and with another
// sandbox's; a paused sandbox resumed by such a request (E2B's autoResume);
// create with network.allowPublicTraffic true refused (this
// server does not allow public previews). The server must run with
// --e2b-domain (create's domain); E2B_HOST_ADDR is where that name's
// wildcard DNS would lead (the test's quro serve), so the request is sent
// there with getHost's name as its Host.
import assert from 'node:assert/strict'
import http from 'node:http'
import { Sandbox } from 'e2b'
import { check, tag } from './check.mjs'

const [addr, port] = process.env.E2B_HOST_ADDR.split(':')

// get sends GET / to host (getHost's name) at the server's address.
function get(host, headers = {}) {
  return new Promise((resolve, reject) => {
    const req = http.request({ host: addr, port: Number(port), path: '/hello.txt', headers: { ...headers, host } }, (res) => {
      let body = ''
      res.setEncoding('utf8')
      res.on('data', (d) => { body += d })
      res.on('end', () => resolve({ status: res.statusCode, body }))
    })
    req.on('error', reject)
    req.end()
  })
}

const server = `import http.server, functools, os
H = functools.partial(http.server.SimpleHTTPRequestHandler, directory='/home/user/site')
s = http.server.ThreadingHTTPServer(('127.0.0.1', 8000), H)
open('/home/user/ready', 'w').write('up\\n')
s.serve_forever()`

const sbx = await Sandbox.create({ metadata: { scenario: tag(), area: 'gethost' } })
const other = await Sandbox.create({ metadata: { scenario: tag(), area: 'gethost-other' } })
try {
  await check('getHost(port) is PORT-ID.DOMAIN of create\'s domain', async () => {
    assert.equal(sbx.getHost(8000), `8000-${sbx.sandboxId}.${process.env.E2B_HOST_DOMAIN}`)
    assert.ok(sbx.trafficAccessToken, 'create returned no trafficAccessToken')
  })

  await check('a background server is answered through getHost with the traffic token', async () => {
    await sbx.commands.run('mkdir -p site && echo hello-from-the-sandbox > site/hello.txt && mkfifo ready')
    await sbx.files.write('/home/user/server.py', server)
    await sbx.commands.run('python3 /home/user/server.py', { background: true })
    // The server writes into the FIFO once it listens: reading it waits for that.
    assert.equal((await sbx.commands.run('read up < ready && echo $up')).stdout, 'up\n')
    const r = await get(sbx.getHost(8000), { 'e2b-traffic-access-token': sbx.trafficAccessToken })
    assert.equal(r.status, 200, r.body)
    assert.equal(r.body, 'hello-from-the-sandbox\n')
  })

  await check('without the traffic token, or with another sandbox\'s, it is refused', async () => {
    const none = await get(sbx.getHost(8000))
    assert.equal(none.status, 401, none.body)
    assert.match(none.body, /e2b-traffic-access-token/i)
    const theirs = await get(sbx.getHost(8000), { 'e2b-traffic-access-token': other.trafficAccessToken })
    assert.equal(theirs.status, 401, theirs.body)
  })

  await check('allowPublicTraffic true on a server without --preview-public is refused (403) naming the flag', async () => {
    let err
    try {
      const s = await Sandbox.create({ network: { allowPublicTraffic: true }, metadata: { scenario: tag(), area: 'gethost-public' } })
      await s.kill()
    } catch (e) {
      err = e
    }
    assert.ok(err, 'create with allowPublicTraffic true succeeded')
    assert.match(String(err?.message), /--preview-public/)
  })

  // E2B's lifecyclePayload test 'auto-resume wakes paused sandbox on http
  // request', with getHost's name sent where wildcard DNS would send it.
  await check('a request through getHost resumes a paused sandbox (autoResume) and is answered', async () => {
    assert.equal(await sbx.pause(), true)
    assert.equal((await sbx.getInfo()).state, 'paused')
    const r = await get(sbx.getHost(8000), { 'e2b-traffic-access-token': sbx.trafficAccessToken })
    assert.equal(r.status, 200, r.body)
    assert.equal(r.body, 'hello-from-the-sandbox\n')
    assert.equal((await sbx.getInfo()).state, 'running')
    assert.equal(await sbx.isRunning(), true)
  })

  await check('a port nothing listens on is a 502', async () => {
    const r = await get(sbx.getHost(8001), { 'e2b-traffic-access-token': sbx.trafficAccessToken })
    assert.equal(r.status, 502, r.body)
  })
} finally {
  await sbx.kill()
  await other.kill()
}
