// gethost-public: E2B's public traffic on a server that allows public
// previews (quro serve --preview-public --e2b-domain; cmd/quro's
// TestE2BGetHostPublic). A sandbox created with network.allowPublicTraffic
// true answers getHost(port) with no traffic token; one created without
// it, or with false, still needs the token (401 naming the header). As in
// gethost, E2B_HOST_ADDR is where getHost's name would lead (the test's
// quro serve), so the request goes there with that name as its Host.
import assert from 'node:assert/strict'
import http from 'node:http'
import { Sandbox } from 'e2b'
import { check, tag } from './check.mjs'

const [addr, port] = process.env.E2B_HOST_ADDR.split(':')

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

const server = `import http.server, functools
H = functools.partial(http.server.SimpleHTTPRequestHandler, directory='/home/user/site')
s = http.server.ThreadingHTTPServer(('127.0.0.1', 8000), H)
open('/home/user/ready', 'w').write('up\\n')
s.serve_forever()`

// serve starts the file server in sbx and waits until it listens.
async function serve(sbx) {
  await sbx.commands.run('mkdir -p site && echo hello-from-the-sandbox > site/hello.txt && mkfifo ready')
  await sbx.files.write('/home/user/server.py', server)
  await sbx.commands.run('python3 /home/user/server.py', { background: true })
  assert.equal((await sbx.commands.run('read up < ready && echo $up')).stdout, 'up\n')
}

const pub = await Sandbox.create({ network: { allowPublicTraffic: true }, metadata: { scenario: tag(), area: 'gethost-public' } })
const priv = await Sandbox.create({ network: { allowPublicTraffic: false }, metadata: { scenario: tag(), area: 'gethost-private' } })
const plain = await Sandbox.create({ metadata: { scenario: tag(), area: 'gethost-plain' } })
try {
  await check('allowPublicTraffic true: getHost answers with no traffic token', async () => {
    await serve(pub)
    const r = await get(pub.getHost(8000))
    assert.equal(r.status, 200, r.body)
    assert.equal(r.body, 'hello-from-the-sandbox\n')
  })

  await check('allowPublicTraffic false, or absent: the traffic token is still needed', async () => {
    for (const sbx of [priv, plain]) {
      await serve(sbx)
      const none = await get(sbx.getHost(8000))
      assert.equal(none.status, 401, none.body)
      assert.match(none.body, /e2b-traffic-access-token/i)
      const ok = await get(sbx.getHost(8000), { 'e2b-traffic-access-token': sbx.trafficAccessToken })
      assert.equal(ok.status, 200, ok.body)
    }
  })
} finally {
  await pub.kill()
  await priv.kill()
  await plain.kill()
}
