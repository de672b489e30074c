package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"

	"github.com/quro-dev/quro/internal/api/insession"
	"github.com/quro-dev/quro/internal/capability"
	"github.com/quro-dev/quro/internal/engine/python"
	"github.com/quro-dev/quro/internal/pip"
)

// pipStandInArg is the hidden first argument under which the quro binary
// answers a session's `pip install` (python.PipStandIn: the pip shims run
// `quro __pip ARGS…` first in a session without network).
const pipStandInArg = "__pip"

// pipShim answers `pip install REQ…` typed in a session without network
// (QURO_PIP_OFFLINE=1 in the box), in the shell or by a %pip / !pip line:
// the box cannot reach an index, so the install is asked of the server
// (install_packages {manager: pip}, over the in-session socket, as this
// session, which needs only scope exec): it fetches the wheels from its
// own index into the tenant's cache and installs them into this session's
// user site. Only plain requirements cross, and the server checks them
// again. Anything else (another pip command, an option the server does not
// honour, a path or URL, no socket: quro run's boxes) returns
// python.PipFallback, and the shim runs the local pip, which installs
// from the tenant's cache only and ends a failure with the hint.
func pipShim(args []string, stdout, stderr io.Writer) int {
	if os.Getenv("QURO_PIP_OFFLINE") != "1" {
		return python.PipFallback
	}
	reqs, ok := pipInstallRequest(args)
	if !ok {
		return python.PipFallback
	}
	if _, err := os.Stat(insession.SocketInBox); err != nil {
		return python.PipFallback
	}
	in, err := json.Marshal(struct {
		Manager  string   `json:"manager"`
		Packages []string `json:"packages"`
	}{"pip", reqs})
	if err != nil {
		return python.PipFallback
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	fmt.Fprintf(stdout, "quro: this session has no network: the server fetches %s from its index into the tenant's wheel cache and installs it here (install_packages {manager: pip})\n", strings.Join(reqs, " "))
	out, err := newHTTPCaller("unix://"+insession.SocketInBox, "").call(ctx, "install_packages", in, true)
	if err != nil {
		var ce *capability.Error
		if errors.As(err, &ce) && ce.Code == capability.PermissionDenied {
			// A server that does not let a session install Python
			// packages: the local pip does what it can.
			fmt.Fprintf(stderr, "quro: the server refused (%v); trying the tenant's wheel cache only\n", err)
			return python.PipFallback
		}
		fmt.Fprintf(stderr, "ERROR: %v\n", err)
		return 1
	}
	var res struct {
		ExitCode int      `json:"exit_code"`
		Output   string   `json:"output"`
		Wheels   []string `json:"wheels"`
	}
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		fmt.Fprintf(stderr, "ERROR: the server's answer: %v\n", err)
		return 1
	}
	fmt.Fprint(stdout, res.Output)
	if res.Output != "" && !strings.HasSuffix(res.Output, "\n") {
		fmt.Fprintln(stdout)
	}
	if res.ExitCode != 0 {
		return res.ExitCode
	}
	return 0
}

// pipQuietOptions are pip install options the stand-in drops: the server's
// install is a user install of exactly the requirements, and its output is
// shown whole. An upgrade is what a fetch-then-install of the newest
// matching wheel does anyway.
var pipQuietOptions = []string{
	"--user", "-U", "--upgrade", "-q", "--quiet", "-qq", "-qqq", "-v", "--verbose",
	"--no-input", "--disable-pip-version-check", "--no-warn-script-location",
	"--no-cache-dir", "--break-system-packages", "--root-user-action=ignore",
	"--progress-bar=off", "--no-color",
}

// pipInstallRequest is the requirements of `pip install ARGS…` when the
// server can do the whole of it: the verb install, only the options of
// pipQuietOptions, at least one operand, and every operand a plain
// requirement (pip.CheckRequirements: no path, URL or option). Anything
// else is the local pip's.
func pipInstallRequest(args []string) (reqs []string, ok bool) {
	verb := false
	operands := false
	for _, a := range args {
		switch {
		case operands || (verb && !strings.HasPrefix(a, "-")):
			reqs = append(reqs, a)
		case !verb && a == "install":
			verb = true
		case verb && a == "--":
			operands = true
		case slices.Contains(pipQuietOptions, a):
		default:
			return nil, false
		}
	}
	if !verb || len(reqs) == 0 || pip.CheckRequirements(reqs) != nil {
		return nil, false
	}
	return reqs, true
}
