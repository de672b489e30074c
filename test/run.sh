#!/usr/bin/env bash
# make test's checks and tests, after its install steps (test-install,
# test-deps): the Makefile passes its settings in the environment (GO,
# TRIM, TEST_P, TEST_PARALLEL, TEST_TIMEOUT, SLOW_PKGS, SPLIT_PKGS,
# SLIM_APP_RUN, SLIM_MCP_RUN, GOLANGCI, MAKE; QURO_TEST_BIN, the bin/quro test-install
# has just built, which internal/api/mcp's and internal/sandbox's tests
# run instead of linking a quro of their own: a link is seconds of CPU).
#
# Each phase prints how long it took, so that a slow run says where its
# minutes went:
#   1. npm ci of the four node trees (mostly the network and the disk),
#      gofmt, go.mod tidiness and vet, all side by side (make -j);
#   2. the web bundle's types (it needs web/node_modules);
#   3. every package's tests (SLOW_PKGS, the longest, first; SPLIT_PKGS,
#      empty by default, each as several processes of one test binary
#      beside them, below; internal/app in a go test of its own beside
#      them, followed by the slim build's internal/app tests), with
#      three runs beside them: at nice 10, the linter (it loads the
#      packages compiled with $TRIM, as the tests are, from the build
#      cache: 11 s of CPU in a fresh clone, 86 s without the flag) and
#      the fuzz targets (rounds until the tests end, each run starting
#      where the last one stopped); at nice 0, the slim build's Python engine and MCP tests (no
#      embedded Python: the rest of the Python chain must answer). Each
#      side run prints its output and time when the tests end.
# The tests' phase's wall time was internal/app's, which mostly waits
# (boxes, apt, pip, compilers: its process and children used 83 s of CPU
# in its first 570 s at a load of 15), so the fuzz run (mostly CPU, and
# nothing on the host) fills that wait instead of running after it. With
# one core free (CI beside stress-ng --cpu 1) make test's wall time is
# at least the CPU time it spends, so what runs beside the tests runs at
# nice 10 (about a tenth of a core the tests also want) and the fuzz run
# mostly uses CPU the tests leave idle: it ends when they do (with the
# target it is on), not after a fixed count. The
# slim build's internal/app tests run after the full build's, in the same
# side run, never beside them: the one run with them beside the full
# build's had a leak test that did not settle
# (TestSessionsHeldAtOnceLeaveNothing; its counts are this process's, so
# the cause is not proven). The slim build's Python engine and MCP tests
# run beside the tests (below).
# A failing phase does not stop the later ones (a lint finding and a test
# failure are both worth seeing in one run); the exit status is that of
# the first failure.
set -uo pipefail
cd "$(dirname "$0")/.."

: "${GO:=go}" "${MAKE:=make}" "${TRIM:=-trimpath}" "${TEST_P:=4}" "${TEST_PARALLEL:=4}"
: "${TEST_TIMEOUT:=30m}" "${SLOW_PKGS:=}" "${SLIM_APP_RUN:=.}" "${SLIM_MCP_RUN:=.}"
: "${GOLANGCI:=$GO tool -modfile=tools/golangci/go.mod golangci-lint}"
: "${FUZZ_FIRST:=2000x}" "${FUZZ_SLOW:=50x}" "${SPLIT_PKGS:=}"

status=0
start=$(date +%s)
phase() { # name command...
	local name=$1 t rc
	shift
	t=$(date +%s)
	echo "== $name"
	"$@"
	rc=$?
	echo "== $name: $(($(date +%s) - t)) s, rc $rc (total $(($(date +%s) - start)) s)"
	[ "$status" = 0 ] && status=$rc
	return 0
}

# side name command... runs command in the background, its output to a
# file that is printed when it is waited for (with "wait_side").
declare -A side_pid side_log side_t
side() {
	local name=$1
	shift
	side_log[$name]=$(mktemp)
	side_t[$name]=$(date +%s)
	"$@" >"${side_log[$name]}" 2>&1 &
	side_pid[$name]=$!
}
wait_side() { # name
	local name=$1 rc
	wait "${side_pid[$name]}"
	rc=$?
	echo "== $name (beside the tests)"
	cat "${side_log[$name]}"
	rm -f "${side_log[$name]}"
	echo "== $name: $(($(date +%s) - side_t[$name])) s from its start, rc $rc (total $(($(date +%s) - start)) s)"
	[ "$status" = 0 ] && status=$rc
	return 0
}
# The fuzz run goes on until the tests end (test/fuzz/run.sh): this file
# says they have.
fuzz_stop=$(mktemp -d)/tests-ended
# One Go build cache for the two tests that build Go in a box, empty as
# make test starts and gone when it ends: the first of them builds the
# standard library cold and leaves its cache here, the other starts from a
# copy (internal/engine/toolchain/toolchaintest). Each make test still
# makes one cold build.
QURO_TEST_GOCACHE=$(mktemp -d)
export QURO_TEST_GOCACHE
# The test binaries of SPLIT_PKGS (below).
split_dir=$(mktemp -d)
trap 'touch "$fuzz_stop"; for p in "${side_pid[@]}"; do kill "$p" 2>/dev/null; done; rm -rf "${fuzz_stop%/*}" "$QURO_TEST_GOCACHE" "$split_dir"' EXIT

