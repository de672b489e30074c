// Package shell is the one-shot shell engine of run_code: `sh -c CODE` in the
// session's sandbox.
package shell

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"

	"github.com/quro-dev/quro/internal/runcode"
	"github.com/quro-dev/quro/internal/sandbox"
)

// maxArg is the longest script passed as an argument; the kernel refuses a
// single argument over 128 KiB, so longer scripts go through a file.
const maxArg = 100 << 10

// Engine runs shell code with sh.
type Engine struct {
	sb     *sandbox.Sandbox
	rootfs func(name string) (string, error)
}

// New returns the shell engine. rootfs resolves a session's rootfs name to
// its directory, so that sessions on a rootfs run there (nil: such
// sessions are refused).
func New(sb *sandbox.Sandbox, rootfs func(name string) (string, error)) *Engine {
	return &Engine{sb: sb, rootfs: rootfs}
}

// Name implements runcode.Engine.
func (e *Engine) Name() string { return "shell/sh" }

// Probe implements runcode.Engine.
func (e *Engine) Probe(ctx context.Context) error {
	_, err := e.sb.LookPath("sh")
	return err
}

// Run implements runcode.Engine.
func (e *Engine) Run(ctx context.Context, req *runcode.Request) (*runcode.Result, error) {
	args := []string{"sh", "-c", req.Code, "sh"}
	if len(req.Code) > maxArg {
		var b [8]byte
		rand.Read(b[:])
		script := filepath.Join(req.Session.TmpDir(), "run-"+hex.EncodeToString(b[:])+".sh")
		// Readable by the session's own uid, which runs it; the session's
		// tmp directory itself is private to that uid (see sandbox.Start).
		if err := os.WriteFile(script, []byte(req.Code), 0o644); err != nil {
			return nil, fmt.Errorf("write script: %w", err)
		}
		defer os.Remove(script)
		args = []string{"sh", script}
	}
	spec := runcode.ProcessSpec(req, args...)
	if name := req.Session.Rootfs; name != "" {
		if e.rootfs == nil {
			return nil, fmt.Errorf("the session runs on rootfs %q, which this engine cannot use", name)
		}
		dir, err := e.rootfs(name)
		if err != nil {
			return nil, err
		}
		spec.Rootfs = dir
	}
	exit, err := e.sb.Run(ctx, spec)
	if err != nil {
		return nil, err
	}
	return runcode.ExitResult(exit, req.Timeout), nil
}
