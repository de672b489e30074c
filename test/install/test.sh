#!/usr/bin/env bash
# Tests the Makefile's package step (`make test-deps`) the way a fresh
# machine runs it, without touching this machine's packages: stand-ins for
# apt-get, dpkg and sudo on PATH record what they were asked, and the step
# runs once as root and once as an unprivileged user who has sudo.
#
# Why: CI runs on a machine where the packages are usually there already,
# so a broken install command (once: `$SUDO DEBIAN_FRONTEND=… apt-get` with
# SUDO empty ran the assignment as a command) stays green there and fails on
# every fresh machine. This runs the real snippet every time.
#
# Then `make install` (PREFIX, DESTDIR, without go on PATH), the
# installed quro answering an MCP client started as the README says, and
# docs/deploy.md's systemd unit.
set -euo pipefail
cd "$(dirname "$0")/../.."
repo=$PWD
make=$(command -v make)
go=${GO:-go}

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
chmod 755 "$work"
fake="$work/bin"
mkdir -p "$fake"
log="$work/calls.log"
: >"$log"
chmod 666 "$log"

# dpkg: no package is installed.
printf '#!/bin/sh\nexit 1\n' >"$fake/dpkg"
# apt-get: record the call, its uid and the DEBIAN_FRONTEND apt would see.
cat >"$fake/apt-get" <<EOF
#!/bin/sh
echo "apt-get uid=\$(id -u) DEBIAN_FRONTEND=\${DEBIAN_FRONTEND:-} \$*" >>"$log"
if [ "\$(id -u)" != 0 ]; then echo "apt-get: not root" >&2; exit 100; fi
EOF
# sudo: a setuid-root program that records the call and runs it as root
# with sudo's environment reset (test/install/fakesudo).
"$go" build -o "$work/fakesudo" ./test/install/fakesudo
cat >"$fake/sudo" <<EOF
#!/bin/sh
exec "$work/sudo-suid" "$log" "\$@"
EOF
chmod 755 "$fake"/*

fail=0
check() { # name want...
	local name=$1
	shift
	for want in "$@"; do
		if ! grep -qxF -- "$want" "$log"; then
			echo "FAIL $name: want the line: $want"
			echo "--- calls:"
			cat "$log"
			fail=1
			return
		fi
	done
	echo "ok   $name"
}

pkgs="quro-fake-a quro-fake-b"

# As root: apt-get directly, DEBIAN_FRONTEND in its environment.
: >"$log"
env -u DEBIAN_FRONTEND PATH="$fake:$PATH" "$make" -s --no-print-directory -C "$repo" test-deps TEST_PKGS="$pkgs" >"$work/out" 2>&1 ||
	{ echo "FAIL root: make test-deps failed"; cat "$work/out"; fail=1; }
check root "apt-get uid=0 DEBIAN_FRONTEND= update -qq" \
	"apt-get uid=0 DEBIAN_FRONTEND=noninteractive install -y -qq quro-fake-a quro-fake-b"
if grep -q '^sudo' "$log"; then echo "FAIL root: used sudo as root"; fail=1; fi

# As a sudo user: every apt-get goes through sudo and runs as root. The
# stand-in sudo is setuid root, so this part needs the test to start as root.
if [ "$(id -u)" = 0 ]; then
	: >"$log"
	install -o root -g root -m 4755 "$work/fakesudo" "$work/sudo-suid"
	setpriv --reuid=65534 --regid=65534 --clear-groups env -u DEBIAN_FRONTEND HOME="$work" PATH="$fake:$PATH" \
		"$make" -s --no-print-directory -C "$repo" test-deps TEST_PKGS="$pkgs" >"$work/out" 2>&1 ||
		{ echo "FAIL sudo user: make test-deps failed"; cat "$work/out"; fail=1; }
	check "sudo user" "sudo apt-get update -qq" \
		"sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq quro-fake-a quro-fake-b" \
		"apt-get uid=0 DEBIAN_FRONTEND=noninteractive install -y -qq quro-fake-a quro-fake-b"
else
	echo "skip sudo user: the stand-in sudo is setuid root, so the test must start as root"
fi

# Nothing missing: no apt-get at all.
printf '#!/bin/sh\nexit 0\n' >"$fake/dpkg"
: >"$log"
PATH="$fake:$PATH" "$make" -s --no-print-directory -C "$repo" test-deps TEST_PKGS="$pkgs" >/dev/null 2>&1 || fail=1
if [ -s "$log" ]; then
	echo "FAIL installed: apt-get ran though nothing was missing"
	cat "$log"
	fail=1
else
	echo "ok   installed"
fi

# make install: bin/quro at $(PREFIX)/bin/quro, so that the README's MCP
# client config ({"command": "quro", "args": ["mcp"]}) starts it from PATH.
prefix="$work/prefix"
if "$make" -s --no-print-directory -C "$repo" install PREFIX="$prefix" >"$work/out" 2>&1 &&
	[ -x "$prefix/bin/quro" ]; then
	echo "ok   install PREFIX"
else
	echo "FAIL install PREFIX: no executable $prefix/bin/quro"
	cat "$work/out"
	fail=1
fi
# An MCP client as the README configures it: "quro" found on PATH, JSON-RPC
# over its stdin and stdout, answered one message at a time.
if [ -x "$prefix/bin/quro" ]; then
	coproc MCP { PATH="$prefix/bin:/usr/bin:/bin" QURO_DATA="$work/data" timeout 120 quro mcp 2>"$work/mcp.err"; }
	echo '{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-03-26","capabilities":{},"clientInfo":{"name":"install-test","version":"1"}}}' >&"${MCP[1]}"
	read -r init <&"${MCP[0]}" || init=
	echo '{"jsonrpc":"2.0","method":"notifications/initialized"}' >&"${MCP[1]}"
	echo '{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"run_code","arguments":{"lang":"sh","code":"echo mcp-$((6*7))"}}}' >&"${MCP[1]}"
	read -r call <&"${MCP[0]}" || call=
	exec {MCP[1]}>&-
	wait "$MCP_PID" || true
	if [[ $init == *'"serverInfo":{"name":"quro"'* && $call == *'"text":"mcp-42'* ]]; then
		echo "ok   installed quro answers MCP on stdio"
	else
		echo "FAIL installed quro over MCP stdio"
		echo "initialize: $init"
		echo "run_code: $call"
		cat "$work/mcp.err"
		fail=1
	fi
fi
# DESTDIR stages the install under another root (packaging), and without
# go on PATH (sudo's PATH) the bin/quro built above is installed as is.
dest="$work/dest"
if env PATH="/usr/bin:/bin" "$make" -s --no-print-directory -C "$repo" install DESTDIR="$dest" PREFIX=/opt/quro GO=quro-no-go >"$work/out" 2>&1 &&
	cmp -s "$repo/bin/quro" "$dest/opt/quro/bin/quro" && [ ! -e /opt/quro/bin/quro ] &&
	"$make" -s --no-print-directory -C "$repo" uninstall DESTDIR="$dest" PREFIX=/opt/quro >>"$work/out" 2>&1 &&
	[ ! -e "$dest/opt/quro/bin/quro" ]; then
	echo "ok   install DESTDIR, without go; uninstall"
else
	echo "FAIL install DESTDIR=$dest PREFIX=/opt/quro without go"
	cat "$work/out"
	fail=1
fi

# docs/deploy.md's systemd unit, as written there (its ExecStart pointed
# at the quro installed above): systemd-analyze verify exits 0 even on an
# unknown key or a bad value, so any word from it is a failure.
if command -v systemd-analyze >/dev/null && [ -x "$prefix/bin/quro" ]; then
	awk '/^```ini$/{f=1;next} /^```$/{f=0} f' docs/deploy.md | sed "s#/usr/local/bin/quro#$prefix/bin/quro#" >"$work/quro.service"
	if grep -q '^ExecStart=' "$work/quro.service" && systemd-analyze verify "$work/quro.service" >"$work/out" 2>&1 && [ ! -s "$work/out" ]; then
		echo "ok   docs/deploy.md unit passes systemd-analyze verify"
	else
		echo "FAIL docs/deploy.md unit:"
		cat "$work/out" "$work/quro.service"
		fail=1
	fi
else
	echo "skip docs/deploy.md unit: no systemd-analyze"
fi

[ "$fail" = 0 ] || exit 1
