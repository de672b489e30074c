#!/usr/bin/env bash
# Runs every fuzz target of the parsers that read bytes a box or a tenant
# controls. `go test` alone runs only their seed corpora; this explores
# past them. A failing input is written under the package's testdata/fuzz/
# by Go, so it becomes a seed of every later `go test`.
#
# Two ways to bound it:
#   - make fuzz: one round, each target for FUZZTIME (a minute; a count
#     of inputs such as 20000x works too);
#   - make test: FUZZ_UNTIL names a file that test/run.sh creates when
#     every package's tests have ended. Rounds of FUZZTIME inputs (2,000
#     each) go on, each package's targets in turn, until that file
#     exists, and the run ends with the target it is on. The run is
#     started at nice 10 beside the tests: it uses the CPU they leave
#     idle (they mostly wait on boxes, apt and pip) and mostly gives way
#     when they need it, so it adds no wall time to make test past the
#     target it is on when they end. On an idle machine it fuzzes for as
#     long as the tests run (two rounds and more); with one core taken
#     (CI, or stress-ng --cpu 1 beside it) a round may not end before the
#     tests do, so each run starts at the package after the last one the
#     previous run fuzzed (FUZZ_STATE, a file under the user's cache
#     directory): over successive runs every target is fuzzed in turn,
#     and the run says which it reached.
set -euo pipefail
cd "$(dirname "$0")/../.."
time=${FUZZTIME:-20000x}
# Targets whose inputs take milliseconds each (marked :slow: a screen
# model, an SVG renderer) or run code in a box (marked :box) go by a count
# of inputs instead: a time limit that ends while an input is still
# running is reported by go test as "context deadline exceeded", a failure
# of the harness rather than of the code.
slow=${FUZZCOUNT_SLOW:-300x}
# How a package's binary is instrumented for coverage guidance. go test
# -fuzz compiles every package the binary holds with the instrumentation
# (-d=libfuzzer), this module's included: after a change to a low-level
# package (internal/sandbox) the instrumented build of a package that
# imports the server compiled the server again, its own variant that no
# test shares (26 s of CPU for internal/api/insession). So:
#   - a package whose targets are all :box is fuzzed with its plain test
#     binary (go test -c): Go fuzzes it without coverage guidance (it
#     says so), mutating the seeds and the inputs its cache holds, and
#     still finds, minimizes and writes a failing input to testdata/fuzz/.
#     Its inputs are requests to a real App, each running code in a box
#     (milliseconds to seconds): a round is a few dozen of them, too few
#     for guidance to grow a corpus, and instrumenting the whole App makes
#     each slower;
#   - a package marked :own (after its path) has only its own code
#     instrumented (-gcflags=PKG=-d=libfuzzer): its targets' parser is its
#     own code, and the rest of its binary is the server;
#   - any other package as go test -fuzz builds it (third-party parsers,
#     such as the terminal's emulator and the SVG renderer, are guided too).
# The uninstrumented packages are compiled as go test compiles them, so
# make test's own go test shares them through the build cache: only the
# package under test and the link are new. FUZZ_FULL_COVER=1 instruments
# every binary as go test -fuzz does (a long make fuzz).
full_cover=${FUZZ_FULL_COVER:-}
until_file=${FUZZ_UNTIL:-}
# Where a make test run (FUZZ_UNTIL) says which package the next run
# starts at: a line number of the list below.
state=${FUZZ_STATE:-${XDG_CACHE_HOME:-$HOME/.cache}/quro/fuzz-next}
# FUZZ_ONLY, a regular expression (bash's), runs only the targets whose
# names it matches.
only=${FUZZ_ONLY:-}
# go test's -timeout also bounds a fuzz run (the seed corpus and then the
# fuzzing, in one test binary); its default, 10 minutes, is not something
# to rely on by accident on a loaded machine, so each run says its limit:
# generous beside 20,000 inputs (seconds to a minute) or make fuzz's
# minute, short of hanging CI.
timeout=${FUZZ_TIMEOUT:-15m}
go=${GO:-go}
# -trimpath, as make build, vet and make test's go test compile: without it
# Go's build cache keys every package of this module by the clone's
# directory, so a fresh clone (CI's) compiled each package's fuzzing
# variant anew on every run; with it, a later clone reuses them.
trim=${TRIM--trimpath} # make test passes its TRIM (set empty, none)
# Each package's test binary is built once, instrumented for fuzzing (what
# go test -fuzz builds), and run for each of its targets as go test would
# run it: in the package's directory (a failing input goes to its
# testdata/fuzz/), with Go's fuzz cache under GOCACHE. go test -fuzz per
# target built and linked the same binary again for each of a package's
# targets: 28 builds, now 17.
cache=$("$go" env GOCACHE)
# The run's directory: the test binaries, and tmp/, the temporary
# directory of every target's processes (their TMPDIR), which holds their
# f.TempDir and t.TempDir: the data directories of the Apps some targets
# make. The embedded Python those share stays where every test finds it
# ($QURO_TEST_PYTHON, else <tmp>/quro-test-python: internal/engine/python/
# pythontest), so the run does not extract it again.
run=$(mktemp -d "${TMPDIR:-/tmp}/quro-fuzz.XXXXXX")
bin=$run
tmp=$run/tmp
mkdir "$tmp"
export QURO_TEST_PYTHON=${QURO_TEST_PYTHON:-${TMPDIR:-/tmp}/quro-test-python}
child= # the target being run (see fuzz_one)
cleanup() {
	if [ -n "$child" ]; then
		kill -KILL "$child" 2>/dev/null # unshare: its --kill-child takes the target with it
		wait "$child" 2>/dev/null || true # its status is the kill's: not a reason for set -e to stop here
	fi
	release
	rm -rf "$run"
}
trap cleanup EXIT
trap 'exit 143' TERM
trap 'exit 130' INT
log=$bin/log
fail=0
# Each line: a package (:own: see full_cover), then its fuzz targets
# (:slow, :box: see slow). The order is the first round's: small packages
# whose instrumented builds take seconds first, then the large builds,
# and last the packages fuzzed with their plain test binaries (:box),
# which make test's go test has compiled by then (two go commands that
# compile the same package at once each compile it).
list=$(
	cat <<'LIST'
./internal/sandbox/boxinit FuzzParseEnv FuzzBoxMsg
./internal/sandbox/socktable FuzzParseTCPTable
./internal/hostpath FuzzNames
./internal/engine/js/calc FuzzEval
./internal/egress FuzzSNI FuzzParseRule FuzzDNSQuery
./internal/rootfs FuzzParsePackages
./internal/runcode FuzzCapture
./internal/render FuzzJSON FuzzXML
./internal/textedit FuzzEdit
./internal/boxfs FuzzReply FuzzFrames FuzzRoute
./internal/transpile FuzzReply
./internal/picture FuzzSVGToPNG:slow FuzzSniff
./internal/terminal FuzzStatusRecord FuzzStateStream FuzzVTModel:slow FuzzEscFilter
./internal/engine/python:own FuzzReadFrame
./cmd/quro:own FuzzAptInstallRequest
./internal/api/insession FuzzInSessionRequest:box
./internal/api/e2b FuzzE2BConnect:box FuzzE2BExecute:box
LIST
)

