//go:build slim

package python

import (
	"context"
	"errors"
	"testing"
)

func TestSlimBuildHasNoEmbeddedInterpreter(t *testing.T) {
	e := NewEmbedded(t.TempDir(), nil, nil)
	if err := e.Probe(context.Background()); !errors.Is(err, ErrNotInBuild) {
		t.Fatalf("Probe: %v", err)
	}
}
