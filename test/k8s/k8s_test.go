//go:build k8s

// Package k8s_test deploys Quro on a real single-node Kubernetes (make
// test-k8s): test/k8s/cluster.sh brings the cluster up from binaries built
// from source and cached outside the repo, deploy/image/build.sh makes the
// image, which is imported into the node's containerd, and
// deploy/kubernetes is applied as an operator would. The checks then talk
// to each pod by its IP (the cluster has no kube-proxy: pod IPs route from
// this host, Service addresses do not).
package k8s_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

const (
	ns       = "quro"
	image    = "localhost/quro/quro"
	dataDir  = "/var/lib/quro"
	waitLong = "900s" // kubectl's own waits: generous, a loaded 2-core machine
)

// cluster is the running cluster and the repository it deploys from.
type cluster struct {
	root, dir, kubeconfig string
	bin                   string // the directory of kubectl and the others
}

// kubectl runs kubectl against the cluster and returns its stdout.
func (c *cluster) kubectl(t *testing.T, stdin string, args ...string) string {
	t.Helper()
	out, err := c.kubectlErr(stdin, args...)
	if err != nil {
		t.Fatalf("kubectl %s: %v", strings.Join(args, " "), err)
	}
	return out
}

func (c *cluster) kubectlErr(stdin string, args ...string) (string, error) {
	cmd := exec.Command(filepath.Join(c.bin, "kubectl"), args...)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+c.kubeconfig)
	cmd.Stdin = strings.NewReader(stdin)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return out.String(), fmt.Errorf("%w: %s", err, strings.TrimSpace(errb.String()))
	}
	return out.String(), nil
}

// script runs one of the repository's shell scripts, its output in the
// test log.
func (c *cluster) script(t *testing.T, path string, args ...string) {
	t.Helper()
	cmd := exec.Command("bash", append([]string{filepath.Join(c.root, path)}, args...)...)
	cmd.Env = append(os.Environ(), "K8S_DIR="+c.dir)
	out, err := cmd.CombinedOutput()
	t.Logf("%s %s:\n%s", path, strings.Join(args, " "), bytes.TrimSpace(out))
	if err != nil {
		t.Fatalf("%s %s: %v", path, strings.Join(args, " "), err)
	}
}

// node is one Quro pod and a client to it: its IP and the admin token its
// first start wrote to its data volume.
type node struct {
	name, ip, token, uid string
}

// call posts a capability to the node's REST API and decodes its answer
// into out; a non-2xx answer is an error with its body.
func (n node) call(capability string, in, out any) error {
	body, err := json.Marshal(in)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, n.url("/v1/"+capability), bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+n.token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("%s on %s: %s: %s", capability, n.name, resp.Status, b)
	}
	if out == nil {
		return nil
	}
	return json.Unmarshal(b, out)
}

func (n node) url(path string) string { return "http://" + n.ip + ":7070" + path }

// pod reads a Ready pod's IP and UID and its admin token.
func (c *cluster) pod(t *testing.T, name string) node {
	t.Helper()
	c.kubectl(t, "", "-n", ns, "wait", "--for=condition=Ready", "pod/"+name, "--timeout="+waitLong)
	f := strings.Fields(c.kubectl(t, "", "-n", ns, "get", "pod", name, "-o", "jsonpath={.status.podIP} {.metadata.uid}"))
	if len(f) != 2 {
		t.Fatalf("pod %s: no IP and UID: %q", name, f)
	}
	tok := strings.TrimSpace(c.kubectl(t, "", "-n", ns, "exec", name, "--", "cat", dataDir+"/admin.token"))
	if tok == "" {
		t.Fatalf("pod %s: empty admin token", name)
	}
	return node{name: name, ip: f[0], uid: f[1], token: tok}
}

// runResult is the part of run_code's answer the checks read.
type runResult struct {
	Stdout   string `json:"stdout"`
	Stderr   string `json:"stderr"`
	ExitCode int    `json:"exit_code"`
	Session  string `json:"session"`
}

func (n node) run(t *testing.T, session, lang, code string) runResult {
	t.Helper()
	var r runResult
	if err := n.call("run_code", map[string]any{"session": session, "lang": lang, "code": code, "timeout_ms": -1}, &r); err != nil {
		t.Fatal(err)
	}
	if r.ExitCode != 0 {
		t.Fatalf("run_code on %s in %s: exit %d, stderr %q", n.name, session, r.ExitCode, r.Stderr)
	}
	return r
}

func (n node) readFile(t *testing.T, session, path string) string {
	t.Helper()
	var r struct {
		Content string `json:"content"`
	}
	if err := n.call("read_file", map[string]any{"session": session, "path": path}, &r); err != nil {
		t.Fatal(err)
	}
	return r.Content
}

