#!/usr/bin/env bash
# A real single-node Kubernetes on this machine for `make test-k8s`, from the Go module proxy and Debian only:
# etcd + kube-apiserver/controller-manager/scheduler/kubelet built from source once (test/k8s/build.sh, cached
# under ${XDG_CACHE_HOME:-$HOME/.cache}/quro-k8s/v$K8S_VERSION), containerd + runc + bridge CNI from Debian,
# images imported without a registry (pods use imagePullPolicy: Never). No kube-proxy, no CoreDNS: pods are
# reached by their IPs from this host; ClusterIP services do not route. Needs root.
#   cluster.sh up              start (builds first when the binaries are missing); prints the kubeconfig
#   cluster.sh load ARCHIVE    import an image archive (docker-archive or OCI) into containerd's k8s.io namespace
#   cluster.sh tag SRC DST     give an imported image another name (a new tag for a rolling upgrade)
#   cluster.sh down            stop everything, unmount, delete the bridge, restore iptables and ip_forward
#   cluster.sh can-run         exit 0 when this machine can run a kubelet here, else print why and exit 1
# State of a running cluster is in $K8S_DIR/run (etcd data, logs, containerd); `down` then `up` starts afresh.
set -euo pipefail
V=${K8S_VERSION:-1.34.4}
D=${K8S_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/quro-k8s/v$V}
B=$D/bin R=$D/run P=$D/pki I=$D/img SOCK=$D/run/containerd.sock
HERE=$(cd "$(dirname "$0")" && pwd)
export KUBECONFIG=$D/admin.kubeconfig PATH=$B:$PATH
bg(){ local n=$1; shift; nohup "$@" >"$R/$n.log" 2>&1 & echo $! >"$R/$n.pid"; }
stop(){ local p; p=$(cat "$R/$1.pid" 2>/dev/null) || return 0; kill "$p" 2>/dev/null || true
  for _ in $(seq 20); do kill -0 "$p" 2>/dev/null || break; sleep 0.5; done; kill -9 "$p" 2>/dev/null || true; rm -f "$R/$1.pid"; }
wait_for(){ for _ in $(seq "${2:-120}"); do bash -c "$1" >/dev/null 2>&1 && return 0; sleep 1; done; echo "TIMEOUT: $1" >&2; return 1; }
# Pod traffic never leaves the machine: the bridge needs ip_forward, these rules stop forwarding off the bridge.
FWD=(FORWARD -i quro0 ! -o quro0 -j DROP); FWD2=(FORWARD -o quro0 ! -i quro0 -j DROP)
# Pods reach the API server as in any cluster, at the kubernetes Service (10.0.0.1:443, what in-cluster configs
# dial): with no kube-proxy, this one rule sends it to the API server on the host, by the bridge's address.
APISVC=(PREROUTING -i quro0 -d 10.0.0.1/32 -p tcp --dport 443 -j DNAT --to-destination 10.244.0.1:6443)
PKGS="containerd runc containernetworking-plugins iptables conntrack umoci skopeo openssl"

can_run(){
  [ "$(id -u)" = 0 ] || { echo "needs root (a kubelet, containerd and a bridge network)"; return 1; }
  [ -d /sys/fs/cgroup ] && [ -n "$(ls /sys/fs/cgroup 2>/dev/null)" ] || { echo "no cgroup filesystem at /sys/fs/cgroup"; return 1; }
  [ -e /proc/sys/net/ipv4/ip_forward ] && [ -w /proc/sys/net/ipv4/ip_forward ] || { echo "/proc/sys/net/ipv4/ip_forward is not writable (a container without network admin?)"; return 1; }
  ip link add quro-probe0 type bridge 2>/dev/null && ip link del quro-probe0 || { echo "cannot create a network bridge (no CAP_NET_ADMIN or no bridge module)"; return 1; }
  command -v go >/dev/null || { echo "go is not on PATH (the Kubernetes binaries are built from source)"; return 1; }
  return 0
}

case "${1:-up}" in
can-run) can_run; exit ;;
load)
  A=${2:?archive}; ctr -a "$SOCK" -n k8s.io images import "$A" >/dev/null
  exit ;;
tag)
  ctr -a "$SOCK" -n k8s.io images tag --force "${2:?source}" "${3:?target}" >/dev/null
  exit ;;
