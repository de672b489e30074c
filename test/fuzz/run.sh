#!/usr/bin/env bash
# Runs every fuzz target of the parsers that read bytes a box or a tenant
# controls, each for FUZZTIME (default 3s; `make fuzz` gives them longer).
# `go test` alone runs only their seed corpora; this explores past them.
# A failing input is written under the package's testdata/fuzz/ by Go, so
# it becomes a seed of every later `go test`.
set -euo pipefail
cd "$(dirname "$0")/../.."
time=${FUZZTIME:-3s}
go=${GO:-go}
fail=0
# Each line: package, then its fuzz targets.
while read -r pkg targets; do
	[ -z "$pkg" ] && continue
	for t in $targets; do
		echo "fuzz $pkg $t ($time)"
		if ! "$go" test -run '^$' -fuzz "^$t\$" -fuzztime "$time" -parallel 2 "$pkg" >/tmp/quro-fuzz.$$ 2>&1; then
			cat /tmp/quro-fuzz.$$
			fail=1
		fi
	done
done <<'LIST'
./internal/sandbox/boxinit FuzzParseEnv
./internal/engine/python FuzzReadFrame
./internal/terminal FuzzStatusRecord FuzzStateStream FuzzVTModel
./internal/api/insession FuzzInSessionRequest
./cmd/quro FuzzAptInstallRequest
./internal/rootfs FuzzParsePackages
./internal/runcode FuzzCapture
./internal/render FuzzJSON FuzzXML
LIST
rm -f /tmp/quro-fuzz.$$
exit $fail
