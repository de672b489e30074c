//go:build k8s

package main

// A tenant's ceilings are the cluster's, on nodes against a real API
// server (the harness of cluster_k8s_test.go): set through one node, they
// are a tenants.quro.dev object, applied by the other node (its creates
// refused at the tenant's session ceiling, 429 naming it) and by a node
// that starts afterwards on a volume of its own; quro tenant limits
// in-process on a node's data directory refuses, naming the cluster. Run:
//
//	go test -tags k8s -trimpath -count=1 -run TestClusterTenantLimits ./cmd/quro/

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"

	"github.com/quro-dev/quro/internal/app"
	"github.com/quro-dev/quro/internal/cluster"
)

func TestClusterTenantLimits(t *testing.T) {
	cfg, kc := apiServer(t)
	acme, admin := quroToken(), quroToken()
	tokens := filepath.Join(t.TempDir(), "tokens")
	if err := os.WriteFile(tokens, []byte(acme+" acme exec\n"+admin+" - admin\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	dyn := dynamic.NewForConfigOrDie(cfg)
	a := startNode(t, "node-a", kc, tokens)
	waitLeases(t, dyn, 1)
	tenants := dyn.Resource(cluster.TenantsGVR).Namespace("default")
	limits := func(t *testing.T, n *node) app.TenantLimitsInfo {
		t.Helper()
		r := do(t, "POST", n.url+"/v1/get_tenant_limits", "application/json", `{"tenant":"acme"}`, "Authorization", "Bearer "+admin, "Accept", "application/json")
		var out app.TenantLimitsInfo
		if r.status != http.StatusOK || json.Unmarshal([]byte(r.body), &out) != nil {
			t.Fatalf("get_tenant_limits through %s: %d %s", n.name, r.status, r.body)
		}
		return out
	}
	create := func(t *testing.T, n *node, name string) httpResult {
		t.Helper()
		return do(t, "POST", n.url+"/v1/sessions", "application/json", fmt.Sprintf(`{"name":%q}`, name), "Authorization", "Bearer "+acme)
	}

	// Two sessions of acme's, made before node b starts: its table holds
	// their records from its start (a node serves once its informers have
	// listed), so its count of acme's sessions is not a race with its
	// informer (a create in the moment between another's answer and its
	// record reaching the node's table sees the older count: docs/security.md).
	for i := range 2 {
		if r := create(t, a, fmt.Sprintf("t%d", i)); r.status != http.StatusCreated {
			t.Fatalf("create %d through node a: %d %s", i, r.status, r.body)
		}
	}
	b := startNode(t, "node-b", kc, tokens)
	waitLeases(t, dyn, 2)

	// Set through node a: stored in the cluster, not in node a's store.
	r := do(t, "POST", a.url+"/v1/set_tenant_limits", "application/json",
		`{"tenant":"acme","sessions":2,"memory_bytes":1073741824,"network_max":"none"}`, "Authorization", "Bearer "+admin)
	if r.status != http.StatusOK {
		t.Fatalf("set_tenant_limits through node a: %d %s", r.status, r.body)
	}
	if l := limits(t, a); l.Own.Sessions != 2 || l.Effective.Sessions != 2 {
		t.Fatalf("node a's answer right after its set: %+v", l)
	}
	u, err := tenants.Get(context.Background(), cluster.TenantObjectName("acme"), metav1.GetOptions{})
	if err != nil {
		t.Fatalf("acme's ceilings are not in the cluster: %v", err)
	}
	if tenant, _, _ := unstructured.NestedString(u.Object, "spec", "tenant"); tenant != "acme" {
		t.Fatalf("the Tenant object names %q", tenant)
	}
	if s, _, _ := unstructured.NestedInt64(u.Object, "spec", "limits", "sessions"); s != 2 {
		t.Fatalf("the Tenant object's sessions: %d (%v)", s, u.Object["spec"])
	}

	t.Run("quro tenant limits in-process on a node's data directory refuses, naming the cluster", func(t *testing.T) {
		t.Setenv("QURO_URL", "")
		t.Setenv("QURO_TOKEN", "")
		for _, args := range [][]string{{"set", "--sessions", "5"}, {"show"}} {
			_, errs, code := quro(t, "", append([]string{"--data", a.data, "tenant", "limits"}, append(args, "--tenant", "acme")...)...)
			if code == 0 || !strings.Contains(errs, "tenants.quro.dev objects (namespace default)") || !strings.Contains(errs, "--server") {
				t.Fatalf("quro tenant limits %s in-process on node a's data directory: exit %d: %s", args[0], code, errs)
			}
		}
		if l := limits(t, a); l.Own.Sessions != 2 {
			t.Fatalf("after a refused in-process set: %+v", l)
		}
	})

	t.Run("the other node applies them", func(t *testing.T) {
		// Node b's informer brings them a moment later.
		deadline := time.Now().Add(time.Minute)
		for limits(t, b).Effective.Sessions != 2 {
			if time.Now().After(deadline) {
				t.Fatalf("node b still answers %+v a minute after node a's set", limits(t, b))
			}
			time.Sleep(50 * time.Millisecond) // polled: node b's answer is the event
		}
		if l := limits(t, b); l.Own.Memory != 1<<30 || l.Own.NetworkMax != "none" || l.Effective.NetworkMax != "none" {
			t.Fatalf("node b: %+v", l)
		}
		if r := create(t, b, "over"); r.status != http.StatusTooManyRequests || !strings.Contains(r.body, "its limit is 2") {
			t.Fatalf("a third session through node b: %d %s (want 429 naming the ceiling of 2)", r.status, r.body)
		}
	})

	t.Run("a node that starts on a new volume has them at once", func(t *testing.T) {
		c := startNode(t, "node-c", kc, tokens)
		if l := limits(t, c); l.Own.Sessions != 2 || l.Own.Memory != 1<<30 {
			t.Fatalf("node c, started after the set: %+v", l)
		}
	})

	t.Run("the CRD refuses a ceiling too small", func(t *testing.T) {
		bad := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": cluster.Group + "/" + cluster.Version, "kind": "Tenant",
			"metadata": map[string]any{"name": cluster.TenantObjectName("bob")},
			"spec":     map[string]any{"tenant": "bob", "limits": map[string]any{"memory_bytes": int64(1000)}},
		}}
		if _, err := tenants.Create(context.Background(), bad, metav1.CreateOptions{}); !apierrors.IsInvalid(err) {
			t.Fatalf("a Tenant with a memory ceiling of 1000 bytes: %v (want Invalid)", err)
		}
		r := do(t, "POST", b.url+"/v1/set_tenant_limits", "application/json", `{"tenant":"acme","memory_bytes":1000}`, "Authorization", "Bearer "+admin)
		if r.status != http.StatusBadRequest {
			t.Fatalf("set_tenant_limits with 1000 bytes of memory: %d %s", r.status, r.body)
		}
		if l := limits(t, b); l.Own.Memory != 1<<30 {
			t.Fatalf("a refused set changed acme's ceilings: %+v", l)
		}
	})

	t.Run("an object under another tenant's name is refused, not applied", func(t *testing.T) {
		// Written straight to the API server (not by a node): the object
		// named for tenant bob says it is carol's.
		forged := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": cluster.Group + "/" + cluster.Version, "kind": "Tenant",
			"metadata": map[string]any{"name": cluster.TenantObjectName("bob")},
			"spec":     map[string]any{"tenant": "carol", "limits": map[string]any{"sessions": int64(-1)}},
		}}
		if _, err := tenants.Create(context.Background(), forged, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(time.Minute)
		for {
			r := do(t, "POST", a.url+"/v1/get_tenant_limits", "application/json", `{"tenant":"bob"}`, "Authorization", "Bearer "+admin)
			if strings.Contains(r.body, `names tenant \"carol\"`) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("bob's ceilings with an object that names carol: %d %s", r.status, r.body)
			}
			time.Sleep(50 * time.Millisecond) // polled: node a's answer is the event
		}
	})
}
