#!/usr/bin/env bash
# usage: test/e2b/run-suite.sh SUITE_DIR [vitest args…]
#
# Runs one of E2B's own JS test suites against a fresh `quro serve` and
# prints passed/failed/skipped per test file (docs/e2b.md records them).
# SUITE_DIR is either
#   - E2B's packages/js-sdk tree (github.com/e2b-dev/E2B; its tests import
#     ../src, so they run against the SDK sources of that tree), or
#   - the code interpreter's js/ tree (github.com/e2b-dev/code-interpreter).
# e.g. git -C E2B archive HEAD packages/js-sdk | tar -x -C /tmp/e2b
#      test/e2b/run-suite.sh /tmp/e2b/packages/js-sdk
#
# The tree is copied (never changed); test/e2b/suite's pinned packages
# (vitest, msw, dotenv, the SDK's runtime dependencies) are installed once
# with npm ci and linked in. test/e2b/skips.txt names the tests left out
# (E2B's cloud-only features), each with its reason; test/e2b/offline.txt
# the js-sdk files that mock E2B's API host, run in a second pass without
# the Quro variables. Extra arguments go to vitest (e.g. a file filter:
# tests/sandbox/files). Environment: QURO (the binary, default bin/quro),
# KEEP=1 keeps the work directory (server log, JSON reports), ROOTFS=DIR
# gives the server the rootfses installed in DIR (e.g. $QURO_DATA/rootfs
# with code-interpreter, which E2B's code-interpreter template runs on),
# NOSKIP=1 runs with an empty skip list (the cloud-only tests count too).
#
# Without a file filter the same tests run once more with no server at all
# (the variables pointing at a closed port): a test that passes there tests
# the SDK, not the server, and the summary counts it apart, so that the
# server's share reads as server-dependent passed / failed.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
[ $# -ge 1 ] || { sed -n '2,20p' "$0" >&2; exit 2; }
suite=$(realpath "$1"); shift
quro=${QURO:-$repo/bin/quro}
[ -x "$quro" ] || { echo "run-suite: no quro binary at $quro (make build, or set QURO)" >&2; exit 2; }
[ -d "$suite/tests" ] || { echo "run-suite: $suite has no tests/ (want E2B's packages/js-sdk or code-interpreter's js/)" >&2; exit 2; }
# The node test/e2b pins (20.20.2 from npm; vitest and the SDKs need >= 20.18.1).
[ -x "$here/node_modules/.bin/node" ] || npm ci --prefix "$here" --no-audit --no-fund
export PATH="$here/node_modules/.bin:$PATH"
name=$(node -p "require('$suite/package.json').name")
case "$name" in
e2b) kind=js-sdk ;;
@e2b/code-interpreter) kind=code-interpreter ;;
*) echo "run-suite: $suite is package '$name', want e2b (packages/js-sdk) or @e2b/code-interpreter (js/)" >&2; exit 2 ;;
esac

# The runner's packages, from the lock file.
stamp=$here/suite/node_modules/.quro-installed
if [ ! -e "$stamp" ] || [ "$here/suite/package-lock.json" -nt "$stamp" ]; then
	npm ci --prefix "$here/suite" --no-audit --no-fund
	touch "$stamp"
fi

work=$(mktemp -d /tmp/quro-e2b-suite.XXXXXX)
qpid=
cleanup() {
	[ -n "$qpid" ] && kill "$qpid" 2>/dev/null && wait "$qpid" 2>/dev/null
	if [ "${KEEP:-}" = 1 ]; then echo "run-suite: kept $work" >&2; else rm -rf "$work"; fi
}
trap cleanup EXIT

# A fresh server on a free port, and a tenant's key.
mkfifo "$work/out"
if [ -n "${ROOTFS:-}" ]; then
	mkdir -p "$work/data"
	ln -s "$(realpath "$ROOTFS")" "$work/data/rootfs"
