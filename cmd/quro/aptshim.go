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

// aptShim makes `apt-get install PKG…` typed in a session work: the rootfs
// is read-only to the session, so the install is asked of the server
// (install_packages, over the in-session socket, as this session), which
// runs apt in a box that may write the rootfs — under the session's
// network policy — and the packages then serve every session of that
// rootfs. Anything but install goes to the real apt unchanged.
func aptShim(name string, args []string, stdout, stderr io.Writer) int {
	verb, pkgs := parseApt(args)
	if verb != "install" || len(pkgs) == 0 {
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
	in, _ := json.Marshal(map[string]any{"packages": pkgs})
	c := newHTTPCaller("unix://"+insession.SocketInBox, "")
	fmt.Fprintf(stdout, "quro: installing %s into the session's rootfs through the server (install_packages)\n", strings.Join(pkgs, " "))
	out, err := c.call(context.Background(), "install_packages", in, true)
	if err != nil {
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
