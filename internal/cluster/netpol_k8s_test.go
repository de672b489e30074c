//go:build k8s

package cluster

// deploy/kubernetes's NetworkPolicy against a real API server (k8stest;
// skipped without its binaries). Whether a CNI enforces it is the CNI's:
// the bridge CNI of make test-k8s does not (docs/kubernetes.md). Run:
//
//	go test -tags k8s -trimpath -count=1 -run TestClusterNetworkPolicy ./internal/cluster/

import (
	"context"
	"fmt"
	"os"
	"reflect"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"sigs.k8s.io/yaml"

	"github.com/quro-dev/quro/internal/k8stest"
)

// TestClusterNetworkPolicy: the kustomization applies networkpolicy.yaml;
// the API server takes it as it is written (validated, stored, read
// back unchanged); it selects the StatefulSet's pods, opens their public
// port to all and their node port (the one --node-listen serves) to
// those pods alone, and nothing else.
func TestClusterNetworkPolicy(t *testing.T) {
	if k8stest.Bin() == "" {
		t.Skip("no etcd and kube-apiserver binaries: make test-k8s builds them (or set KUBEBUILDER_ASSETS)")
	}
	var kust struct {
		Resources []string `json:"resources"`
	}
	b, err := os.ReadFile("../../deploy/kubernetes/kustomization.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, &kust); err != nil {
		t.Fatal(err)
	}
	found := false
	for _, r := range kust.Resources {
		found = found || r == "networkpolicy.yaml"
	}
	if !found {
		t.Fatalf("the kustomization does not apply networkpolicy.yaml: %v", kust.Resources)
	}

	np := k8stest.Manifest(t, "networkpolicy.yaml")
	sts := k8stest.Manifest(t, "statefulset.yaml")
	cfg, _ := k8stest.APIServer(t)
	res := dynamic.NewForConfigOrDie(cfg).Resource(schema.GroupVersionResource{Group: "networking.k8s.io", Version: "v1", Resource: "networkpolicies"}).Namespace("default")
	ctx := context.Background()
	if _, err := res.Create(ctx, np, metav1.CreateOptions{FieldValidation: "Strict"}); err != nil {
		t.Fatalf("the API server refused the NetworkPolicy: %v", err)
	}
	got, err := res.Get(ctx, np.GetName(), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	spec, _, _ := unstructured.NestedMap(got.Object, "spec")
	want, _, _ := unstructured.NestedMap(np.Object, "spec")
	if !reflect.DeepEqual(spec, want) {
		t.Fatalf("stored as %v, written as %v", spec, want)
	}

	pods, _, _ := unstructured.NestedStringMap(sts.Object, "spec", "template", "metadata", "labels")
	sel, _, _ := unstructured.NestedStringMap(spec, "podSelector", "matchLabels")
	if len(sel) == 0 || !subset(sel, pods) {
		t.Fatalf("the policy selects %v, the StatefulSet's pods are %v", sel, pods)
	}
	// The StatefulSet's ports, by name, and the node port --node-listen serves.
	ports := map[string]int64{}
	nodeListen := ""
	containers, _, _ := unstructured.NestedSlice(sts.Object, "spec", "template", "spec", "containers")
	for _, c := range containers {
		cm, _ := c.(map[string]any)
		cps, _, _ := unstructured.NestedSlice(cm, "ports")
		for _, p := range cps {
			pm, _ := p.(map[string]any)
			name, _, _ := unstructured.NestedString(pm, "name")
			n, _, _ := unstructured.NestedInt64(pm, "containerPort")
			ports[name] = n
		}
		args, _, _ := unstructured.NestedStringSlice(cm, "args")
		for _, a := range args {
			if v, ok := strings.CutPrefix(a, "--node-listen="); ok {
				nodeListen = v
			}
		}
	}
	if ports["node"] == 0 || ports["http"] == 0 || !strings.HasSuffix(nodeListen, fmt.Sprintf(":%d", ports["node"])) {
		t.Fatalf("the StatefulSet's ports %v, --node-listen=%s (the container port node is the port --node-listen serves)", ports, nodeListen)
	}
	// Quro's own label, not the generic name every chart of the app may
	// put on its pods.
	if sel[LabelComponent] != ComponentNode {
		t.Fatalf("the policy selects %v, not Quro's pods by %s=%s", sel, LabelComponent, ComponentNode)
	}
	// Each port the policy opens, and to whom (nil: anyone).
	open := map[int64][]any{}
	rules, _, _ := unstructured.NestedSlice(spec, "ingress")
	for _, r := range rules {
		rm, _ := r.(map[string]any)
		from, _, _ := unstructured.NestedSlice(rm, "from")
		rps, _, _ := unstructured.NestedSlice(rm, "ports")
		if len(rps) == 0 {
			t.Fatalf("a rule opens every port: %v", rm)
		}
		for _, p := range rps {
			// A port by the StatefulSet's name for it, or by number.
			n, _, _ := unstructured.NestedInt64(p.(map[string]any), "port")
			if name, ok, _ := unstructured.NestedString(p.(map[string]any), "port"); ok {
				if n = ports[name]; n == 0 {
					t.Fatalf("the policy opens port %q, which the StatefulSet does not name", name)
				}
			}
			open[n] = from
		}
	}
	if len(open) != 2 {
		t.Fatalf("the policy opens %v (want the public port and the node port)", open)
	}
	if from, ok := open[ports["http"]]; !ok || from != nil {
		t.Fatalf("the public port %d: open to %v (want anyone)", ports["http"], from)
	}
	from, ok := open[ports["node"]]
	if !ok || len(from) != 1 {
		t.Fatalf("the node port %d: open to %v (want the StatefulSet's pods)", ports["node"], from)
	}
	peer, _ := from[0].(map[string]any)
	if _, other := peer["namespaceSelector"]; other {
		t.Fatalf("the node port is open to other namespaces: %v", peer)
	}
	if _, other := peer["ipBlock"]; other {
		t.Fatalf("the node port is open to addresses: %v", peer)
	}
	psel, _, _ := unstructured.NestedStringMap(peer, "podSelector", "matchLabels")
	if len(psel) == 0 || !subset(psel, pods) || psel[LabelComponent] != ComponentNode {
		t.Fatalf("the node port is open to pods %v, the StatefulSet's are %v", psel, pods)
	}
}

// subset: every label of sel is one of labels.
func subset(sel, labels map[string]string) bool {
	for k, v := range sel {
		if labels[k] != v {
			return false
		}
	}
	return true
}
