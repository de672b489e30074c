//go:build k8s

package cluster

// The tenants' ceilings (tenants.quro.dev) on a real API server
// (k8stest; skipped without its binaries): two nodes, each with a token
// of the manifests' ServiceAccount bound to its pod, write one tenant's
// ceilings at once; each write lands whole (optimistic concurrency), each
// node's table then holds the last, and a node's token may not delete
// or patch them. Run:
//
//	go test -tags k8s -trimpath -count=1 -run TestClusterTenantLimits ./internal/cluster/

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"

	"github.com/quro-dev/quro/internal/k8stest"
)

func TestClusterTenantLimitsConcurrentWriters(t *testing.T) {
	if k8stest.Bin() == "" {
		t.Skip("no etcd and kube-apiserver binaries: make test-k8s builds them (or set KUBEBUILDER_ASSETS)")
	}
	cfg, _ := k8stest.APIServer(t)
	const ns = "default"
	k8stest.Apply(t, cfg, ns, "rbac.yaml")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var nodes []*Cluster
	for i, pod := range []string{"quro-0", "quro-1"} {
		c, err := New(Options{Config: podToken(t, cfg, ns, pod), Namespace: ns, Node: pod, Address: fmt.Sprintf("10.0.0.%d:7071", i+1)})
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Start(ctx, time.Minute); err != nil {
			t.Fatalf("%s with its pod's token: %v", pod, err)
		}
		nodes = append(nodes, c)
	}

	// Each node writes acme's ceilings five times, both at once: every
	// write lands (a conflict is read again and retried), none lost half.
	var wg sync.WaitGroup
	errs := make(chan error, 10)
	for i, c := range nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range 5 {
				raw := fmt.Sprintf(`{"sessions":%d,"tasks":%d}`, 10*(i+1)+j, 100*(i+1)+j)
				errs <- c.SetTenantLimits(ctx, "acme", raw)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatalf("a concurrent write: %v", err)
		}
	}
	// What both tables hold is one write whole: sessions and tasks of the
	// same write, the API server's last.
	res := dynamic.NewForConfigOrDie(cfg).Resource(TenantsGVR).Namespace(ns)
	u, err := res.Get(ctx, TenantObjectName("acme"), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range nodes {
		if err := c.waitTenant(ctx, u.GetName(), u.GetResourceVersion()); err != nil {
			t.Fatal(err)
		}
		raw, ok, err := c.TenantLimits(ctx, "acme")
		var l struct{ Sessions, Tasks int64 }
		if err != nil || !ok || json.Unmarshal([]byte(raw), &l) != nil {
			t.Fatalf("%s's table: %q %v %v", c.Self(), raw, ok, err)
		}
		if l.Tasks != l.Sessions/10*100+l.Sessions%10 {
			t.Fatalf("%s holds %s: not one write whole", c.Self(), raw)
		}
		if s, _, _ := unstructured.NestedInt64(u.Object, "spec", "limits", "sessions"); s != l.Sessions {
			t.Fatalf("%s holds %s, the API server sessions %d", c.Self(), raw, s)
		}
	}
	if _, ok, err := nodes[0].TenantLimits(ctx, "bob"); ok || err != nil {
		t.Fatalf("a tenant never set: %v %v", ok, err)
	}

	// The Role gives no delete and no patch: a node cannot remove a
	// tenant's ceilings, only set them whole.
	own := dynamic.NewForConfigOrDie(podToken(t, cfg, ns, "quro-2")).Resource(TenantsGVR).Namespace(ns)
	if err := own.Delete(ctx, u.GetName(), metav1.DeleteOptions{}); !apierrors.IsForbidden(err) {
		t.Fatalf("a node's delete of a Tenant: %v (want Forbidden)", err)
	}
	if _, err := own.Patch(ctx, u.GetName(), types.MergePatchType, []byte(`{"spec":{"limits":{"sessions":-1}}}`), metav1.PatchOptions{}); !apierrors.IsForbidden(err) {
		t.Fatalf("a node's patch of a Tenant: %v (want Forbidden)", err)
	}
}
