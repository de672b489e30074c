package cluster

import (
	"strings"
	"testing"
	"time"
)

func TestMoveSignature(t *testing.T) {
	t.Parallel()
	key := []byte("0123456789abcdef0123456789abcdef")
	now := time.Now()
	sig := MoveSignature(key, "quro-0", "abc", now)
	if from, err := VerifyMove(key, sig, "abc", now); err != nil || from != "quro-0" {
		t.Fatalf("a good signature: %q %v", from, err)
	}
	for name, tc := range map[string]struct {
		key      []byte
		header   string
		id       string
		at       time.Time
		contains string
	}{
		"another session":  {key, sig, "abd", now, "not signed"},
		"another key":      {[]byte("another key of thirty-two bytes!!"), sig, "abc", now, "not signed"},
		"another node":     {key, "quro-1" + strings.TrimPrefix(sig, "quro-0"), "abc", now, "not signed"},
		"too old":          {key, sig, "abc", now.Add(MoveSkew + time.Minute), "from now"},
		"from the future":  {key, sig, "abc", now.Add(-MoveSkew - time.Minute), "from now"},
		"no key":           {nil, sig, "abc", now, "no forwarding key"},
		"not three fields": {key, "quro-0 " + sig, "abc", now, "FROM TIME SIGNATURE"},
	} {
		if _, err := VerifyMove(tc.key, tc.header, tc.id, tc.at); err == nil || !strings.Contains(err.Error(), tc.contains) {
			t.Errorf("%s: %v, want %q", name, err, tc.contains)
		}
	}
}

func TestPlaceSkipsDrainingNodes(t *testing.T) {
	t.Parallel()
	now := time.Now()
	nodes := []Node{
		{Name: "empty-but-draining", Renewed: now, TTL: time.Minute, Draining: true},
		{Name: "busy", Sessions: 50, Renewed: now, TTL: time.Minute},
	}
	n, err := Place(nodes, now, "", 0, 0)
	if err != nil || n.Name != "busy" {
		t.Fatalf("placed on %v (%v)", n, err)
	}
	nodes[1].Draining = true
	if _, err := Place(nodes, now, "", 0, 0); err != ErrNoNode {
		t.Fatalf("every node draining: %v", err)
	}
}