# npm ci mostly waits on the network and the disk, vet mostly computes:
# side by side (make -j, each target's output kept whole), then the web
# bundle's type check, which needs web/node_modules.
phase "npm ci (four trees), fmt-check, tidy-check, vet, side by side" \
	"$MAKE" --no-print-directory -j7 -Otarget \
	test/mcp-ts/node_modules/.quro-installed test/e2b/node_modules/.quro-installed web/node_modules/.quro-installed \
	web/openapi/node_modules/.quro-installed fmt-check tidy-check vet
phase "web-check" "$MAKE" --no-print-directory web-check

# GOFLAGS=$TRIM: see the Makefile's lint (a fresh clone's lint compiled
# the whole tree again without it).
# Both side runs at nice 10: they take the CPU the tests leave idle and
# mostly give way when the tests want it (with one core, the tests' CPU
# is the floor of make test's wall time; a side run beside them at the
# same priority adds its CPU to it). Not 19 (a fifteenth of the share):
# the targets whose inputs run code in a box start sessions in each
# worker, and at loads of 57 and 85, at nice 0, two of them failed on a
# seed ("fuzzing process hung or terminated unexpectedly"); a worker
# starved for longer is not made safer by it.
side lint nice -n 10 env GOFLAGS="$TRIM${GOFLAGS:+ $GOFLAGS}" $GOLANGCI run --allow-serial-runners ./...
# The fuzz targets: rounds of FUZZ_FIRST inputs each (FUZZ_SLOW for those
# whose inputs take milliseconds or run code in a box) until the tests
# end, each run starting at the package after the last one the previous
# run fuzzed (test/fuzz/run.sh; the binaries of the box-running targets
# are go test's plain ones, whose compile this make test's go test
# shares). A first round that always ran whole ended 64 s after the
# tests beside stress-ng --cpu 1 (the box-running targets, last in the
# list, each input a run in a box).
side fuzz nice -n 10 env FUZZTIME="$FUZZ_FIRST" FUZZCOUNT_SLOW="$FUZZ_SLOW" FUZZ_UNTIL="$fuzz_stop" \
	GO="$GO" TRIM="$TRIM" bash test/fuzz/run.sh
