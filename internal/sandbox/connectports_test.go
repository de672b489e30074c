package sandbox

import (
	"errors"
	"strconv"
	"strings"
	"testing"

	"github.com/quro-dev/quro/internal/sandbox/sandboxtest"
)

// TestConnectPortsLimitTCP: a run with the host's network and
// ConnectPorts reaches the listed port and no other (a second loopback
// listener counts no connection), and cannot bind; without the host's
// network the field is refused.
func TestConnectPortsLimitTCP(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a box")
	}
	t.Parallel()
	sb := fullSandbox(t)
	if landlockABI() < 4 {
		t.Skip("Landlock ABI < 4 cannot limit TCP")
	}
	allowed, other := sandboxtest.ListenHost(t, "hi"), sandboxtest.ListenHost(t, "hi")
	pa, po := allowed.Port, other.Port
	script := "exec 3<>/dev/tcp/127.0.0.1/" + strconv.Itoa(pa) + " && echo allowed-ok; " +
		"exec 4<>/dev/tcp/127.0.0.1/" + strconv.Itoa(po) + " && echo other-ok; " +
		"python3 -c 'import socket; s=socket.socket(); s.bind((\"127.0.0.1\", 0)); print(\"bind-ok\")' 2>&1 | tail -1"
	out, _ := boxRun(t, sb, testCtx(t), t.TempDir(), script, func(s *Spec) {
		s.Network = NetworkHost
		s.ConnectPorts = []int{pa}
	})
	if !strings.Contains(out, "allowed-ok") || strings.Contains(out, "other-ok") || strings.Contains(out, "bind-ok") {
		t.Fatalf("want only the listed port reached and no bind:\n%s", out)
	}
	if allowed.Accepted.Load() != 1 || other.Accepted.Load() != 0 {
		t.Fatalf("connections: listed port %d, other port %d", allowed.Accepted.Load(), other.Accepted.Load())
	}
	_, err := sb.Run(testCtx(t), &Spec{Args: []string{"true"}, Dir: t.TempDir(), ConnectPorts: []int{pa}})
	if !errors.Is(err, ErrInvalidSpec) {
		t.Fatalf("connect ports without network full: %v", err)
	}
}
