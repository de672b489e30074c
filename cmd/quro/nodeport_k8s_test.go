//go:build k8s

package main

// The node port's connection caps, on a node against a real API server
// (the harness of cluster_k8s_test.go). Run:
//
//	go test -tags k8s -trimpath -count=1 -run TestClusterNodePortConnectionsAreBounded ./cmd/quro/

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"

	"github.com/quro-dev/quro/internal/cluster"
)

// TestClusterNodePortConnectionsAreBounded: any pod can reach a node's
// node port, so connections that never finish their TLS handshake must
// not pile up there (each held until the header timeout) until the node
// runs out of descriptors. With --max-conns-per-ip 8, eight raw
// connections from one address are held, and a ninth is closed at once —
// while the first is still open, which a close by the handshake's timeout
// would have ended first.
func TestClusterNodePortConnectionsAreBounded(t *testing.T) {
	cfg, kc := apiServer(t)
	tokens := filepath.Join(t.TempDir(), "tokens")
	os.WriteFile(tokens, []byte(quroToken()+" acme exec\n"), 0o600)
	startNode(t, "node-a", kc, tokens, "--max-conns", "32", "--max-conns-per-ip", "8")
	dyn := dynamic.NewForConfigOrDie(cfg)
	waitLeases(t, dyn, 1)
	l, err := dyn.Resource(cluster.LeasesGVR).Namespace("default").Get(context.Background(), cluster.LeasePrefix+"node-a", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	addr := l.GetAnnotations()[cluster.AnnotAddress]
	if addr == "" {
		t.Fatalf("node-a's Lease names no node port: %v", l.GetAnnotations())
	}
	var held []net.Conn
	t.Cleanup(func() {
		for _, c := range held {
			c.Close()
		}
	})
	for range 8 {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
	}
	extra, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer extra.Close()
	// The ninth is closed by the node (an EOF or a reset, nothing read).
	if n, err := extra.Read(make([]byte, 1)); err == nil {
		t.Fatalf("the ninth connection read %d bytes", n)
	}
	// The first is still open: a read of it only runs out of time.
	held[0].SetReadDeadline(time.Now().Add(50 * time.Millisecond))
	if _, err := held[0].Read(make([]byte, 1)); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("the first connection was closed too (%v): the ninth was not refused by the cap", err)
	}
}
