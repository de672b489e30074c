//go:build slim

package main

import (
	"context"
	"log/slog"

	"github.com/quro-dev/quro/internal/engine/python"
)

// prepareEmbeddedPython: a -tags slim build has no embedded interpreter.
func prepareEmbeddedPython(context.Context, *python.Embedded, *slog.Logger) {}
