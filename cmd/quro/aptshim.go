package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"

	"github.com/quro-dev/quro/internal/api/insession"
	"github.com/quro-dev/quro/internal/sandbox"
)

// aptNames are the names under which the quro binary stands in for apt in
// a session's box (see sandbox.BinDir, first on the box's PATH).
var aptNames = sandbox.BinNames

// realApt is where the rootfs keeps apt itself.
const realApt = "/usr/bin/"

// aptShim answers `apt-get install PKG…` typed in a session: the rootfs is
// read-only to the session, so the install is asked of the server
// (install_packages, over the in-session socket, as this session). The
// session calls with scope exec, and install_packages needs install (the
// rootfs is shared by every session and tenant on it), so the server
// refuses and the stand-in says who can install instead. A server that
// gave a session install (not done: see docs/security.md) would run apt
// in the install box under the session's network policy. Anything but
// install goes to the real apt unchanged.
func aptShim(name string, args []string, stdout, stderr io.Writer) int {
	in, pkgs, ok := aptInstallRequest(args)
	if !ok {
		real := realApt + name
		if err := syscall.Exec(real, append([]string{name}, args...), os.Environ()); err != nil {
			fmt.Fprintf(stderr, "%s: %v\n", name, err)
		}
		return 100
	}
	if _, err := os.Stat(insession.SocketInBox); err != nil {
		fmt.Fprintf(stderr, "%s: this rootfs is read-only here, and no quro server is reachable to install %s (run inside a session of quro serve, or ask for install_packages)\n",
			name, strings.Join(pkgs, " "))
		return 100
	}
	c := newHTTPCaller("unix://"+insession.SocketInBox, "")
	fmt.Fprintf(stdout, "quro: installing %s into the session's rootfs through the server (install_packages)\n", strings.Join(pkgs, " "))
	out, err := c.call(context.Background(), "install_packages", in, true)
	if err != nil {
		if strings.Contains(err.Error(), "permission_denied") && strings.Contains(err.Error(), "needs scope") {
			// The decision (docs/security.md): code in a session calls as
			// the session, with scope exec, and exec does not cover
			// install: a rootfs is shared by every session and tenant on
			// it, so its code cannot change it.
			fmt.Fprintf(stderr, "%s: nothing was installed: this session may not change its rootfs, which every session on it shares. "+
				"A caller with scope install (or admin) can: install_packages packages=[%s] session=<this session>, "+
				"or an operator runs `quro rootfs install-packages ROOTFS %s`\n", name, strings.Join(pkgs, ","), strings.Join(pkgs, " "))
			return 100
		}
		fmt.Fprintf(stderr, "%s: %v\n", name, err)
		return 100
	}
	var res struct {
		Rootfs   string `json:"rootfs"`
		ExitCode int    `json:"exit_code"`
		TimedOut bool   `json:"timed_out"`
		Output   string `json:"output"`
	}
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		fmt.Fprintf(stderr, "%s: the server's answer: %v\n", name, err)
		return 100
	}
	fmt.Fprint(stdout, res.Output)
	if res.ExitCode != 0 || res.TimedOut {
		fmt.Fprintf(stderr, "%s: apt failed in rootfs %s (exit %d, timed out %v)\n", name, res.Rootfs, res.ExitCode, res.TimedOut)
		return 100
	}
	fmt.Fprintf(stdout, "quro: rootfs %s now has %s (for every session on it)\n", res.Rootfs, strings.Join(pkgs, " "))
	return 0
}

// aptInstallRequest turns the argv of apt-get/apt typed in a box into
// the arguments of an install_packages call, or ok false when it is not
// an install of at least one package (it then goes to the real apt). Only
// the packages cross: apt's options are the server's own, whatever the
// box asked. The server checks every name again (grammar, exact match in
// the rootfs's lists, apt's simulated plan); this only never lets an
// option pass as a package.
func aptInstallRequest(args []string) (req []byte, pkgs []string, ok bool) {
	verb, pkgs := parseApt(args)
	if verb != "install" || len(pkgs) == 0 {
		return nil, nil, false
	}
	req, err := json.Marshal(struct {
		Packages []string `json:"packages"`
	}{pkgs})
	if err != nil {
		return nil, nil, false
	}
	return req, pkgs, true
}

// aptValueOptions are apt options whose value is the next argument.
var aptValueOptions = []string{"-o", "--option", "-t", "--target-release", "--default-release", "-c", "--config-file", "-a", "--host-architecture"}

// parseApt finds apt's verb and the packages after it, skipping options
// (and the values of those that take one). The server installs
// non-interactively without recommends whatever the options say.
func parseApt(args []string) (verb string, pkgs []string) {
	for i := 0; i < len(args); i++ {
		a := args[i]
		switch {
		case slices.Contains(aptValueOptions, a):
			i++
		case a == "":
		case strings.HasPrefix(a, "-"):
		case verb == "":
			verb = a
		default:
			pkgs = append(pkgs, a)
		}
	}
	return verb, pkgs
}

// shimName is the apt name the binary was started as, or "".
func shimName() string {
	base := filepath.Base(os.Args[0])
	if slices.Contains(aptNames, base) {
		return base
	}
	return ""
}
