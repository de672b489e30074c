#!/usr/bin/env bash
# make image: an OCI image archive of the quro binary on a Debian base, without Docker.
#   base: debootstrap (minbase + what the boxes and `quro doctor` need), made once and cached as a tarball
#         outside the repo ($QURO_IMAGE_CACHE, default ${XDG_CACHE_HOME:-$HOME/.cache}/quro-image);
#   image: umoci (an OCI layout: the base layer, then a layer with /usr/local/bin/quro), then skopeo writes
#          a docker-archive that `ctr images import` (containerd) and `skopeo copy` to a registry both take.
# Usage: build.sh BINARY OUT.tar [TAG]     (TAG default localhost/quro/quro:dev)
# Needs root (debootstrap, and umoci without --rootless keeps the base's owners), debootstrap, umoci, skopeo.
set -euo pipefail
BIN=${1:?binary}; OUT=${2:?output archive}; TAG=${3:-localhost/quro/quro:dev}
SUITE=${QURO_IMAGE_SUITE:-bookworm}; MIRROR=${QURO_IMAGE_MIRROR:-http://deb.debian.org/debian}
# What the image holds besides minbase (bash, coreutils, mount/losetup): bubblewrap (every box), btrfs-progs
# (the data directory's one shared filesystem of sessions' disks), e2fsprogs (the ext4 disk images of a data
# directory made before, or of a kernel without btrfs), ca-certificates (the egress's TLS, pip), procps (ps in terminals).
PKGS=${QURO_IMAGE_PKGS:-bubblewrap,btrfs-progs,e2fsprogs,ca-certificates,procps}
C=${QURO_IMAGE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/quro-image}; mkdir -p "$C"
KEY=$(printf '%s %s %s' "$SUITE" "$MIRROR" "$PKGS" | sha256sum | cut -c1-12)
BASE=$C/base-$SUITE-$KEY.tar
if [ ! -s "$BASE" ]; then
  exec 9>"$C/base.lock"; flock 9
  if [ ! -s "$BASE" ]; then
    t=$(mktemp -d "$C/base.XXXXXX"); trap 'rm -rf "$t"' EXIT
    debootstrap --variant=minbase --include="$PKGS" "$SUITE" "$t/root" "$MIRROR" >"$C/debootstrap.log" 2>&1 ||
      { tail -20 "$C/debootstrap.log" >&2; exit 1; }
    # No apt lists or caches, no docs in the image.
    rm -rf "$t/root"/var/lib/apt/lists/* "$t/root"/var/cache/apt/* "$t/root"/usr/share/doc/* "$t/root"/usr/share/man/*
    tar -C "$t/root" --numeric-owner -cf "$BASE.tmp" . && mv "$BASE.tmp" "$BASE"
    rm -rf "$t"; trap - EXIT
  fi
  flock -u 9
fi
w=$(mktemp -d); trap 'rm -rf "$w"' EXIT
umoci init --layout "$w/oci"
umoci new --image "$w/oci:quro"
umoci unpack --image "$w/oci:quro" "$w/b" >/dev/null
tar -C "$w/b/rootfs" --numeric-owner -xf "$BASE"
umoci repack --image "$w/oci:quro" "$w/b" >/dev/null; rm -rf "$w/b"
umoci unpack --image "$w/oci:quro" "$w/b" >/dev/null
install -D -m 0755 "$BIN" "$w/b/rootfs/usr/local/bin/quro"
umoci repack --image "$w/oci:quro" "$w/b" >/dev/null; rm -rf "$w/b"
umoci config --image "$w/oci:quro" --config.entrypoint /usr/local/bin/quro --config.cmd serve \
  --config.env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin --config.env QURO_DATA=/var/lib/quro \
  --config.env QURO_PYTHON_CACHE=off \
  --config.workingdir / --config.exposedports 7070/tcp --config.label org.opencontainers.image.source=https://github.com/quro-dev/quro
mkdir -p "$(dirname "$OUT")"; rm -f "$OUT"
skopeo copy -q "oci:$w/oci:quro" "docker-archive:$OUT:$TAG"
echo "$OUT ($TAG)"
