// node test/e2b/scenario.mjs AREA...: runs areas of the E2B SDK scenario
// (control, commands, pty, files, code, code-js, limits, python; gethost,
// which needs a server with --e2b-domain: cmd/quro's TestE2BGetHost, and
// gethost-public, with --preview-public too: TestE2BGetHostPublic)
// against the server named by E2B_API_KEY, E2B_API_URL and
// E2B_SANDBOX_URL, one after another in this one process (node's start
// and the SDKs' imports, some 0.6 CPU-s, are paid once, not once an
// area); one JSON line per check on stdout. Each area's checks follow a
// line {"area": NAME}; an area that throws outside a check (its
// Sandbox.create, a bug of the scenario) gets a line {"area": NAME,
// "error": ...} and the next area still runs; {"area": NAME, "done":
// true} ends each area. cmd/quro's runE2BAreas reads them apart.
const areas = ['control', 'commands', 'pty', 'files', 'code', 'code-js', 'limits', 'python', 'gethost', 'gethost-public']
const asked = process.argv.slice(2)
if (asked.length === 0 || !asked.every((a) => areas.includes(a))) {
  console.error(`usage: node scenario.mjs AREA... (each one of ${areas.join(', ')})`)
  process.exit(2)
}
const line = (o) => process.stdout.write(JSON.stringify(o) + '\n')
for (const area of asked) {
  line({ area })
  try {
    await import(`./scenario/${area}.mjs`)
  } catch (err) {
    line({ area, error: `${err?.name ?? 'Error'}: ${err?.message ?? err}\n${err?.stack ?? ''}` })
    process.exitCode = 1
  }
  line({ area, done: true })
}
