// Package cluster runs quro serve as one node of many on Kubernetes: each
// session is owned by one node, recorded in the Kubernetes API as a
// sessions.quro.dev object (deploy/kubernetes/crd-sessions.yaml); each
// node publishes its headroom in a Lease; any node accepts any call and
// forwards it to the session's owner (Router). Nodes hold no shared state
// of their own: the API server is the one table of who owns what, written
// with optimistic concurrency (resourceVersion). Outside a cluster none of
// this runs (quro serve without --cluster).
package cluster

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strconv"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// Group and version of Quro's resources.
const (
	Group   = "quro.dev"
	Version = "v1alpha1"
)

// SessionsGVR is the sessions.quro.dev resource; LeasesGVR the Leases in
// which nodes publish their address and headroom.
var (
	SessionsGVR = schema.GroupVersionResource{Group: Group, Version: Version, Resource: "sessions"}
	LeasesGVR   = schema.GroupVersionResource{Group: "coordination.k8s.io", Version: "v1", Resource: "leases"}
)

// Labels and annotations Quro sets.
const (
	LabelNode = "quro.dev/node" // a Session's owner; a node Lease's node
	// LabelTenantName is a named Session's nameHash of its tenant and
	// name: a node whose informer lags finds a tenant's session by name
	// in the API server (Cluster.Resolve).
	LabelTenantName = "quro.dev/tenant-name"
	LabelComponent  = "quro.dev/component"
	ComponentNode   = "node"
	AnnotAddress    = "quro.dev/address"      // a node's host:port, where other nodes forward
	AnnotSessions   = "quro.dev/sessions"     // sessions it owns
	AnnotMaxSess    = "quro.dev/max-sessions" // its cap (0: none)
	AnnotMemAvail   = "quro.dev/memory-available"
	AnnotMemTotal   = "quro.dev/memory-total"
	AnnotReserve    = "quro.dev/memory-per-session" // the memory it reserves per session
	AnnotDraining   = "quro.dev/draining"           // "true": it is being drained, and takes no new session
	// AnnotProbe says a node answers a drain's admission probe with
	// ProbeHeader: a 404 or 405 without it from such a node is no sign
	// of an earlier version (Drainer.probe).
	AnnotProbe = "quro.dev/move-probe"
	// AnnotPin is the SHA-256 of the certificate a node presents on its
	// node port (NodeTLS): its peers accept that certificate alone.
	AnnotPin        = "quro.dev/tls-sha256"
	LeasePrefix     = "quro-node-"
	DefaultLeaseTTL = 15 * time.Second
)

// Phases of a Session.
const (
	PhaseReady    = "Ready"    // its owner serves it
	PhaseDraining = "Draining" // being moved to another node
)

// Session is one sessions.quro.dev object: a Quro session and the node
// that owns it. Its name is the session's ID.
type Session struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              SessionSpec   `json:"spec"`
	Status            SessionStatus `json:"status,omitempty"`
}

// SessionSpec is what a node needs to find and revive a session.
type SessionSpec struct {
	Node    string `json:"node"`             // the owner node (its pod name)
	Tenant  string `json:"tenant,omitempty"` // "" for the local tenant
	Name    string `json:"name,omitempty"`   // the session's name within its tenant
	Network string `json:"network,omitempty"`
	Rootfs  string `json:"rootfs,omitempty"`
	Created string `json:"created,omitempty"` // RFC 3339
}

// SessionStatus is what the owner last reported.
type SessionStatus struct {
	Alive bool   `json:"alive"` // its box ran since its owner started
	Node  string `json:"node,omitempty"`
	Phase string `json:"phase,omitempty"`
}

// toUnstructured is s as the dynamic client sends it.
func (s *Session) toUnstructured() (*unstructured.Unstructured, error) {
	s.APIVersion, s.Kind = Group+"/"+Version, "Session"
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(s)
	if err != nil {
		return nil, err
	}
	return &unstructured.Unstructured{Object: m}, nil
}

// sessionFrom converts an object the API server returned.
func sessionFrom(u *unstructured.Unstructured) (*Session, error) {
	s := &Session{}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, s); err != nil {
		return nil, fmt.Errorf("session object %s: %w", u.GetName(), err)
	}
	return s, nil
}

