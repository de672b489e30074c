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

[ "$fail" = 0 ] || exit 1
