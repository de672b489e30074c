//go:build k8s

package cluster

// deploy/kubernetes/lease-policy.yaml on a real API server (k8stest;
// skipped without its binaries): with the manifests' ServiceAccount,
// Role and policy, each node holds a token bound to its pod as a
// kubelet mounts it, and writes its own Lease only. Run:
//
//	go test -tags k8s -trimpath -count=1 -run TestClusterLeasePolicy ./internal/cluster/

import (
	"context"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"

	"github.com/quro-dev/quro/internal/k8stest"
)

// podToken makes pod (of the quro ServiceAccount) in namespace ns and
// returns a client config with a token of the ServiceAccount bound to
// it (a TokenRequest with the pod as its bound object: the token a
// kubelet mounts in the pod); with pod "", a token bound to nothing.
func podToken(t *testing.T, cfg *rest.Config, ns, pod string) *rest.Config {
	t.Helper()
	ctx := context.Background()
	dyn := dynamic.NewForConfigOrDie(cfg)
	spec := map[string]any{"expirationSeconds": int64(600)}
	if pod != "" {
		p := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "v1", "kind": "Pod",
			"metadata": map[string]any{"name": pod, "namespace": ns},
			"spec": map[string]any{"serviceAccountName": "quro",
				"containers": []any{map[string]any{"name": "quro", "image": "localhost/quro/quro:dev"}}},
		}}
		made, err := dyn.Resource(schema.GroupVersionResource{Version: "v1", Resource: "pods"}).Namespace(ns).Create(ctx, p, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		spec["boundObjectRef"] = map[string]any{"apiVersion": "v1", "kind": "Pod", "name": pod, "uid": string(made.GetUID())}
	}
	req := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
		"metadata": map[string]any{"name": "quro", "namespace": ns}, "spec": spec,
	}}
	got, err := dyn.Resource(schema.GroupVersionResource{Version: "v1", Resource: "serviceaccounts"}).Namespace(ns).
		Create(ctx, req, metav1.CreateOptions{}, "token")
	if err != nil {
		t.Fatalf("a token of the quro ServiceAccount bound to pod %q: %v", pod, err)
	}
	tok, _, _ := unstructured.NestedString(got.Object, "status", "token")
	if tok == "" {
		t.Fatalf("the TokenRequest for pod %q gave no token: %v", pod, got.Object["status"])
	}
	return &rest.Config{Host: cfg.Host, BearerToken: tok, TLSClientConfig: rest.TLSClientConfig{Insecure: true}}
}

