package python

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/go-python/gpython/py"
	_ "github.com/go-python/gpython/stdlib" // builtins, sys, math, time, …

	"github.com/quro-dev/quro/internal/runcode"
	"github.com/quro-dev/quro/internal/sandbox"
)

// gpythonArg is the hidden first argument with which the quro binary
// re-executes itself to run code with gpython: the child reads the program
// on stdin. Running it in a child (through the sandbox, like any user code)
// is what lets a timeout kill it: gpython has no way to interrupt itself.
const gpythonArg = "__quro_gpython"

// gpythonNote labels every result of the subset tier.
const gpythonNote = "Python subset (gpython): a pure-Go interpreter of Python 3.4-era syntax with a small standard library; " +
	"C extensions and most modules are missing, and no state is kept between runs"

// The hook runs in package initialisation so that quro and this package's
// test binaries can both serve as the child.
func init() {
	if len(os.Args) > 1 && os.Args[1] == gpythonArg {
		os.Exit(gpythonMain(os.Stdin, os.Stderr))
	}
}

// gpythonMain runs the program read from stdin and returns the exit status:
// 0, 1 for an uncaught exception, or the SystemExit code.
func gpythonMain(stdin io.Reader, stderr io.Writer) int {
	src, err := io.ReadAll(stdin)
	if err != nil {
		fmt.Fprintln(stderr, "quro gpython: reading the program:", err)
		return 2
	}
	ctx := py.NewContext(py.DefaultContextOpts())
	defer ctx.Close()
	// gpython 0.2.0's sys.exit returns the SystemExit instead of raising it,
	// so sys.exit() does nothing; replace it with one that raises.
	if sys, err := ctx.GetModule("sys"); err == nil {
		sys.Globals["exit"] = py.MustNewMethod("exit", func(self py.Object, args py.Tuple) (py.Object, error) {
			exc, err := py.ExceptionNew(py.SystemExit, args, nil)
			if err != nil {
				return nil, err
			}
			return nil, exc.(*py.Exception)
		}, 0, "exit([status]) raises SystemExit(status).")
	}
	code, err := py.Compile(string(src)+"\n", "<run>", py.ExecMode, 0, true)
	if err == nil {
		_, err = py.RunCode(ctx, code, "<run>", nil)
	}
	if err == nil {
		return 0
	}
	if py.IsException(py.SystemExit, err) {
		return systemExitCode(err, stderr)
	}
	py.TracebackDump(err)
	return 1
}

// systemExitCode maps SystemExit(arg) to an exit status as CPython does.
func systemExitCode(err error, stderr io.Writer) int {
	var (
		exc  *py.Exception
		info py.ExceptionInfo
		ptr  *py.ExceptionInfo
	)
	switch {
	case errors.As(err, &info):
		exc, _ = info.Value.(*py.Exception)
	case errors.As(err, &ptr):
		exc, _ = ptr.Value.(*py.Exception)
	case errors.As(err, &exc):
	}
	if exc == nil {
		return 1
	}
	args, _ := exc.Args.(py.Tuple)
	if len(args) == 0 || args[0] == py.None {
		return 0
	}
	if n, ok := args[0].(py.Int); ok {
		return int(n)
	}
	s, _ := py.Str(args[0])
	fmt.Fprintln(stderr, s)
	return 1
}

// GPython is tier 4 of the Python chain: github.com/go-python/gpython, a
// Python subset written in Go that needs nothing from the host. It runs in a
// re-executed child of the quro binary under the sandbox, one process per
// run. Results say that only a subset of Python ran.
type GPython struct {
	sb   *sandbox.Sandbox
	self string
	err  error
}

// NewGPython returns the gpython engine.
func NewGPython(sb *sandbox.Sandbox) *GPython {
	self, err := os.Executable()
	return &GPython{sb: sb, self: self, err: err}
}

// Name implements runcode.Engine.
func (g *GPython) Name() string { return "python/gpython" }

// Probe implements runcode.Engine: the engine is part of the binary.
func (g *GPython) Probe(ctx context.Context) error {
	if g.err != nil {
		return fmt.Errorf("cannot find the quro executable to re-exec: %w", g.err)
	}
	return nil
}

// Run implements runcode.Engine.
func (g *GPython) Run(ctx context.Context, req *runcode.Request) (*runcode.Result, error) {
	if g.err != nil {
		return nil, g.err
	}
	spec := runcode.ProcessSpec(req, g.self, gpythonArg)
	spec.Stdin = strings.NewReader(req.Code)
	// The child is the quro binary itself: a box starts it where it shows
	// it (/run/quro/bin/quro, never its host path); without a box, Landlock
	// lets it be read.
	spec.ReadOnly = []string{g.self}
	exit, err := g.sb.Run(ctx, spec)
	if err != nil {
		return nil, err
	}
	res := runcode.ExitResult(exit, req.Timeout)
	res.Notes = append([]string{gpythonNote}, res.Notes...)
	return res, nil
}