down)
  if [ -f "$R/apiserver.pid" ]; then
    kubectl delete pods -A --all --grace-period=0 --force --wait=false >/dev/null 2>&1 || true   # the kubelet tears down containers and CNI
    wait_for "! ctr -a $SOCK -n k8s.io t ls | grep -q RUNNING" 30 || true
  fi
  for n in kubelet scheduler kcm apiserver etcd; do stop $n; done
  # Tasks the kubelet left: kill them before containerd goes.
  for t in $(ctr -a "$SOCK" -n k8s.io t ls -q 2>/dev/null); do ctr -a "$SOCK" -n k8s.io t kill -s KILL "$t" >/dev/null 2>&1 || true; ctr -a "$SOCK" -n k8s.io t rm -f "$t" >/dev/null 2>&1 || true; done
  stop containerd
  grep -o " $D/[^ ]*" /proc/mounts | sort -r | xargs -r -n1 umount -l 2>/dev/null || true
  grep -o " /run/containerd/[^ ]*\| /run/netns/cni-[^ ]*" /proc/mounts | sort -r | xargs -r -n1 umount -l 2>/dev/null || true
  # The sessions' disk images the nodes attached (files on the test's volumes under $D), the pods'
  # network namespaces, and the cgroups the kubelet made: nothing of a run is left for the next.
  losetup -l -n -O NAME,BACK-FILE 2>/dev/null | awk -v d="$D/" 'index($2, d) == 1 {print $1}' | xargs -r -n1 losetup -d 2>/dev/null || true
  for n in /run/netns/cni-*; do [ -e "$n" ] && { ip netns del "${n##*/}" 2>/dev/null || rm -f "$n"; }; done
  for c in /sys/fs/cgroup/kubepods /sys/fs/cgroup/kubepods.slice; do [ -d "$c" ] && find "$c" -depth -type d -exec rmdir {} + 2>/dev/null; done
  ip link del quro0 2>/dev/null || true
  iptables -D "${FWD[@]}" 2>/dev/null || true; iptables -D "${FWD2[@]}" 2>/dev/null || true; iptables -t nat -D "${APISVC[@]}" 2>/dev/null || true
  [ -f "$R/ip_forward" ] && cat "$R/ip_forward" > /proc/sys/net/ipv4/ip_forward
  rm -rf "$R"
  exit 0 ;;
up) ;;
*) echo "usage: $0 up|load ARCHIVE|tag SRC DST|down|can-run" >&2; exit 2 ;;
esac