# Go starts a fuzz target's workers (os.Args[0] again, with
# -test.fuzzworker first) with their stdout and stderr on /dev/null: a
# worker that died of a panic outside the fuzz function's goroutine, of a
# fatal error or of -test.timeout left only "fuzzing process hung or
# terminated unexpectedly: exit status 2", without its stack. So each
# package's binary is run through a wrapper that Go also starts for its
# workers (exec -a keeps the wrapper as os.Args[0]): a worker's stderr
# goes to $workers, shown when the target fails.
workers=$bin/workers
# wrap pkgbin: makes pkgbin the wrapper of pkgbin.bin.
wrap() {
	mv "$1" "$1.bin"
	cat >"$1" <<EOF
#!/usr/bin/env bash
if [ "\${1-}" = -test.fuzzworker ]; then
	exec -a "\$0" "$1.bin" "\$@" 2>>"$workers"
fi
exec -a "\$0" "$1.bin" "\$@"
EOF
	chmod +x "$1"
}

# leftovers prints what the run's processes left mounted: mounts of this
# mount namespace under the run's directory, and loop devices whose
# backing file is in it (a loop device is the machine's, whichever
# namespace mounted it). Nothing when all is well.
leftovers() {
	local f b
	awk -v d="$run/" 'index($5, d) == 1 { print "mount", $5 }' /proc/self/mountinfo
	for f in /sys/block/loop*/loop/backing_file; do
		[ -r "$f" ] || continue
		b=$(cat "$f" 2>/dev/null) || continue
		case $b in "$run"/*)
			f=${f#/sys/block/}
			echo "loop /dev/${f%%/*} $b"
			;;
		esac
	done
}

# release unmounts and detaches what leftovers lists.
release() {
	local what p rest
	leftovers | sort -r -k2 | while read -r what p rest; do
		case $what in
		mount) umount -l "$p" 2>/dev/null || true ;;
		loop) losetup -d "$p" 2>/dev/null || true ;;
		esac
	done
}

# fuzz_one pkgbin pkg target limit
#
# The target runs in a mount and a pid namespace of its own (unshare):
# Go stops a fuzz worker without running its f.Cleanup (it closes the
# worker's pipe, then sends SIGINT and SIGKILL a second apart), so an App
# a worker made leaves its mounts, and the loop devices under them, unless
# they die with it. When the target's process (the namespace's first) has
# ended, the kernel has killed every other process of the namespace, its
# workers and their boxes, and the mounts they held are gone; loop devices
# attached with autoclear (internal/quota) detach with their last mount.
# What is left all the same is reported and fails the run.
fuzz_one() {
	local pkgbin=$1 pkg=$2 t=$3 limit=$4 importpath t0 rc left
	importpath=$("$go" list "$pkg")
	t0=$(date +%s)
	: >"$workers"
	(cd "$pkg" && exec env TMPDIR="$tmp" "${ns[@]}" \
		"$pkgbin" -test.paniconexit0 -test.run '^$' -test.fuzz "^$t\$" -test.fuzztime "$limit" \
		-test.timeout "$timeout" -test.parallel 2 -test.fuzzcachedir "$cache/fuzz/$importpath") >"$log" 2>&1 &
	child=$!
	rc=0
	wait "$child" || rc=$?
	child=
	if [ "$rc" != 0 ]; then
		cat "$log"
		if [ -s "$workers" ]; then
			echo "fuzz $pkg $t: its workers' stderr (the last 200 lines):"
			tail -n 200 "$workers"
		fi
		fail=1
	fi
	left=$(leftovers)
	if [ -n "$left" ]; then
		echo "fuzz $pkg $t: left mounted after its processes ended:"
		echo "$left"
		release
		fail=1
	fi
	rm -rf --one-file-system "${tmp:?}"/* # its data directories (a killed worker's too), never across a mount left there
	echo "fuzz $pkg $t ($limit): $(($(date +%s) - t0)) s"
}

# ns is how a target is started in namespaces of its own (fuzz_one): a
# user who is not root (make test run by a sudo user) cannot make a mount
# namespace without a user namespace, which would change what the
# targets' Apps can do; its targets run in the run's namespaces, and the
# leftovers check after each still releases and reports what they left.
ns=(unshare --mount --propagation private --pid --fork --kill-child --mount-proc)
if ! "${ns[@]}" true 2>/dev/null; then
	echo "fuzz: targets run without namespaces of their own (unshare refused: not root?)"
	ns=()
fi

# Every fuzz target of the tree is in the list: a target added to a
# package's tests and not here would only ever run its seeds.
missing=$(
	grep -r --include='*_test.go' -o '^func Fuzz[A-Za-z0-9_]*(' ./internal ./cmd |
		sed -E 's#^(.*)/[^/]*_test\.go:func (Fuzz[A-Za-z0-9_]*)\($#\1 \2#' | sort -u |
		while read -r dir t; do
			grep -Eq "^$dir(:own)? (.* )?$t(:slow|:box)?( |\$)" <<<"$list" || echo "  $dir $t"
		done
)
if [ -n "$missing" ]; then
	echo "fuzz: targets missing from test/fuzz/run.sh's list:"
	echo "$missing"
	exit 1
fi

stopped() { [ -n "$until_file" ] && [ -e "$until_file" ]; }

# The list's lines, from the package a make test run starts at (see
# state) to the end, then from the top: a round is the whole list.
mapfile -t lines < <(grep . <<<"$list")
start=0
if [ -n "$until_file" ] && [ -z "$only" ]; then
	read -r start 2>/dev/null <"$state" || start=0
	[[ $start =~ ^[0-9]+$ ]] && [ "$start" -lt "${#lines[@]}" ] || start=0
	echo "fuzz: starting at ${lines[start]%% *} (the package after the last one the previous run fuzzed)"
fi
# next records the package line after the one being fuzzed, for the next
# make test run.
next() {
	[ -n "$until_file" ] && [ -z "$only" ] || return 0
	mkdir -p "${state%/*}" && echo $((($1 + 1) % ${#lines[@]})) >"$state"
}
fuzzed=0
round=1
while :; do
	for ((i = 0; i < ${#lines[@]}; i++)); do
		li=$(((start + i) % ${#lines[@]}))
		read -r pkg targets <<<"${lines[li]}"
		n=$((li + 1))
		own=
		case $pkg in *:own)
			pkg=${pkg%:own}
			own=1
			;;
		esac
		if [ -n "$only" ]; then
			mine=
			for t in $targets; do
				[[ ${t%:*} =~ $only ]] && mine+=" $t"
			done
			targets=$mine
			[ -z "$targets" ] && continue
		fi
		pkgbin=$bin/$n.test
		if [ ! -x "$pkgbin" ]; then
			first=${targets# }
			first=${first%% *}
			first=${first%:*}
			all_box=1
			for t in $targets; do
				[[ $t == *:box ]] || all_box=
			done
			cover=(-fuzz "^$first\$") # see full_cover
			kind=
			if [ -z "$full_cover" ] && [ -n "$all_box" ]; then
				cover=()
				kind=" (plain test binary)"
			elif [ -z "$full_cover" ] && [ -n "$own" ]; then
				cover=(-gcflags="$("$go" list "$pkg")=-d=libfuzzer")
				kind=" (its own code instrumented)"
			fi
			t0=$(date +%s)
			if ! "$go" test $trim -c "${cover[@]}" -o "$pkgbin" "$pkg" >"$log" 2>&1; then
				cat "$log"
				fail=1
				continue
			fi
			wrap "$pkgbin"
			echo "build $pkg$kind: $(($(date +%s) - t0)) s"
		fi
		for t in $targets; do
			# Stop at the next target once the tests have ended.
			if stopped; then
				break 3
			fi
			limit=$time
			case $t in *:slow | *:box)
				t=${t%:*}
				limit=$slow
				;;
			esac
			fuzz_one "$pkgbin" "$pkg" "$t" "$limit"
			fuzzed=$((fuzzed + 1))
		done
		next "$li"
	done
	if [ -z "$until_file" ] || stopped || [ "$fail" != 0 ]; then
		break
	fi
	round=$((round + 1))
	echo "round $round"
done
echo "fuzz: $fuzzed target runs in $round round(s) of ${#lines[@]} packages"
exit $fail
