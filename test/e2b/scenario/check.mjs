// The scenario's small runner: each check is an async function run in
// order; one line of JSON per check on stdout ({check, ok, error}), read by
// cmd/quro's TestE2BSDK (one Go subtest per area, one failure per check).
// A check that throws fails alone; later checks of the area still run
// (each creates what it needs), so one missing feature does not hide the
// state of the others.

export const results = []

export async function check(name, fn) {
  try {
    await fn()
    results.push({ check: name, ok: true })
    process.stdout.write(JSON.stringify({ check: name, ok: true }) + '\n')
  } catch (err) {
    const error = `${err?.name ?? 'Error'}: ${err?.message ?? err}` +
      (process.env.E2B_SCENARIO_STACKS ? `\n${err?.stack}` : '')
    results.push({ check: name, ok: false, error })
    process.stdout.write(JSON.stringify({ check: name, ok: false, error }) + '\n')
  }
}

// rejects runs fn and returns what it threw, failing when it did not
// throw or threw something that is not an instance of cls.
export async function rejects(fn, cls, what) {
  try {
    await fn()
  } catch (err) {
    if (cls && !(err instanceof cls)) {
      throw new Error(`${what}: threw ${err?.name}: ${err?.message}, want a ${cls.name}`)
    }
    return err
  }
  throw new Error(`${what}: did not throw (want a ${cls ? cls.name : 'error'})`)
}

// waitFor returns a promise and a function that resolves it when pred(x)
// holds for the x it is given: the checks wait on the SDK's callbacks,
// never on time.
export function waitFor(pred) {
  let resolve
  const p = new Promise((r) => (resolve = r))
  return { promise: p, feed: (x) => { if (pred(x)) resolve(x) } }
}

// until calls probe until it returns a truthy value, giving up after
// limitMs. Only for a change the SDK has no event for (a sandbox that a
// timeout kills: nothing streams its end to the control plane).
export async function until(what, probe, limitMs = 120_000) {
  const end = Date.now() + limitMs
  for (;;) {
    const v = await probe()
    if (v) return v
    if (Date.now() > end) throw new Error(`${what}: not after ${limitMs} ms`)
    await new Promise((r) => setTimeout(r, 200))
  }
}

export function tag() {
  return `scn-${process.pid}-${Math.random().toString(16).slice(2, 10)}`
}

// The three variables the scenario runs with (docs/e2b.md).
for (const v of ['E2B_API_KEY', 'E2B_API_URL', 'E2B_SANDBOX_URL']) {
  if (!process.env[v]) {
    console.error(`${v} is not set: the scenario runs against a quro serve (see test/e2b/README.md)`)
    process.exit(2)
  }
}