# The slim build's Python engine and MCP tests run beside the tests, at
# nice 0 (they are tests, not filler): they were 75 s of wall time after
# them (62 s and 12 s in CI), mostly the slim build's compile and the
# Python chain's waits, while the tests' phase mostly waits too. Neither
# package's tests count what the host holds, and internal/app's leak
# tests count only what lies under their own data directory (mounts,
# loop devices) or their own App, which the full build's MCP, Python
# engine and cmd/quro tests already run beside.
slim_side() {
	"$GO" test $TRIM -parallel "$TEST_PARALLEL" -count=1 -timeout "$TEST_TIMEOUT" -tags slim ./internal/engine/python/ &&
		"$GO" test $TRIM -parallel "$TEST_PARALLEL" -count=1 -timeout "$TEST_TIMEOUT" -tags slim -run "$SLIM_MCP_RUN" ./internal/api/mcp/
}
side "go test -tags slim (Python engine, MCP)" slim_side
# The longest packages (SPLIT_PKGS, each "pkg=regexp[,regexp...]":
# internal/app and internal/sandbox) run as several processes of one test
# binary each, started with the tests' phase, beside it: one process per
# regexp, for the tests it names, and one for the rest. In one process
# go test runs every serial test first, one at a time, and only then the
# parallel ones, -parallel at a time: so a package's long parallel tests
# (those that wait on pip, apt, a package index, compilers, the egress,
# the CPython suite) started only after all its serial ones, and its
# long serial tests (the leak tests' hundreds of sessions) ran one after
# another with everything else. In processes of their own they run side
# by side. Each process counts only what it holds (the leak tests count
# their process's goroutines, fds, threads, children and run cgroups,
# and the mounts under their own data directory), a serial test is
# still alone in its process, and the shared test rootfs is built under
# an flock (rootfstest). The binary is built once (go test -c), not once
# per go test, and runs in its package's directory as go test runs it;
# go test's vet of the package is the vet phase's.
split_side() { # pkg regexp[,regexp...]
	local pkg=$1 dir=$split_dir/${1//\//_} t=$(date +%s) rc i pids=() res
	local args=(-test.paniconexit0 -test.count=1 -test.parallel="$TEST_PARALLEL" -test.timeout="$TEST_TIMEOUT")
	IFS=, read -ra res <<<"$2"
	mkdir -p "$dir" && "$GO" test $TRIM -c -o "$dir/test" "./$pkg/" || return
	echo "$pkg built in $(($(date +%s) - t)) s"
	t=$(date +%s)
	for i in "${!res[@]}"; do
		(
			(cd "$pkg" && exec "$dir/test" "${args[@]}" -test.run="${res[i]}")
			set -- $?
			echo "$pkg -run '${res[i]}': rc $1, $(($(date +%s) - t)) s"
			exit "$1"
		) >"$dir/$i.log" 2>&1 &
		pids+=($!)
	done
	(cd "$pkg" && exec "$dir/test" "${args[@]}" -test.skip="$(IFS='|' && echo "${res[*]}")")
	rc=$?
	echo "$pkg, the rest: rc $rc, $(($(date +%s) - t)) s"
	for i in "${!res[@]}"; do
		wait "${pids[i]}"
		set -- $?
		cat "$dir/$i.log"
		[ "$rc" = 0 ] && rc=$1
	done
	return "$rc"
}
# internal/app runs in a go test of its own beside the others, and the
# slim build's internal/app tests (SLIM_APP_RUN) right after it, in the
# same side run: after the full build's, never beside them (the one run
# of the two side by side had a leak test that did not settle,
# TestSessionsHeldAtOnceLeaveNothing; see the header), but no longer
# after every package's tests, where they ran alone for 33 s of make
# test's wall time beside stress-ng --cpu 1. The go test of the other
# packages runs one package fewer at a time (TEST_P - 1), so that as
# many packages run at once as before.
app_side() { # full: "split" to run internal/app as SPLIT_PKGS says, else "whole"
	local rc
	if [ "$1" = split ]; then
		split_side internal/app "$2"
	else
		"$GO" test $TRIM -parallel "$TEST_PARALLEL" -count=1 -timeout "$TEST_TIMEOUT" ./internal/app/
	fi
	rc=$?
	echo "== go test -tags slim ./internal/app/ (after the full build's)"
	"$GO" test $TRIM -parallel "$TEST_PARALLEL" -count=1 -timeout "$TEST_TIMEOUT" -tags slim -run "$SLIM_APP_RUN" ./internal/app/ || [ "$rc" != 0 ] || rc=$?
	return "$rc"
}
split=(internal/app)
app_split=
for s in $SPLIT_PKGS; do
	if [ "${s%%=*}" = internal/app ]; then
		app_split=${s#*=}
		continue
	fi
	split+=("${s%%=*}")
	side "${s%%=*}" split_side "${s%%=*}" "${s#*=}"
done
side "internal/app, then its slim build's tests" app_side "${app_split:+split}" "$app_split"
# The other packages, by import path: SLOW_PKGS first, then the rest of
# ./... (go test runs them in the order named).
mod=$("$GO" list -m)
declare -A named
for s in ${split[@]+"${split[@]}"}; do named[$mod/$s]=1; done
rest=()
for p in $(for p in $SLOW_PKGS; do echo "$mod/$p"; done) $("$GO" list ./...); do
	[ -n "${named[$p]:-}" ] && continue
	named[$p]=1
	rest+=("$p")
done
phase "go test (every package but ${split[*]})" \
	"$GO" test $TRIM -p "$((TEST_P > 1 ? TEST_P - 1 : 1))" -parallel "$TEST_PARALLEL" -count=1 -timeout "$TEST_TIMEOUT" "${rest[@]}"
wait_side "internal/app, then its slim build's tests"
for s in "${split[@]:1}"; do wait_side "$s"; done
touch "$fuzz_stop"
wait_side lint
wait_side "go test -tags slim (Python engine, MCP)"
wait_side fuzz

echo "make test: $(($(date +%s) - start)) s after the install steps, rc $status"
exit "$status"