func TestClusterLeasePolicy(t *testing.T) {
	if k8stest.Bin() == "" {
		t.Skip("no etcd and kube-apiserver binaries: make test-k8s builds them (or set KUBEBUILDER_ASSETS)")
	}
	cfg, _ := k8stest.APIServer(t)
	const ns = "default"
	k8stest.Apply(t, cfg, ns, "rbac.yaml")
	k8stest.Apply(t, cfg, ns, "lease-policy.yaml")
	ctx := context.Background()
	// The StatefulSet's pods are its nodes: POD_NAME is --node-name.
	cfgA, cfgC, cfgNone := podToken(t, cfg, ns, "quro-0"), podToken(t, cfg, ns, "quro-2"), podToken(t, cfg, ns, "")
	leases := func(c *rest.Config) dynamic.ResourceInterface {
		return dynamic.NewForConfigOrDie(c).Resource(LeasesGVR).Namespace(ns)
	}
	node := func(c *rest.Config, name, addr string) *Cluster {
		cl, err := New(Options{Config: c, Namespace: ns, Node: name, Address: addr})
		if err != nil {
			t.Fatal(err)
		}
		return cl
	}
	refused := func(err error) bool {
		return apierrors.IsForbidden(err) && strings.Contains(err.Error(), "writes only its own Lease")
	}

	// The policy is in force once the API server's admission has seen it
	// (its informer: no event to wait on from here): a write node c may
	// not make, dry run, until it is refused.
	probe := leaseObject(ns, "quro-0", "10.0.0.9:7071", time.Minute, Node{}, time.Now())
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(100 * time.Millisecond) {
		_, err := leases(cfgC).Create(ctx, probe, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		if refused(err) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a dry run of node quro-2 writing quro-0's Lease, a minute after the policy: %v", err)
		}
	}

	a := node(cfgA, "quro-0", "10.0.0.1:7071")
	if err := a.Heartbeat(ctx, Node{Pin: "pin-a"}); err != nil {
		t.Fatalf("node quro-0 writing its own Lease: %v", err)
	}
	if err := a.Heartbeat(ctx, Node{Sessions: 1, Pin: "pin-a"}); err != nil {
		t.Fatalf("node quro-0 renewing its own Lease: %v", err)
	}
	c := node(cfgC, "quro-2", "10.0.0.3:7071")
	if err := c.Heartbeat(ctx, Node{}); err != nil {
		t.Fatalf("node quro-2 writing its own Lease: %v", err)
	}
	before, err := leases(cfg).Get(ctx, LeasePrefix+"quro-0", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}

	t.Run("node c cannot rewrite node a's Lease", func(t *testing.T) {
		// Its address and pin in a's Lease: a's calls and moves would be
		// c's.
		cur, err := leases(cfgC).Get(ctx, LeasePrefix+"quro-0", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err) // reading the Leases is every node's
		}
		an := cur.GetAnnotations()
		an[AnnotAddress], an[AnnotPin] = "10.0.0.3:7071", "pin-c"
		cur.SetAnnotations(an)
		if _, err := leases(cfgC).Update(ctx, cur, metav1.UpdateOptions{}); !refused(err) {
			t.Fatalf("node quro-2 updating quro-0's Lease: %v", err)
		}
		// The same through the node's own code: a Cluster of c's token
		// that calls itself quro-0.
		if err := node(cfgC, "quro-0", "10.0.0.3:7071").Heartbeat(ctx, Node{Pin: "pin-c"}); !refused(err) {
			t.Fatalf("node quro-2's heartbeat as quro-0: %v", err)
		}
		after, err := leases(cfg).Get(ctx, LeasePrefix+"quro-0", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if after.GetResourceVersion() != before.GetResourceVersion() || after.GetAnnotations()[AnnotPin] != "pin-a" {
			t.Fatalf("node quro-0's Lease changed: %v", after.GetAnnotations())
		}
	})

	t.Run("node c cannot make the Lease of a node that has not started", func(t *testing.T) {
		if err := node(cfgC, "quro-1", "10.0.0.3:7071").Heartbeat(ctx, Node{}); !refused(err) {
			t.Fatalf("node quro-2 creating quro-1's Lease: %v", err)
		}
		// Nor a Lease of another name.
		other := leaseObject(ns, "x", "10.0.0.3:7071", time.Minute, Node{}, time.Now())
		other.SetName("other")
		if _, err := leases(cfgC).Create(ctx, other, metav1.CreateOptions{}); !refused(err) {
			t.Fatalf("node quro-2 creating Lease %q: %v", other.GetName(), err)
		}
	})

	t.Run("a token bound to no pod writes no Lease", func(t *testing.T) {
		if err := node(cfgNone, "quro-0", "10.0.0.9:7071").Heartbeat(ctx, Node{}); !refused(err) || !strings.Contains(err.Error(), "bound to no pod") {
			t.Fatalf("an unbound token of the quro ServiceAccount writing quro-0's Lease: %v", err)
		}
	})

	t.Run("another account is not the policy's", func(t *testing.T) {
		// The operator (the admin token) renews any Lease: the policy is
		// the nodes' alone.
		if err := node(cfg, "quro-0", "10.0.0.1:7071").Heartbeat(ctx, Node{Pin: "pin-a"}); err != nil {
			t.Fatal(err)
		}
	})
}
