// node summarise.mjs [--skips skips.txt] [--kind K] LABEL=vitest.json …
// Prints, for each vitest JSON report, passed/failed/skipped per test file
// and the totals, then the files skips.txt leaves out with their reasons,
// then the first line of each failure (markdown, for docs/e2b.md).
import fs from 'node:fs'
import path from 'node:path'

const args = process.argv.slice(2)
let skips = null
let kind = null
const reports = []
for (let i = 0; i < args.length; i++) {
  if (args[i] === '--skips') skips = args[++i]
  else if (args[i] === '--kind') kind = args[++i]
  else reports.push(args[i])
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
  const tot = { passed: 0, failed: 0, skipped: 0 }
  for (const f of rep.testResults ?? []) {
    const rel = f.name.replace(/^.*?\/(tests\/)/, '$1')
    const c = { passed: 0, failed: 0, skipped: 0 }
    for (const a of f.assertionResults ?? []) {
      const k = a.status === 'passed' ? 'passed' : a.status === 'failed' ? 'failed' : 'skipped'
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
  console.log(`\n### ${label}\n\n| file | passed | failed | skipped |\n|---|---:|---:|---:|`)
  for (const [rel, c] of rows) console.log(`| ${rel} | ${c.passed} | ${c.failed} | ${c.skipped} |`)
  console.log(`| **total (${rows.length} files)** | **${tot.passed}** | **${tot.failed}** | **${tot.skipped}** |`)
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
