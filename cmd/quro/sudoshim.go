package main

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"github.com/quro-dev/quro/internal/sandbox"
)

// sudoName is the name under which the quro binary stands in for sudo in
// a session's box (sandbox.SudoName in BinDir, first on the box's PATH).
const sudoName = sandbox.SudoName

// SudoRefusal is what the sudo stand-in answers a command it cannot run:
// a box has no root to become (docs/security.md, "No root in a box").
const SudoRefusal = "sudo: there is no root in a Quro sandbox: every process runs as the session's one unprivileged user " +
	"(\"user\"; the box's uid 0 would be the host's root), and the system directories are read-only to it. " +
	"Run the command without sudo; to install software: `apt-get install PKG` (asks the server, no sudo needed), " +
	"`pip install PKG` (into this session), `npm install PKG` in /home/user"

// sudoShim answers `sudo [options] COMMAND…` typed in a session's box:
// apt-get and apt go to the apt stand-in (which asks the server and needs
// no root), a command run as the box's own user ("user", -u user) runs as
// it is, and anything else is refused with SudoRefusal (exit 1, sudo's
// own failure status).
func sudoShim(args []string, stdout, stderr io.Writer) int {
	target, cmd, ok := sudoCommand(args)
	if !ok || len(cmd) == 0 {
		fmt.Fprintln(stderr, SudoRefusal)
		return 1
	}
	if name := filepath.Base(cmd[0]); slices.Contains(aptNames, name) && (cmd[0] == name || cmd[0] == "/usr/bin/"+name) {
		return aptShim(name, cmd[1:], stdout, stderr)
	}
	if !sudoSelf(target) {
		fmt.Fprintln(stderr, SudoRefusal)
		return 1
	}
	path, err := exec.LookPath(cmd[0])
	if err != nil {
		fmt.Fprintf(stderr, "sudo: %s: command not found\n", cmd[0])
		return 1
	}
	err = syscall.Exec(path, cmd, os.Environ())
	fmt.Fprintf(stderr, "sudo: %s: %v\n", cmd[0], err)
	return 1
}

// sudoOptArg are sudo's options that take a value as the next argument.
var sudoOptArg = []string{"-u", "-g", "-p", "-C", "-D", "-h", "-r", "-t", "-T", "-U", "-R"}

// sudoCommand splits sudo's arguments into the user asked for ("root"
// when none), the command, and whether they were understood (no -i, -s,
// -e, -l, -v, -k alone…: what has no command to run).
func sudoCommand(args []string) (user string, cmd []string, ok bool) {
	user = "root"
	for i := 0; i < len(args); i++ {
		a := args[i]
		switch {
		case a == "--":
			return user, args[i+1:], true
		case a == "-u" && i+1 < len(args):
			user = args[i+1]
			i++
		case strings.HasPrefix(a, "--user="):
			user = strings.TrimPrefix(a, "--user=")
		case strings.HasPrefix(a, "-u") && len(a) > 2:
			user = a[2:]
		case slices.Contains(sudoOptArg, a):
			i++
		case a == "-E" || a == "-H" || a == "-n" || a == "-S" || a == "-P" || a == "-A" || a == "-B" || a == "-N" ||
			strings.HasPrefix(a, "--preserve-env") || a == "--non-interactive" || a == "--stdin" || a == "--set-home":
		case strings.HasPrefix(a, "-"):
			return user, nil, false // a shell, an edit, a listing: nothing to stand in for
		default:
			return user, args[i:], true
		}
	}
	return user, nil, true
}

// sudoSelf reports whether user names the box's own user: its name, or
// its uid as #UID.
func sudoSelf(user string) bool {
	return user == sandbox.UserName || user == "#"+strconv.Itoa(os.Getuid())
}

// isSudo reports whether the binary was started as sudo.
func isSudo() bool { return filepath.Base(os.Args[0]) == sudoName }