// pv is a hostPath PersistentVolume without a storage class: this cluster
// has no provisioner, so each node's claim binds to one of these, as it
// would to a provisioned volume.
func pv(i int, dir string) string {
	return fmt.Sprintf(`apiVersion: v1
kind: PersistentVolume
metadata:
  name: quro-test-pv-%d
spec:
  capacity: {storage: 10Gi}
  accessModes: [ReadWriteOnce]
  persistentVolumeReclaimPolicy: Retain
  hostPath: {path: %s/pv-%d, type: DirectoryOrCreate}
---
`, i, dir, i)
}

// TestKubernetes brings up the cluster, deploys 3 Quro nodes and checks
// each node serves, a pod's sessions come back with their files after the
// pod is deleted, and a 4th replica serves too. Its subtests share the one
// cluster, in order.
func TestKubernetes(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	cache := os.Getenv("XDG_CACHE_HOME")
	if cache == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			t.Fatal(err)
		}
		cache = filepath.Join(home, ".cache")
	}
	dir := os.Getenv("K8S_DIR")
	if dir == "" {
		dir = filepath.Join(cache, "quro-k8s", "v1.34.4")
	}
	if out, err := exec.Command("bash", filepath.Join(root, "test/k8s/cluster.sh"), "can-run").CombinedOutput(); err != nil {
		t.Skipf("this machine cannot run a kubelet: %s", bytes.TrimSpace(out))
	}
	c := &cluster{root: root, dir: dir, kubeconfig: filepath.Join(dir, "admin.kubeconfig"), bin: filepath.Join(dir, "bin")}
	t.Cleanup(func() {
		if os.Getenv("QURO_K8S_KEEP") != "" {
			t.Logf("QURO_K8S_KEEP: the cluster stays up; KUBECONFIG=%s; test/k8s/cluster.sh down stops it", c.kubeconfig)
			return
		}
		if t.Failed() {
			for _, args := range [][]string{{"-n", ns, "get", "pods,pvc", "-o", "wide"}, {"-n", ns, "describe", "pods"}, {"-n", ns, "logs", "--tail=40", "-l", "app.kubernetes.io/name=quro", "--prefix"}} {
				out, err := c.kubectlErr("", args...)
				t.Logf("kubectl %s: %v\n%s", strings.Join(args, " "), err, out)
			}
		}
		cmd := exec.Command("bash", filepath.Join(root, "test/k8s/cluster.sh"), "down")
		cmd.Env = append(os.Environ(), "K8S_DIR="+dir)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("cluster.sh down: %v\n%s", err, out)
		}
	})
	c.script(t, "test/k8s/cluster.sh", "up")

	// The image: of QURO_BIN (make test-k8s builds bin/quro), or built here.
	bin := os.Getenv("QURO_BIN")
	if bin == "" {
		bin = filepath.Join(t.TempDir(), "quro")
		build := exec.Command("go", "build", "-trimpath", "-o", bin, "./cmd/quro")
		build.Dir = root
		if out, err := build.CombinedOutput(); err != nil {
			t.Fatalf("go build: %v\n%s", err, out)
		}
	}
	archive := filepath.Join(t.TempDir(), "quro-image.tar")
	c.script(t, "deploy/image/build.sh", bin, archive, image+":dev")
	c.script(t, "test/k8s/cluster.sh", "load", archive)

	var pvs strings.Builder
	for i := range 5 {
		pvs.WriteString(pv(i, filepath.Join(dir, "run", "pv")))
	}
	c.kubectl(t, pvs.String(), "apply", "-f", "-")
	c.kubectl(t, "", "apply", "-k", filepath.Join(root, "deploy/kubernetes"))
	c.kubectl(t, "", "-n", ns, "rollout", "status", "statefulset/quro", "--timeout="+waitLong)

	nodes := map[string]node{}
	for i := range 3 {
		name := fmt.Sprintf("quro-%d", i)
		nodes[name] = c.pod(t, name)
	}

	t.Run("Doctor", func(t *testing.T) {
		for _, n := range nodes {
			checkDoctor(t, c, n.name)
		}
	})

	// Two sessions on each node, a file in each.
	sessions := map[string][]string{}
	t.Run("Sessions", func(t *testing.T) {
		for name, n := range nodes {
			for j := range 2 {
				s := fmt.Sprintf("k8s-%s-%d", name, j)
				if err := n.call("create_session", map[string]any{"name": s}, nil); err != nil {
					t.Fatal(err)
				}
				if r := n.run(t, s, "python", "print(6*7)"); strings.TrimSpace(r.Stdout) != "42" {
					t.Fatalf("%s on %s: python printed %q", s, name, r.Stdout)
				}
				n.run(t, s, "sh", "mkdir -p keep && echo "+s+" > keep/id.txt && hostname")
				sessions[name] = append(sessions[name], s)
			}
		}
	})

	// A pod deleted is made again by the StatefulSet with its volume: its
	// sessions are there, revive on use and have their files.
	t.Run("PodRestartKeepsSessions", func(t *testing.T) {
		old := nodes["quro-1"]
		c.kubectl(t, "", "-n", ns, "delete", "pod", "quro-1", "--wait=true", "--timeout="+waitLong)
		// delete --wait returned once the old pod was gone; the StatefulSet
		// makes the new one (kubectl waits for it to exist, then be Ready).
		c.kubectl(t, "", "-n", ns, "wait", "--for=create", "pod/quro-1", "--timeout="+waitLong)
		n := c.pod(t, "quro-1")
		if n.uid == old.uid {
			t.Fatalf("quro-1 is still the pod deleted (uid %s)", n.uid)
		}
		if n.token != old.token {
			t.Errorf("the admin token changed across the restart: the data volume did not come back")
		}
		nodes["quro-1"] = n
		for _, s := range sessions["quro-1"] {
			if got := strings.TrimSpace(n.readFile(t, s, "keep/id.txt")); got != s {
				t.Errorf("%s after the restart: keep/id.txt is %q, want %q", s, got, s)
			}
			if r := n.run(t, s, "sh", "cat keep/id.txt"); strings.TrimSpace(r.Stdout) != s {
				t.Errorf("%s after the restart: a run read %q", s, r.Stdout)
			}
		}
	})

	t.Run("ScaleTo4", func(t *testing.T) {
		c.kubectl(t, "", "-n", ns, "scale", "statefulset/quro", "--replicas=4")
		c.kubectl(t, "", "-n", ns, "rollout", "status", "statefulset/quro", "--timeout="+waitLong)
		n := c.pod(t, "quro-3")
		nodes["quro-3"] = n
		checkDoctor(t, c, n.name)
		if err := n.call("create_session", map[string]any{"name": "k8s-quro-3-0"}, nil); err != nil {
			t.Fatal(err)
		}
		if r := n.run(t, "k8s-quro-3-0", "python", "print('fourth')"); strings.TrimSpace(r.Stdout) != "fourth" {
			t.Fatalf("quro-3: python printed %q", r.Stdout)
		}
		n.run(t, "k8s-quro-3-0", "sh", "mkdir -p keep && echo k8s-quro-3-0 > keep/id.txt")
		sessions["quro-3"] = append(sessions["quro-3"], "k8s-quro-3-0")
	})

	// A new image tag rolls the nodes one at a time; each comes back on
	// its volume with every session's files.
	t.Run("RollingUpgradeKeepsFiles", func(t *testing.T) {
		c.script(t, "test/k8s/cluster.sh", "tag", image+":dev", image+":v2")
		c.kubectl(t, "", "-n", ns, "set", "image", "statefulset/quro", "quro="+image+":v2")
		c.kubectl(t, "", "-n", ns, "rollout", "status", "statefulset/quro", "--timeout="+waitLong)
		for name, old := range nodes {
			n := c.pod(t, name)
			if n.uid == old.uid {
				t.Errorf("%s was not replaced by the upgrade", name)
			}
			if img := c.kubectl(t, "", "-n", ns, "get", "pod", name, "-o", "jsonpath={.spec.containers[0].image}"); img != image+":v2" {
				t.Errorf("%s runs %s after the upgrade", name, img)
			}
			nodes[name] = n
		}
		checkFiles(t, nodes, sessions, "after the upgrade")
	})
}

