// Package shell is the one-shot shell engine of run_code: `bash -c CODE`
// or `sh -c CODE` in the session's sandbox. The two are separate engines
// so that a result says which shell ran the code (shell/bash, shell/sh):
// lang "bash" runs bash or fails saying bash is missing, lang "sh" runs
// sh, lang "shell" runs bash when the box has it and sh otherwise (see
// Languages).
package shell

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/quro-dev/quro/internal/rootfs"
	"github.com/quro-dev/quro/internal/runcode"
	"github.com/quro-dev/quro/internal/sandbox"
)

// maxArg is the longest script passed as an argument; the kernel refuses a
// single argument over 128 KiB, so longer scripts go through a file.
const maxArg = 100 << 10

// Engine runs shell code with one shell program (sh or bash).
type Engine struct {
	sb     *sandbox.Sandbox
	rootfs func(name string) (string, error)
	prog   string
}

// New returns the sh engine. rootfs resolves a session's rootfs name to
// its directory, so that sessions on a rootfs run there (nil: such
// sessions are refused).
func New(sb *sandbox.Sandbox, rootfs func(name string) (string, error)) *Engine {
	return &Engine{sb: sb, rootfs: rootfs, prog: "sh"}
}

// Bash returns the bash engine; rootfs as for New.
func Bash(sb *sandbox.Sandbox, rootfs func(name string) (string, error)) *Engine {
	return &Engine{sb: sb, rootfs: rootfs, prog: "bash"}
}

// Languages are run_code's shell languages: bash (bash or a clear error),
// sh (POSIX sh) and shell (bash when the box has it, else sh).
func Languages(sb *sandbox.Sandbox, rootfs func(name string) (string, error)) []runcode.Language {
	bash, sh := Bash(sb, rootfs), New(sb, rootfs)
	return []runcode.Language{
		{Name: "shell", Runs: true, Chain: []runcode.Engine{bash, sh}},
		{Name: "bash", Runs: true, Chain: []runcode.Engine{bash}},
		{Name: "sh", Aliases: []string{"posix"}, Runs: true, Chain: []runcode.Engine{sh}},
	}
}

// Name implements runcode.Engine.
func (e *Engine) Name() string { return "shell/" + e.prog }

// Probe implements runcode.Engine: the program is in the server's PATH
// (the userland of sessions without a rootfs).
func (e *Engine) Probe(ctx context.Context) error {
	if _, err := e.sb.LookPath(e.prog); err != nil {
		return e.missing(err.Error())
	}
	return nil
}

func (e *Engine) missing(why string) error {
	if e.prog == "bash" {
		return fmt.Errorf("%s; lang \"sh\" runs POSIX sh instead", why)
	}
	return errors.New(why)
}

// Run implements runcode.Engine.
func (e *Engine) Run(ctx context.Context, req *runcode.Request) (*runcode.Result, error) {
	var rootfsDir string
	if name := req.Session.Rootfs; name != "" {
		if e.rootfs == nil {
			return nil, rootfs.ErrNoEngineRootfs(name)
		}
		dir, err := e.rootfs(name)
		if err != nil {
			return nil, err
		}
		// Checked before anything runs, so that lang "shell" falls back
		// to sh and lang "bash" says why instead of "bash: not found".
		if _, ok := rootfs.LookPath(dir, e.prog); !ok {
			return nil, e.missing(fmt.Sprintf("the session's rootfs %q has no %s (looked in /usr/local/bin, /usr/bin and /bin)", name, e.prog))
		}
		rootfsDir = dir
	}
	args := []string{e.prog, "-c", req.Code, e.prog}
	if len(req.Code) > maxArg {
		var b [8]byte
		rand.Read(b[:])
		script := filepath.Join(req.Session.TmpDir(), "run-"+hex.EncodeToString(b[:])+".sh")
		// Readable by the session's own uid, which runs it; the session's
		// tmp directory itself is private to that uid (see sandbox.Start).
		boxPath := e.sb.TmpPath(req.Session.TmpDir(), script) // no host path in $0 or an error
		if err := os.WriteFile(script, []byte(req.Code), 0o644); err != nil {
			var pe *fs.PathError
			if errors.As(err, &pe) { // it names the host path
				err = pe.Err
			}
			return nil, fmt.Errorf("write script %s: %w", boxPath, err)
		}
		defer os.Remove(script)
		args = []string{e.prog, boxPath}
	}
	spec := runcode.ProcessSpec(req, args...)
	spec.Rootfs = rootfsDir
	exit, err := e.sb.Run(ctx, spec)
	if err != nil {
		return nil, err
	}
	return runcode.ExitResult(exit, req.Timeout), nil
}
