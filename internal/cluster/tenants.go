package cluster

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/retry"
)

// TenantsGVR is the tenants.quro.dev resource
// (deploy/kubernetes/crd-tenants.yaml): one object per tenant whose
// ceilings the operator set, its spec.limits the JSON set_tenant_limits
// writes. Every node reads them through an informer, so that a tenant's
// ceilings are the same on every node and a node that starts on a new
// volume has them.
var TenantsGVR = schema.GroupVersionResource{Group: Group, Version: Version, Resource: "tenants"}

// TenantSyncWait bounds how long SetTenantLimits waits for this node's
// informer to bring back what it wrote (read-your-writes: the answer of
// set_tenant_limits and the next call here see it).
const TenantSyncWait = 10 * time.Second

// TenantObjectName is the name of tenant's tenants.quro.dev object: a
// tenant's name is not always an object's (capitals, underscores, the
// local tenant's ""), so the name is derived from it, and spec.tenant
// holds the tenant itself, checked on every read.
func TenantObjectName(tenant string) string {
	h := sha256.Sum256([]byte("tenant\x00" + tenant))
	return "tenant-" + hex.EncodeToString(h[:20])
}

// TenantLimits is the JSON of tenant's own ceilings as this node's
// informer holds them (app.TenantLimitsSource), ok false when the cluster
// holds none. An object whose spec names another tenant is an error: its
// tenant's runs are refused until the operator sets its ceilings again.
func (c *Cluster) TenantLimits(_ context.Context, tenant string) (string, bool, error) {
	obj, ok, err := c.tenants.GetStore().GetByKey(c.opts.Namespace + "/" + TenantObjectName(tenant))
	if err != nil {
		return "", false, fmt.Errorf("the cluster's tenants.quro.dev table: %w", err)
	}
	if !ok {
		return "", false, nil
	}
	u, isU := obj.(*unstructured.Unstructured)
	if !isU {
		return "", false, fmt.Errorf("the cluster's tenants.quro.dev object %s is a %T", TenantObjectName(tenant), obj)
	}
	if got, _, _ := unstructured.NestedString(u.Object, "spec", "tenant"); got != tenant {
		return "", false, fmt.Errorf("the cluster's tenants.quro.dev object %s names tenant %q", u.GetName(), got)
	}
	limits, _, err := unstructured.NestedMap(u.Object, "spec", "limits")
	if err != nil {
		return "", false, fmt.Errorf("the cluster's tenants.quro.dev object %s: spec.limits: %w", u.GetName(), err)
	}
	b, err := json.Marshal(limits)
	if err != nil {
		return "", false, err
	}
	return string(b), true, nil
}

// SetTenantLimits writes raw (the JSON set_tenant_limits writes) as
// tenant's own ceilings to its tenants.quro.dev object, created if need
// be, else updated at the resourceVersion read (a write between the read
// and the update is a conflict, and the write starts again from a fresh
// read), then waits until this node's informer holds it.
func (c *Cluster) SetTenantLimits(ctx context.Context, tenant, raw string) error {
	limits, err := jsonObject(raw)
	if err != nil {
		return fmt.Errorf("cluster: tenant %q's ceilings: %w", tenant, err)
	}
	name := TenantObjectName(tenant)
	res := c.dyn.Resource(TenantsGVR).Namespace(c.opts.Namespace)
	spec := map[string]any{"tenant": tenant, "limits": limits}
	var written string
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		u, err := res.Get(ctx, name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			u = &unstructured.Unstructured{Object: map[string]any{
				"apiVersion": Group + "/" + Version, "kind": "Tenant",
				"metadata": map[string]any{"name": name, "namespace": c.opts.Namespace},
				"spec":     spec,
			}}
			out, err := res.Create(ctx, u, metav1.CreateOptions{})
			if apierrors.IsAlreadyExists(err) {
				// Another node created it between the read and the
				// create: read it again, as after a conflict.
				return apierrors.NewConflict(TenantsGVR.GroupResource(), name, err)
			}
			if err == nil {
				written = out.GetResourceVersion()
			}
			return err
		case err != nil:
			return err
		}
		u.Object["spec"] = spec // the update carries the resourceVersion read
		out, err := res.Update(ctx, u, metav1.UpdateOptions{})
		if err == nil {
			written = out.GetResourceVersion()
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("cluster: writing tenant %q's ceilings: %w", tenant, err)
	}
	wctx, cancel := context.WithTimeout(ctx, TenantSyncWait)
	defer cancel()
	if err := c.waitTenant(wctx, name, written); err != nil {
		return fmt.Errorf("cluster: tenant %q's ceilings are stored in the cluster, but this node's table has not brought them back yet (the other nodes apply them as theirs do): %w", tenant, err)
	}
	return nil
}

// jsonObject is raw, a JSON object of integers and strings, as the
// dynamic client sends it (integers as int64, not float64).
func jsonObject(raw string) (map[string]any, error) {
	dec := json.NewDecoder(bytes.NewReader([]byte(raw)))
	dec.UseNumber()
	var m map[string]any
	if err := dec.Decode(&m); err != nil {
		return nil, err
	}
	for k, v := range m {
		if n, ok := v.(json.Number); ok {
			i, err := n.Int64()
			if err != nil {
				return nil, fmt.Errorf("%s: %w", k, err)
			}
			m[k] = i
		}
	}
	return m, nil
}

// waitTenant waits until the informer holds object name at
// resourceVersion rv or a later one.
func (c *Cluster) waitTenant(ctx context.Context, name, rv string) error {
	want, err := strconv.ParseUint(rv, 10, 64)
	if err != nil {
		return fmt.Errorf("the API server's resourceVersion %q: %w", rv, err)
	}
	seen := make(chan struct{}, 1)
	note := func(any) {
		select {
		case seen <- struct{}{}:
		default:
		}
	}
	reg, err := c.tenants.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    note,
		UpdateFunc: func(_, o any) { note(o) },
		DeleteFunc: note,
	})
	if err != nil {
		return err
	}
	defer func() { _ = c.tenants.RemoveEventHandler(reg) }()
	for {
		obj, ok, _ := c.tenants.GetStore().GetByKey(c.opts.Namespace + "/" + name)
		if u, isU := obj.(*unstructured.Unstructured); ok && isU {
			if got, err := strconv.ParseUint(u.GetResourceVersion(), 10, 64); err == nil && got >= want {
				return nil
			}
		}
		select {
		case <-seen:
		case <-ctx.Done():
			return context.Cause(ctx)
		}
	}
}

// OnTenantChange calls f with the tenant of each tenants.quro.dev object
// the informer sees made, changed or deleted (also this node's own
// writes): what a node applies at once when another sets a tenant's
// ceilings. f must not block.
func (c *Cluster) OnTenantChange(f func(tenant string)) error {
	call := func(obj any) {
		if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj = d.Obj
		}
		if u, ok := obj.(*unstructured.Unstructured); ok {
			if t, ok, _ := unstructured.NestedString(u.Object, "spec", "tenant"); ok && u.GetName() == TenantObjectName(t) {
				f(t)
			}
		}
	}
	_, err := c.tenants.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    call,
		UpdateFunc: func(_, o any) { call(o) },
		DeleteFunc: call,
	})
	if err != nil {
		return errors.New("cluster: watching the tenants' ceilings: " + err.Error())
	}
	return nil
}