fi
"$quro" serve --addr 127.0.0.1:0 --data "$work/data" >"$work/out" 2>"$work/serve.log" &
qpid=$!
exec 3<"$work/out"
url=
while IFS= read -r line <&3; do
	case "$line" in "quro listening on "*) url=${line#quro listening on }; break ;; esac
done
[ -n "$url" ] || { echo "run-suite: quro serve printed no address:" >&2; cat "$work/serve.log" >&2; exit 1; }
cat <&3 >/dev/null &
key=$("$quro" token create --data "$work/data" --tenant e2b-suite --scopes read,exec 2>/dev/null | head -1)
echo "run-suite: $kind suite $suite against quro at $url" >&2

cp -r "$suite" "$work/suite"
rm -rf "$work/suite/node_modules"
ln -s "$here/suite/node_modules" "$work/suite/node_modules"
cd "$work/suite"

# skips.txt → vitest excludes (files) and a test-name pattern (single tests).
entries() { sed -e 's/[[:space:]]#.*$//' -e '/^#/d' -e 's/[[:space:]]*$//' -e '/^$/d' "$1"; }
if [ "${NOSKIP:-}" = 1 ]; then : >"$work/skips"; else entries "$here/skips.txt" >"$work/skips"; fi
entries "$here/offline.txt" >"$work/offline"
node - "$work" "$kind" <<'EOF'
const fs = require('fs')
const [work, kind] = process.argv.slice(2)
const lines = fs.readFileSync(`${work}/skips`, 'utf8').split('\n').filter(Boolean)
const files = lines.filter((l) => !l.includes('::'))
const names = lines.filter((l) => l.includes('::')).map((l) => l.split('::')[1].trim())
const offline = fs.readFileSync(`${work}/offline`, 'utf8').split('\n').filter(Boolean)
const esc = (s) => s.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')
const pattern = names.length ? `^(?!(?:${names.map(esc).join('|')})$)` : ''
// globalFetchFallback.setup.ts reroutes the js-sdk's undici so that msw
// sees its requests (the suite's own unit project uses it too).
const setup = kind === 'js-sdk' ? `setupFiles: ['tests/globalFetchFallback.setup.ts'],` : ''
const config = (include, exclude) => `import { defineConfig } from 'vitest/config'
export default defineConfig({
  test: {
    include: ${JSON.stringify(include)},
    exclude: ${JSON.stringify(exclude)},
    ${pattern ? `testNamePattern: new RegExp(${JSON.stringify(pattern)}),` : ''}
    isolate: true,
    globals: false,
    testTimeout: 60_000,
    hookTimeout: 60_000,
    environment: 'node',
    maxWorkers: 2,
    ${setup}
    deps: { interopDefault: true },
  },
})
`
fs.writeFileSync('vitest.quro.config.mts', config(['tests/**/*.test.ts'], [...files, ...(kind === 'js-sdk' ? offline : []), '**/node_modules/**']))
fs.writeFileSync('vitest.offline.config.mts', config(offline, [...files, '**/node_modules/**']))
EOF

# The suites read .env with dotenv: none here, the environment says it all.
rm -f .env
status=0
E2B_API_KEY=$key E2B_API_URL=$url/e2b E2B_SANDBOX_URL=$url E2B_VALIDATE_API_KEY=false \
	npx vitest run --config vitest.quro.config.mts --reporter=json --outputFile="$work/quro.json" "$@" \
	>"$work/quro.log" 2>&1 || status=$?
reports=("quro=$work/quro.json")
if [ "$kind" = js-sdk ] && [ $# -eq 0 ]; then
	env -u E2B_API_URL -u E2B_SANDBOX_URL -u E2B_DOMAIN -u E2B_DEBUG E2B_API_KEY=e2b_0000000000000000000000000000000000000000 \
		npx vitest run --config vitest.offline.config.mts --reporter=json --outputFile="$work/offline.json" \
		>"$work/offline.log" 2>&1 || true
	reports+=("offline (SDK only, no server)=$work/offline.json")
fi
baseline=()
if [ $# -eq 0 ]; then
	# Port 9 (discard) on loopback: nothing listens, every call is refused.
	E2B_API_KEY=$key E2B_API_URL=http://127.0.0.1:9/e2b E2B_SANDBOX_URL=http://127.0.0.1:9 E2B_VALIDATE_API_KEY=false \
		npx vitest run --config vitest.quro.config.mts --reporter=json --outputFile="$work/noserver.json" \
		>"$work/noserver.log" 2>&1 || true
	baseline=(--baseline "$work/noserver.json")
fi
for r in quro offline noserver; do
	if [ -f "$work/$r.log" ] && [ ! -s "$work/$r.json" ]; then
		echo "run-suite: vitest ($r) wrote no report; its output:" >&2
		tail -40 "$work/$r.log" >&2
	fi
done
skiplist=$here/skips.txt
[ "${NOSKIP:-}" = 1 ] && skiplist=$work/skips
node "$here/summarise.mjs" --skips "$skiplist" --kind "$kind" "${baseline[@]}" "${reports[@]}"
exit 0