// checkFiles reads back, through each node, the file every session of
// that node wrote in Sessions.
func checkFiles(t *testing.T, nodes map[string]node, sessions map[string][]string, when string) {
	t.Helper()
	for name, list := range sessions {
		for _, s := range list {
			if got := strings.TrimSpace(nodes[name].readFile(t, s, "keep/id.txt")); got != s {
				t.Errorf("%s on %s %s: keep/id.txt is %q, want %q", s, name, when, got, s)
			}
		}
	}
}

// checkDoctor runs quro doctor in the pod: every isolation layer of a box
// (bubblewrap's namespaces, Landlock, seccomp, cgroups, a uid per session,
// rlimits) must be there and used, as on a host.
func checkDoctor(t *testing.T, c *cluster, pod string) {
	t.Helper()
	out := c.kubectl(t, "", "-n", ns, "exec", pod, "--", "quro", "doctor", "--json")
	var rep struct {
		Isolation []struct {
			Name      string `json:"name"`
			Available bool   `json:"available"`
			Used      bool   `json:"used"`
			Detail    string `json:"detail"`
		} `json:"isolation"`
	}
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("quro doctor --json in %s: %v\n%s", pod, err, out)
	}
	want := map[string]bool{"user": false, "cgroups": false, "namespaces": false, "rlimits": false, "landlock": false, "seccomp": false}
	for _, f := range rep.Isolation {
		if _, ok := want[f.Name]; !ok {
			continue
		}
		want[f.Name] = true
		if !f.Available || !f.Used {
			t.Errorf("quro doctor in %s: %s available=%v used=%v: %s", pod, f.Name, f.Available, f.Used, f.Detail)
		}
	}
	for name, seen := range want {
		if !seen {
			t.Errorf("quro doctor in %s: no %s row", pod, name)
		}
	}
}
