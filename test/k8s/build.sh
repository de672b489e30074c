#!/usr/bin/env bash
# Builds etcd and the Kubernetes binaries from source (Go module proxy only) into a cache outside the repo,
# once: $K8S_DIR/bin/{etcd,kube-apiserver,kube-controller-manager,kube-scheduler,kubelet,kubectl,pause}.
# etcd and kube-apiserver come first (envtest needs only those two). Each binary is skipped when present.
# Adapted from a reference recipe: the staging modules are pinned by `replace` to v0.<minor>.<patch>.
set -euo pipefail
V=${K8S_VERSION:-1.34.4}
D=${K8S_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/quro-k8s/v$V}
B=$D/bin W=$D/build
mkdir -p "$B" "$W/pause"
have_all=1
for b in etcd kube-apiserver kube-controller-manager kube-scheduler kubelet kubectl pause; do [ -x "$B/$b" ] || have_all=0; done
[ $have_all = 1 ] && exit 0
exec 9>"$D/build.lock"; flock 9   # one build at a time
cd "$W"
if [ ! -f go.sum ]; then
  go mod download -json "k8s.io/kubernetes@v$V" >/dev/null
  KM=$(go env GOMODCACHE)/cache/download/k8s.io/kubernetes/@v/v$V.mod
  { printf 'module quro.local/k8sbuild\n\ngo 1.24.0\n\nrequire k8s.io/kubernetes v%s\n\nreplace (\n' "$V"
    sed -n '/^replace (/,/^)/p' "$KM" | awk -v v="0.${V#1.}" '/=>/{print "\t"$1" => "$1" v"v}'; echo ')'; } > go.mod
  { printf '//go:build tools\n\npackage tools\n\nimport (\n\t_ "go.etcd.io/etcd/server/v3"\n'
    for c in kube-apiserver kube-controller-manager kube-scheduler kubelet kubectl; do printf '\t_ "k8s.io/kubernetes/cmd/%s"\n' $c; done
    echo ')'; } > tools.go
  cat > pause/main.go <<'GO'
package main

import (
	"os"
	"os/signal"
	"syscall"
)

// pause: the pod sandbox's init; reaps children and exits on INT/TERM.
func main() {
	c := make(chan os.Signal, 8)
	signal.Notify(c, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for s := range c {
		if s != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			p, _ := syscall.Wait4(-1, nil, syscall.WNOHANG, nil)
			if p <= 0 {
				break
			}
		}
	}
}
GO
  go mod tidy
fi
m=${V#*.}; LD="-s -w"
for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  LD="$LD -X $p.gitVersion=v$V -X $p.gitMajor=1 -X $p.gitMinor=${m%%.*} -X $p.gitTreeState=clean"; done
export CGO_ENABLED=0
[ -x "$B/etcd" ] || { go build -trimpath -ldflags "-s -w" -o "$B/etcd.tmp" go.etcd.io/etcd/server/v3 && mv -f "$B/etcd.tmp" "$B/etcd"; }   # etcd first
for c in kube-apiserver kube-controller-manager kube-scheduler kubelet kubectl; do
  [ -x "$B/$c" ] || { go build -trimpath -ldflags "$LD" -o "$B/$c.tmp" "k8s.io/kubernetes/cmd/$c" && mv -f "$B/$c.tmp" "$B/$c"; }
done
[ -x "$B/pause" ] || go build -trimpath -ldflags "-s -w" -o "$B/pause" ./pause
for b in etcd kube-apiserver kube-controller-manager kube-scheduler kubelet kubectl pause; do [ -x "$B/$b" ] || { echo "build.sh: $b missing" >&2; exit 1; }; done