// Node is a node as its Lease shows it.
type Node struct {
	Name        string
	Address     string // host:port of its quro serve
	Sessions    int    // sessions it owns
	MaxSessions int    // its cap (0: none)
	MemAvail    int64  // bytes of memory available to new boxes
	MemTotal    int64  // bytes of memory in all
	// SessionReserve is the bytes of memory it reserves per session:
	// its headroom is MemTotal less Sessions × SessionReserve.
	SessionReserve int64
	Renewed        time.Time // the Lease's last renewal
	TTL            time.Duration
	// Acquired is when this start of the node first wrote its Lease
	// (the Lease's acquireTime): a node that restarts acquires its Lease
	// anew, so a belief about the node from before (Router.place's
	// assumption) is known to be about its previous start. Zero for a
	// node of an earlier version, which writes none.
	Acquired time.Time
	// Draining: quro node drain runs on it; it takes no new session.
	Draining bool
	// Pin is the SHA-256 of its node port's certificate (NodeTLS), ""
	// for a node without one.
	Pin string
	// Probe: its Lease says it answers a drain's admission probe with
	// ProbeHeader (AnnotProbe); false for a node of an earlier version.
	Probe bool
}

// Live reports whether n renewed its Lease within its duration at now.
func (n *Node) Live(now time.Time) bool { return now.Sub(n.Renewed) <= n.TTL }

// nodeFromLease reads a Lease a node wrote (ok false for other Leases).
// A node is named by its Lease's name (LeasePrefix + the node), which
// the API server keeps unique, and the Lease's node label must agree:
// any node may write Leases, and a second Lease labelled with another
// node's name (its own pin and address under that name) would otherwise
// be read as that node, its certificate then accepted as the other's.
func nodeFromLease(u *unstructured.Unstructured) (Node, bool) {
	if u.GetLabels()[LabelComponent] != ComponentNode {
		return Node{}, false
	}
	an := u.GetAnnotations()
	n := Node{Name: u.GetLabels()[LabelNode], Address: an[AnnotAddress]}
	if n.Name == "" || n.Address == "" || u.GetName() != LeasePrefix+n.Name {
		return Node{}, false
	}
	n.Sessions, _ = strconv.Atoi(an[AnnotSessions])
	n.MaxSessions, _ = strconv.Atoi(an[AnnotMaxSess])
	n.MemAvail, _ = strconv.ParseInt(an[AnnotMemAvail], 10, 64)
	n.MemTotal, _ = strconv.ParseInt(an[AnnotMemTotal], 10, 64)
	n.SessionReserve, _ = strconv.ParseInt(an[AnnotReserve], 10, 64)
	n.Draining = an[AnnotDraining] == "true"
	n.Pin = an[AnnotPin]
	n.Probe = an[AnnotProbe] == "true"
	secs, _, _ := unstructured.NestedInt64(u.Object, "spec", "leaseDurationSeconds")
	n.TTL = time.Duration(secs) * time.Second
	n.Renewed = leaseTime(u, "renewTime")
	n.Acquired = leaseTime(u, "acquireTime")
	return n, true
}

// leaseTime is the time in a Lease's spec field (zero when it has none).
func leaseTime(u *unstructured.Unstructured, field string) time.Time {
	if s, ok, _ := unstructured.NestedString(u.Object, "spec", field); ok {
		if t, err := time.Parse(metav1.RFC3339Micro, s); err == nil {
			return t
		} else if t, err := time.Parse(time.RFC3339, s); err == nil {
			return t
		}
	}
	return time.Time{}
}

// nameHash is a label value (63 characters at most) for a tenant's
// session name: the first 30 bytes of the SHA-256 of tenant and name, in
// hex. A name is any text the tenant chose, so it is hashed, never put in
// a label; a record found by the label is checked against the tenant and
// name themselves.
func nameHash(tenant, name string) string {
	h := sha256.Sum256([]byte(tenant + "\x00" + name))
	return hex.EncodeToString(h[:30])
}

// recordLabels are the labels of a session's record with spec.
func recordLabels(spec SessionSpec) map[string]string {
	l := map[string]string{LabelNode: spec.Node}
	if spec.Name != "" {
		l[LabelTenantName] = nameHash(spec.Tenant, spec.Name)
	}
	return l
}