why=$(can_run) || { echo "cannot run a kubelet here: $why" >&2; exit 3; }
dpkg -s $PKGS >/dev/null 2>&1 || { apt-get update -qq; DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $PKGS >/dev/null; }
"$HERE/build.sh"
[ ! -f "$R/apiserver.pid" ] || "$0" down   # a cluster left by an interrupted run
mkdir -p "$R" "$P"
# PKI, static tokens, kubeconfigs (made once; the CA and tokens stay in the cache).
( cd "$P"; [ -f sa.key ] || { openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 3650 -subj /CN=quro-test-ca
  openssl req -newkey rsa:2048 -nodes -keyout api.key -out api.csr -subj /CN=kube-apiserver
  printf 'subjectAltName=IP:127.0.0.1,IP:10.0.0.1,DNS:localhost,DNS:kubernetes.default.svc\nextendedKeyUsage=serverAuth\n' > ext
  openssl x509 -req -in api.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 3650 -extfile ext -out api.crt
  openssl genrsa -out sa.key 2048; openssl rsa -in sa.key -pubout -out sa.pub
  echo "$(openssl rand -hex 16),admin,admin,system:masters" > tokens.csv; echo "$(openssl rand -hex 16),system:node:localhost,kubelet,system:nodes" >> tokens.csv
  chmod 0600 ./*.key tokens.csv; } >/dev/null 2>&1 )
kc(){ printf 'apiVersion: v1\nkind: Config\nclusters: [{name: l, cluster: {server: "https://127.0.0.1:6443", certificate-authority: %s}}]\nusers: [{name: u, user: {token: %s}}]\ncontexts: [{name: l, context: {cluster: l, user: u}}]\ncurrent-context: l\n' "$P/ca.crt" "$(sed -n "$1p" "$P/tokens.csv" | cut -d, -f1)" > "$2"; chmod 0600 "$2"; }
kc 1 "$KUBECONFIG"; kc 2 "$D/kubelet.kubeconfig"
# Control plane.
bg etcd etcd --data-dir "$R/etcd" --listen-client-urls http://127.0.0.1:2379 --advertise-client-urls http://127.0.0.1:2379 --listen-peer-urls http://127.0.0.1:2380 --log-level warn
bg apiserver kube-apiserver --etcd-servers http://127.0.0.1:2379 --bind-address 0.0.0.0 --advertise-address 127.0.0.1 --secure-port 6443 \
  --tls-cert-file "$P/api.crt" --tls-private-key-file "$P/api.key" --client-ca-file "$P/ca.crt" --token-auth-file "$P/tokens.csv" --authorization-mode Node,RBAC \
  --service-account-issuer https://kubernetes.default.svc --service-account-key-file "$P/sa.pub" --service-account-signing-key-file "$P/sa.key" \
  --service-cluster-ip-range 10.0.0.0/24 --allow-privileged --cert-dir "$R/apiserver-certs"
wait_for "kubectl get --raw /readyz"
bg kcm kube-controller-manager --kubeconfig "$KUBECONFIG" --leader-elect=false --bind-address 127.0.0.1 --service-account-private-key-file "$P/sa.key" --root-ca-file "$P/ca.crt"
bg scheduler kube-scheduler --kubeconfig "$KUBECONFIG" --leader-elect=false --bind-address 127.0.0.1
# Node: containerd (restrict_oom_score_adj: a VM without CAP_SYS_RESOURCE), bridge CNI, kubelet (cgroupfs).
mkdir -p "$R/cni"; cat /proc/sys/net/ipv4/ip_forward > "$R/ip_forward"
iptables -C "${FWD[@]}" 2>/dev/null || iptables -I "${FWD[@]}"; iptables -C "${FWD2[@]}" 2>/dev/null || iptables -I "${FWD2[@]}"
iptables -t nat -C "${APISVC[@]}" 2>/dev/null || iptables -t nat -I "${APISVC[@]}"
printf '{"cniVersion":"0.4.0","name":"quro","plugins":[{"type":"bridge","bridge":"quro0","isGateway":true,"isDefaultGateway":true,"ipMasq":false,"ipam":{"type":"host-local","ranges":[[{"subnet":"10.244.0.0/24"}]],"dataDir":"%s/ipam"}},{"type":"loopback"}]}\n' "$R" > "$R/cni/10-quro.conflist"
printf 'version = 2\nroot = "%s/containerd"\nstate = "%s/containerd-state"\n[grpc]\n  address = "%s"\n[plugins."io.containerd.grpc.v1.cri"]\n  sandbox_image = "registry.k8s.io/pause:3.10"\n  restrict_oom_score_adj = true\n  disable_apparmor = true\n  [plugins."io.containerd.grpc.v1.cri".cni]\n    bin_dir = "/usr/lib/cni"\n    conf_dir = "%s/cni"\n' "$R" "$R" "$SOCK" "$R" > "$R/containerd.toml"
bg containerd containerd --config "$R/containerd.toml"; wait_for "ctr -a $SOCK version" 30
# The sandbox's pause image, from the pause binary built beside the others.
if [ ! -s "$I/pause.tar" ]; then rm -rf "$I"; mkdir -p "$I"
  umoci init --layout "$I/oci"; umoci new --image "$I/oci:pause"; umoci unpack --rootless --image "$I/oci:pause" "$I/u" >/dev/null
  cp "$B/pause" "$I/u/rootfs/pause"; umoci repack --image "$I/oci:pause" "$I/u" >/dev/null; rm -rf "$I/u"
  umoci config --image "$I/oci:pause" --config.entrypoint /pause; skopeo copy -q "oci:$I/oci:pause" "docker-archive:$I/pause.tar:registry.k8s.io/pause:3.10"; fi
ctr -a "$SOCK" -n k8s.io images import "$I/pause.tar" >/dev/null
printf 'apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nauthentication: {anonymous: {enabled: true}, webhook: {enabled: false}}\nauthorization: {mode: AlwaysAllow}\ncgroupDriver: cgroupfs\ncontainerRuntimeEndpoint: unix://%s\naddress: 127.0.0.1\nhealthzBindAddress: 127.0.0.1\nreadOnlyPort: 0\nfailSwapOn: false\npodLogsDir: %s/pod-logs\nevictionHard: {memory.available: 100Mi, nodefs.available: 1%%, imagefs.available: 1%%, nodefs.inodesFree: 1%%}\nimageGCHighThresholdPercent: 100\nimageGCLowThresholdPercent: 99\n' "$SOCK" "$R" > "$R/kubelet.yaml"
# Hostname localhost: the apiserver reaches the kubelet (logs, exec) on 127.0.0.1.
bg kubelet kubelet --kubeconfig "$D/kubelet.kubeconfig" --config "$R/kubelet.yaml" --root-dir "$R/kubelet" --hostname-override localhost
wait_for "kubectl get node localhost | grep -q ' Ready'" 120; wait_for "kubectl get sa default" 60
echo "READY: export KUBECONFIG=$KUBECONFIG PATH=$B:\$PATH"
