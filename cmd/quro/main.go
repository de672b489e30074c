// Command quro is a self-hosted code-execution and terminal server for AI
// agents. See `quro help`.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/quro-dev/quro/internal/app"
	"github.com/quro-dev/quro/internal/capability"
	"github.com/quro-dev/quro/internal/controller"
	"github.com/quro-dev/quro/internal/engine/python"
	"github.com/quro-dev/quro/internal/runcode"
	"github.com/quro-dev/quro/internal/sandbox"
)

func main() { os.Exit(Main()) }

// exitError carries a process exit status out of a command.
type exitError struct{ code int }

func (e *exitError) Error() string { return fmt.Sprintf("exit status %d", e.code) }

// Main runs the CLI and returns the process exit status.
func Main() int {
	if name := shimName(); name != "" {
		return aptShim(name, os.Args[1:], os.Stdout, os.Stderr)
	}
	if isSudo() {
		return sudoShim(os.Args[1:], os.Stdout, os.Stderr)
	}
	if len(os.Args) > 1 && os.Args[1] == pipStandInArg {
		return pipShim(os.Args[2:], os.Stdout, os.Stderr)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	root := newRoot(os.Stdin, os.Stdout, os.Stderr)
	err := root.ExecuteContext(ctx)
	var ee *exitError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &ee):
		return ee.code
	}
	fmt.Fprintln(os.Stderr, "quro:", err)
	return 1
}

type globals struct {
	dataDir   string
	stdin     io.Reader
	stderr    io.Writer
	maxStdout int
	maxStderr int
	isolation string
	// pythonCache is --python-cache: the embedded Python's install root
	// shared by data directories (python.SharedRoot), or "off".
	pythonCache string
	// server and tokenFile are --server and --token-file (see target).
	server, tokenFile string
}

func newRoot(stdin io.Reader, stdout, stderr io.Writer) *cobra.Command {
	g := &globals{stdin: stdin, stderr: stderr}
	root := &cobra.Command{
		Use:   "quro",
		Short: "Run code and drive terminals for AI agents, isolated and fast",
		Long: `Quro lets AI agents run Python, JS/TS and shell, render artifacts and drive
persistent terminals on a Linux host. One binary: quro serve exposes every
capability over HTTP; quro run calls the same controller in-process.`,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.SetIn(stdin)
	root.PersistentFlags().StringVar(&g.dataDir, "data", app.DefaultDataDir(),
		"data directory (database, sessions, workspaces); env QURO_DATA")
	root.PersistentFlags().StringVar(&g.pythonCache, "python-cache", python.DefaultCacheRoot(),
		"where the embedded Python is prepared once for every data directory (root's, writable by nobody else; else the data directory is used, logged); off: in the data directory; env "+python.CacheEnv)
	root.PersistentFlags().IntVar(&g.maxStdout, "max-stdout", 12<<10, "bytes of stdout kept in a result (head and tail; the rest is saved to a file)")
	root.PersistentFlags().IntVar(&g.maxStderr, "max-stderr", 4<<10, "bytes of stderr kept in a result")
	root.PersistentFlags().StringVar(&g.isolation, "isolation", sandbox.IsolationFull,
		"full: refuse to run user code when an isolation layer is missing; minimal: run with the layers this machine has (logged)")
	root.AddCommand(newServeCmd(g), newMCPCmd(g), newRunCmd(g), newCallCmd(g), newDoctorCmd(g), newVersionCmd(), newSessionCmd(g),
		newExecCmd(g), newTermCmd(g), newRootfsCmd(g), newTokenCmd(g), newAuditCmd(g), newTenantCmd(g), newNodeCmd(g))
	return root
}

func (g *globals) open(ctx context.Context) (*app.App, error) {
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	return app.New(ctx, g.dataDir, g.options(log))
}

// caller is who the CLI is: the local user, with every scope.
func (g *globals) caller() controller.Caller {
	return controller.Caller{Path: "cli", Scope: capability.ScopeAdmin}
}

func (g *globals) options(log *slog.Logger) *app.Options {
	if g.isolation == sandbox.IsolationMinimal && log != nil {
		log.Warn("isolation is minimal: user code runs with whatever isolation layers this machine has; see quro doctor")
	}
	return &app.Options{Logger: log,
		Run:     &runcode.Options{MaxStdout: g.maxStdout, MaxStderr: g.maxStderr},
		Sandbox: &sandbox.Options{Isolation: g.isolation},
		Python:  &python.EmbeddedOptions{Status: extractionProgress(g.stderr), InstallRoot: g.pythonRoot(log), Logger: log},
	}
}

// pythonRoot is the embedded Python's install root: the shared cache
// (--python-cache) when it can be used, else "" (the data directory), with
// the reason logged unless the cache was turned off.
func (g *globals) pythonRoot(log *slog.Logger) string {
	root, err := python.SharedRoot(g.pythonCache)
	if err != nil && g.pythonCache != python.CacheOff && log != nil {
		log.Info("the embedded Python is prepared in the data directory", "reason", err)
	}
	return root
}

// extractionProgress shows the one-time preparation of the embedded Python
// (extraction and byte-compiling, on the first run on a data directory) on
// stderr when it is a terminal, as one line updated in place. Elsewhere
// stderr stays the program's alone (scripts check it is empty).
func extractionProgress(w io.Writer) func(msg string) {
	f, ok := w.(*os.File)
	if !ok || !term.IsTerminal(int(f.Fd())) {
		return nil
	}
	var mu sync.Mutex
	return func(msg string) {
		mu.Lock()
		defer mu.Unlock()
		fmt.Fprintf(f, "\r\033[Kquro: %s", msg)
		if strings.Contains(msg, "ready (") {
			fmt.Fprintln(f)
		}
	}
}
