// node summarise.mjs [--skips skips.txt] [--kind K] [--baseline noserver.json] LABEL=vitest.json …
// Prints, for each vitest JSON report, passed/failed/skipped per test file
// and the totals, then the files skips.txt leaves out with their reasons,
// then the first line of each failure (markdown, for docs/e2b.md).
// With --baseline (a report of the same files run with no server
// reachable), a test that passed there is counted apart, as "passes
// without a server": it tests the SDK, not the server. The server's share
// is then what the others give: server-dependent passed / failed.
import fs from 'node:fs'
import path from 'node:path'

const args = process.argv.slice(2)
let skips = null
let kind = null
let baseline = null
const reports = []
for (let i = 0; i < args.length; i++) {
  if (args[i] === '--skips') skips = args[++i]
  else if (args[i] === '--kind') kind = args[++i]
  else if (args[i] === '--baseline') baseline = args[++i]
  else reports.push(args[i])
}

const relOf = (name) => name.replace(/^.*?\/(tests\/)/, '$1')
// The tests that pass with no server at all, by FILE::FULL NAME.
const offlinePass = new Set()
if (baseline) {
  try {
    const rep = JSON.parse(fs.readFileSync(baseline, 'utf8'))
    for (const f of rep.testResults ?? [])
      for (const a of f.assertionResults ?? [])
        if (a.status === 'passed') offlinePass.add(`${relOf(f.name)}::${a.fullName ?? a.title}`)
  } catch (err) {
    console.log(`\n(no baseline: ${err.message})`)
    baseline = null
  }
}

const failures = []
for (const r of reports) {
  const eq = r.indexOf('=')
  const [label, file] = eq > 0 ? [r.slice(0, eq), r.slice(eq + 1)] : [path.basename(r), r]
  let rep
  try {
    rep = JSON.parse(fs.readFileSync(file, 'utf8'))
  } catch (err) {
    console.log(`\n### ${label}: no report (${err.message})`)
    continue
  }
  const rows = []
  const split = baseline && label.startsWith('quro')
  const tot = { passed: 0, failed: 0, skipped: 0, offline: 0 }
  for (const f of rep.testResults ?? []) {
    const rel = relOf(f.name)
    const c = { passed: 0, failed: 0, skipped: 0, offline: 0 }
    for (const a of f.assertionResults ?? []) {
      const k = a.status === 'passed' ? 'passed' : a.status === 'failed' ? 'failed' : 'skipped'
      if (split && k === 'passed' && offlinePass.has(`${rel}::${a.fullName ?? a.title}`)) {
        c.offline++
        continue
      }
      c[k]++
      if (k === 'failed') failures.push(`${rel} › ${a.fullName ?? a.title}: ${firstLine(a.failureMessages?.[0])}`)
    }
    // A file that failed before its tests ran (an import error, a hook).
    if ((f.assertionResults ?? []).length === 0 && f.status === 'failed') {
      c.failed++
      failures.push(`${rel} (the file): ${firstLine(f.message)}`)
    }
    for (const k in tot) tot[k] += c[k]
    rows.push([rel, c])
  }
  rows.sort((a, b) => a[0].localeCompare(b[0]))
  if (split) {
    const pct = (p, f) => (p + f ? ((100 * p) / (p + f)).toFixed(1) : '-')
    console.log(`\n### ${label}\n\n| file | server: passed | server: failed | skipped | passes without a server |\n|---|---:|---:|---:|---:|`)
    for (const [rel, c] of rows) console.log(`| ${rel} | ${c.passed} | ${c.failed} | ${c.skipped} | ${c.offline} |`)
    console.log(`| **total (${rows.length} files)** | **${tot.passed}** | **${tot.failed}** | **${tot.skipped}** | **${tot.offline}** |`)
    console.log(`\nTests that need a server: ${tot.passed} passed, ${tot.failed} failed (${pct(tot.passed, tot.failed)} %); ${tot.offline} more pass with no server at all.`)
  } else {
    console.log(`\n### ${label}\n\n| file | passed | failed | skipped |\n|---|---:|---:|---:|`)
    for (const [rel, c] of rows) console.log(`| ${rel} | ${c.passed} | ${c.failed} | ${c.skipped} |`)
    console.log(`| **total (${rows.length} files)** | **${tot.passed}** | **${tot.failed}** | **${tot.skipped}** |`)
  }
}

if (skips) {
  // Only the section of this suite (# --- KIND: …), or all without --kind.
  let section = null
  const lines = []
  for (const l of fs.readFileSync(skips, 'utf8').split('\n')) {
    const m = l.match(/^# --- ([\w-]+):/)
    if (m) section = m[1]
    else if (l.trim() && !l.startsWith('#') && (!kind || section === kind)) lines.push(l)
  }
  console.log('\n### left out (test/e2b/skips.txt)\n')
  for (const l of lines) {
    const [what, why] = l.split(/\s#\s/)
    console.log(`- \`${what.trim()}\`: ${why?.trim() ?? ''}`)
  }
}
if (failures.length) {
  console.log('\n### failures\n')
  for (const f of failures) console.log(`- ${f}`)
}

function firstLine(s) {
  return String(s ?? '').replace(/\x1b\[[0-9;]*m/g, '').split('\n').find((l) => l.trim())?.trim().slice(0, 240) ?? ''
}
