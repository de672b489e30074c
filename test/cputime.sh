#!/usr/bin/env bash
# The CPU seconds of the tests, per package or per test: the numbers
# behind docs/RATIONALE.md's "What make test's tests cost in CPU". With
# one core free (make test beside stress-ng --cpu 1) make test's wall
# time is at least the CPU it spends, so its tests are measured in CPU,
# not wall time (wall time at a load of 30 says mostly what else ran).
#
#   test/cputime.sh ./internal/app/ ./cmd/quro/        one line a package
#   PER_TEST=1 test/cputime.sh ./cmd/quro/              one line a test
#   RUN='^TestE2B' PER_TEST=1 test/cputime.sh ./cmd/quro/
#
# Each package's test binary is built first (go test -c, with the flags
# make test uses; its build is not counted), then run in its package's
# directory (as go test does) inside a cpuacct cgroup of its own: the
# boxes, servers and interpreters a test starts are made under the
# process's own cgroup (internal/sandbox/cgroup.go), and a v1 cpuacct
# cgroup counts its descendants' CPU, gone ones included, so the figure
# is the test's and everything it started. PER_TEST=1 runs each top-level
# test (the binary's -test.list, filtered by RUN) alone in a cgroup of
# its own: one process each, so each line also holds the package's
# set-up (TestMain, package-level initialisation) once. Output, one tab-
# separated line each, sorted by CPU: CPU seconds, wall seconds, exit
# status, package, test ("-" for the whole package).
#
# PER_TEST=share runs each package once, as go test does (its parallel
# tests side by side), and shares its CPU out among its tests: the
# cgroup's counter is read at each event of the test stream (a test or
# subtest started, paused, continued or ended), and the CPU spent
# between two events is divided evenly among the tests then running
# (those paused, or waiting on parallel subtests, take none). A figure
# is then an estimate (a test beside a busier one is given part of its
# CPU), but the package runs once, with its set-up paid once: for
# internal/app, 15 minutes instead of the two hours of its 237 tests
# alone. Its lines: CPU share, go test's elapsed seconds, pass/fail/skip,
# package, test; "(between tests)" is the set-up and what ran while no
# test did, and the package's own line (test "-") its total. Needs root and the
# cgroup v1 cpuacct hierarchy (this project's CI hosts have it); the
# host's load does not change the CPU figures much, but say it when
# quoting them (uptime is printed first).
set -uo pipefail
cd "$(dirname "$0")/.."

: "${GO:=go}" "${TRIM:=-trimpath}" "${TEST_PARALLEL:=4}" "${TEST_TIMEOUT:=30m}"
: "${PER_TEST:=}" "${RUN:=.}" "${TAGS:=}"
acct=/sys/fs/cgroup/cpuacct
[ -w "$acct" ] || {
	echo "cputime: $acct is not a writable cgroup v1 cpuacct hierarchy" >&2
	exit 2
}
[ $# -gt 0 ] || set -- ./...
mapfile -t pkgs < <("$GO" list ${TAGS:+-tags "$TAGS"} -f '{{if or .TestGoFiles .XTestGoFiles}}{{.ImportPath}} {{.Dir}}{{end}}' "$@")
work=$(mktemp -d)
cg=$acct/quro-cputime-$$
trap 'rmdir "$cg"/* "$cg" 2>/dev/null; rm -rf "$work"' EXIT
mkdir "$cg" || exit 2
echo "# $(uptime)" >&2

# measure name dir bin args... runs bin in dir inside a new cgroup and
# prints "cpu wall rc".
measure() {
	local name=$1 dir=$2 g=$cg/$1 t0 t1 rc
	shift 2
	mkdir "$g" || return 1
	t0=$(date +%s.%N)
	(
		echo "$BASHPID" >"$g/cgroup.procs" || exit 125
		cd "$dir" && exec "$@"
	) >"$work/$name.out" 2>&1
	rc=$?
	t1=$(date +%s.%N)
	# The cgroup is empty when its last process has gone; a process a test
	# left behind is that test's bug, and is counted until it ends.
	while [ -s "$g/cgroup.procs" ]; do sleep 1; done
	awk -v u="$(cat "$g/cpuacct.usage")" -v t0="$t0" -v t1="$t1" -v rc="$rc" \
		'BEGIN { printf "%.1f\t%.1f\t%d\n", u / 1e9, t1 - t0, rc }'
	find "$g" -mindepth 1 -depth -type d -exec rmdir {} + 2>/dev/null
	rmdir "$g"
	[ "$rc" = 0 ] || tail -n 30 "$work/$name.out" >&2
}

# share name dir bin args... runs bin in dir inside a new cgroup, as
# measure does, with the test stream on, and prints one line a top-level
# test (its share of the CPU) and one for the whole run (PER_TEST=share).
share() {
	local name=$1 dir=$2 pkg=$3 g=$cg/$1 t0 t1
	shift 3
	mkdir "$g" || return 1
	t0=$(date +%s.%N)
	(
		echo "$BASHPID" >"$g/cgroup.procs" || exit 125
		cd "$dir" && "$@" -test.v=test2json
		echo $? >"$work/$name.rc"
	) 2>&1 | "$GO" tool test2json -t | {
		# Each event, with the counter as it reads when the event arrives;
		# the output lines are not events.
		while IFS= read -r line; do
			case $line in *'"Action":"output"'*) continue ;; esac
			read -r u <"$g/cpuacct.usage"
			printf '%s %s\n' "$u" "$line"
		done
		while [ -s "$g/cgroup.procs" ]; do sleep 1; done
		read -r u <"$g/cpuacct.usage"
		printf '%s {"Action":"end"}\n' "$u"
	} | awk -v pkg="$pkg" -f test/cputime-share.awk
	t1=$(date +%s.%N)
	awk -v u="$(cat "$g/cpuacct.usage")" -v t0="$t0" -v t1="$t1" -v rc="$(cat "$work/$name.rc" 2>/dev/null)" -v pkg="$pkg" \
		'BEGIN { printf "%.1f\t%.1f\t%s\t%s\t-\n", u / 1e9, t1 - t0, rc, pkg }'
	find "$g" -mindepth 1 -depth -type d -exec rmdir {} + 2>/dev/null
	rmdir "$g"
}

n=0
for line in "${pkgs[@]}"; do
	pkg=${line%% *} dir=${line#* }
	bin=$work/$n.test
	n=$((n + 1))
	"$GO" test $TRIM ${TAGS:+-tags "$TAGS"} -c -o "$bin" "$pkg" >&2 || {
		printf '-\t-\tbuild\t%s\t-\n' "$pkg"
		continue
	}
	args=(-test.count=1 -test.parallel="$TEST_PARALLEL" -test.timeout="$TEST_TIMEOUT")
	if [ "$PER_TEST" = share ]; then
		share "s$n" "$dir" "$pkg" "$bin" "${args[@]}" -test.run="$RUN"
		continue
	fi
	if [ -z "$PER_TEST" ]; then
		printf '%s\t%s\t-\n' "$(measure "p$n" "$dir" "$bin" "${args[@]}" -test.run="$RUN")" "$pkg"
		continue
	fi
	mapfile -t tests < <(cd "$dir" && "$bin" -test.list "$RUN" | grep -E '^(Test|Example|Fuzz)')
	for t in "${tests[@]}"; do
		printf '%s\t%s\t%s\n' "$(measure "t$n-$t" "$dir" "$bin" "${args[@]}" -test.run="^$t\$")" "$pkg" "$t"
	done
done | sort -t$'\t' -k1,1 -g -r
