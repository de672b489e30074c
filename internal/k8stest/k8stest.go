//go:build k8s

// Package k8stest starts a real Kubernetes API server (etcd and
// kube-apiserver v1.34, from the binaries make test-k8s builds) for the
// tests built with -tags k8s: cmd/quro's TestCluster* and
// internal/cluster's. It is never part of the quro binary.
package k8stest

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/yaml"
)

// Bin is the directory of etcd and kube-apiserver ("" when absent).
func Bin() string {
	dir := os.Getenv("KUBEBUILDER_ASSETS")
	if dir == "" {
		base := os.Getenv("XDG_CACHE_HOME")
		if base == "" {
			home, _ := os.UserHomeDir()
			base = filepath.Join(home, ".cache")
		}
		dir = filepath.Join(base, "quro-k8s", "v1.34.4", "bin")
	}
	for _, b := range []string{"etcd", "kube-apiserver"} {
		if _, err := os.Stat(filepath.Join(dir, b)); err != nil {
			return ""
		}
	}
	return dir
}

func FreePort(t testing.TB) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// APIServer starts etcd and kube-apiserver for the test and returns a
// client config (a static admin token) and a kubeconfig file.
func APIServer(t testing.TB) (*rest.Config, string) {
	t.Helper()
	bin := Bin()
	if bin == "" {
		t.Skip("no etcd and kube-apiserver binaries: make test-k8s builds them (or set KUBEBUILDER_ASSETS)")
	}
	dir := t.TempDir()
	start := func(name string, args ...string) {
		ctx, cancel := context.WithCancel(context.Background())
		cmd := exec.CommandContext(ctx, filepath.Join(bin, name), args...)
		logf, err := os.Create(filepath.Join(dir, name+".log"))
		if err != nil {
			t.Fatal(err)
		}
		cmd.Stdout, cmd.Stderr = logf, logf
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			cancel()
			_ = cmd.Wait()
			logf.Close()
			if t.Failed() {
				b, _ := os.ReadFile(logf.Name())
				if len(b) > 4000 {
					b = b[len(b)-4000:]
				}
				t.Logf("%s's log ends:\n%s", name, b)
			}
		})
	}
	etcdPort, peerPort, apiPort := FreePort(t), FreePort(t), FreePort(t)
	etcdURL := fmt.Sprintf("http://127.0.0.1:%d", etcdPort)
	start("etcd", "--data-dir", filepath.Join(dir, "etcd"), "--listen-client-urls", etcdURL, "--advertise-client-urls", etcdURL,
		"--listen-peer-urls", fmt.Sprintf("http://127.0.0.1:%d", peerPort), "--log-level", "warn")
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	pub, _ := x509.MarshalPKIXPublicKey(&key.PublicKey)
	os.WriteFile(filepath.Join(dir, "sa.key"), pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)}), 0o600)
	os.WriteFile(filepath.Join(dir, "sa.pub"), pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pub}), 0o600)
	var tb [16]byte
	rand.Read(tb[:])
	token := hex.EncodeToString(tb[:])
	os.WriteFile(filepath.Join(dir, "tokens.csv"), []byte(token+",admin,admin,system:masters\n"), 0o600)
	start("kube-apiserver", "--etcd-servers", etcdURL, "--bind-address", "127.0.0.1", "--advertise-address", "127.0.0.1",
		"--secure-port", fmt.Sprint(apiPort), "--cert-dir", filepath.Join(dir, "certs"),
		"--token-auth-file", filepath.Join(dir, "tokens.csv"), "--authorization-mode", "RBAC",
		"--service-account-issuer", "https://kubernetes.default.svc",
		"--service-account-key-file", filepath.Join(dir, "sa.pub"),
		"--service-account-signing-key-file", filepath.Join(dir, "sa.key"),
		"--service-cluster-ip-range", "10.0.0.0/24", "--disable-admission-plugins", "ServiceAccount")
	host := fmt.Sprintf("https://127.0.0.1:%d", apiPort)
	cfg := &rest.Config{Host: host, BearerToken: token, TLSClientConfig: rest.TLSClientConfig{Insecure: true}}
	// Ready: /readyz answers 200 (polled: the API server has no event to
	// wait on before it listens).
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}, Timeout: 5 * time.Second}
	deadline := time.Now().Add(3 * time.Minute)
	for {
		req, _ := http.NewRequest("GET", host+"/readyz", nil)
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := client.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("kube-apiserver not ready after 3 minutes: %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	kc := filepath.Join(dir, "kubeconfig")
	os.WriteFile(kc, []byte(fmt.Sprintf(`apiVersion: v1
kind: Config
clusters: [{name: t, cluster: {server: %q, insecure-skip-tls-verify: true}}]
users: [{name: t, user: {token: %q}}]
contexts: [{name: t, context: {cluster: t, user: t, namespace: default}}]
current-context: t
`, host, token)), 0o600)
	InstallCRD(t, cfg)
	return cfg, kc
}

// Manifest reads deploy/kubernetes/name, one object.
func Manifest(t testing.TB, name string) *unstructured.Unstructured {
	t.Helper()
	objs := Manifests(t, name)
	if len(objs) != 1 {
		t.Fatalf("%s holds %d objects, not one", name, len(objs))
	}
	return objs[0]
}

// Manifests reads the objects of deploy/kubernetes/name, in order.
func Manifests(t testing.TB, name string) []*unstructured.Unstructured {
	t.Helper()
	// From the test's package directory, two levels below the module's
	// (cmd/quro, internal/cluster): -trimpath leaves no path to this file.
	b, err := os.ReadFile("../../deploy/kubernetes/" + name)
	if err != nil {
		t.Fatal(err)
	}
	var objs []*unstructured.Unstructured
	for doc := range strings.SplitSeq("\n"+string(b), "\n---\n") {
		js, err := yaml.YAMLToJSON([]byte(doc))
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if string(js) == "null" {
			continue // comments only
		}
		u := &unstructured.Unstructured{}
		if err := u.UnmarshalJSON(js); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		objs = append(objs, u)
	}
	return objs
}

// kinds are the resources of the kinds Apply creates, and whether each
// is namespaced.
var kinds = map[string]struct {
	resource   string
	namespaced bool
}{
	"ServiceAccount":                   {"serviceaccounts", true},
	"Role":                             {"roles", true},
	"RoleBinding":                      {"rolebindings", true},
	"NetworkPolicy":                    {"networkpolicies", true},
	"ValidatingAdmissionPolicy":        {"validatingadmissionpolicies", false},
	"ValidatingAdmissionPolicyBinding": {"validatingadmissionpolicybindings", false},
}

// Apply creates the objects of deploy/kubernetes/name, the namespaced
// ones in namespace ns (as the kustomization's namespace does).
func Apply(t testing.TB, cfg *rest.Config, ns, name string) {
	t.Helper()
	dyn := dynamic.NewForConfigOrDie(cfg)
	for _, u := range Manifests(t, name) {
		gvk := u.GroupVersionKind()
		k, ok := kinds[gvk.Kind]
		if !ok {
			t.Fatalf("%s: k8stest.Apply knows no kind %s", name, gvk.Kind)
		}
		gvr := gvk.GroupVersion().WithResource(k.resource)
		var res dynamic.ResourceInterface = dyn.Resource(gvr)
		if k.namespaced {
			u.SetNamespace(ns)
			res = dyn.Resource(gvr).Namespace(ns)
		}
		if _, err := res.Create(context.Background(), u, metav1.CreateOptions{FieldValidation: "Strict"}); err != nil {
			t.Fatalf("%s: the API server refused %s %s: %v", name, gvk.Kind, u.GetName(), err)
		}
	}
}

// InstallCRD applies deploy/kubernetes's CRDs (crd-sessions.yaml,
// crd-tenants.yaml) and waits until each is established.
func InstallCRD(t testing.TB, cfg *rest.Config) {
	t.Helper()
	for _, file := range []string{"crd-sessions.yaml", "crd-tenants.yaml"} {
		installCRD(t, cfg, file)
	}
}

func installCRD(t testing.TB, cfg *rest.Config, file string) {
	t.Helper()
	u := Manifest(t, file)
	dyn := dynamic.NewForConfigOrDie(cfg)
	crds := dyn.Resource(schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"})
	ctx := context.Background()
	if _, err := crds.Create(ctx, u, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	w, err := crds.Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=" + u.GetName()})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	for ev := range w.ResultChan() {
		obj, ok := ev.Object.(*unstructured.Unstructured)
		if !ok {
			continue
		}
		conds, _, _ := unstructured.NestedSlice(obj.Object, "status", "conditions")
		for _, c := range conds {
			m, _ := c.(map[string]any)
			if m["type"] == "Established" && m["status"] == "True" {
				return
			}
		}
	}
	t.Fatalf("%s: the CRD's watch ended before it was established", file)
}
