// node test/e2b/scenario.mjs AREA: runs one area of the E2B SDK scenario
// (control, commands, pty, files, code, code-js, limits, python; gethost,
// which needs a server with --e2b-domain: cmd/quro's TestE2BGetHost, and
// gethost-public, with --preview-public too: TestE2BGetHostPublic)
// against the server named by E2B_API_KEY, E2B_API_URL and
// E2B_SANDBOX_URL; one JSON line per check.
const areas = ['control', 'commands', 'pty', 'files', 'code', 'code-js', 'limits', 'python', 'gethost', 'gethost-public']
const area = process.argv[2]
if (!areas.includes(area)) {
  console.error(`usage: node scenario.mjs AREA (one of ${areas.join(', ')})`)
  process.exit(2)
}
await import(`./scenario/${area}.mjs`)
