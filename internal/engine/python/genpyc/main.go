//go:build !slim

// Command genpyc writes precompiled/stdlib-GOOS-GOARCH.tar.gz, the
// embedded interpreter's standard library byte-compiled by that
// interpreter (see ../precompiled.go). `go generate` runs it in
// internal/engine/python; `make stdlib-pyc` runs that. Run it again when
// the go-embed-python version changes: until then the archive no longer
// matches, and extraction compiles the standard library itself.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"

	"github.com/quro-dev/quro/internal/engine/python"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	err := run(ctx)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "genpyc:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context) error {
	out := filepath.Join("precompiled", "stdlib-"+runtime.GOOS+"-"+runtime.GOARCH+".tar.gz")
	f, err := os.CreateTemp("precompiled", ".stdlib-*.tmp")
	if err != nil {
		return fmt.Errorf("%w (run in internal/engine/python, as go generate does)", err)
	}
	defer os.Remove(f.Name())
	h, err := python.WritePrecompiled(ctx, f)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	if err := os.Chmod(f.Name(), 0o644); err != nil {
		return err
	}
	if err := os.Rename(f.Name(), out); err != nil {
		return err
	}
	fi, err := os.Stat(out)
	if err != nil {
		return err
	}
	fmt.Printf("%s: %d .pyc files of Python %s (%.1f MB), %.1f MB compressed\n", out, h.Files, h.Version, float64(h.Bytes)/1e6, float64(fi.Size())/1e6)
	return nil
}
