// Command fakesudo stands in for sudo in test/install/test.sh: installed
// setuid root, it records its arguments and runs them as root with an
// environment reset the way sudo's env_reset does (only PATH is kept), so
// the Makefile's install step is tested as a sudo user runs it.
package main

import (
	"fmt"
	"os"
	"os/exec"
	"syscall"
)

func main() {
	log := os.Args[1] // the file that records the call (fixed when built into the test)
	args := os.Args[2:]
	f, err := os.OpenFile(log, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		fmt.Fprintln(os.Stderr, "fakesudo:", err)
		os.Exit(1)
	}
	fmt.Fprintf(f, "sudo %s\n", joinArgs(args))
	f.Close()
	if err := syscall.Setgid(0); err != nil {
		fmt.Fprintln(os.Stderr, "fakesudo: setgid:", err)
		os.Exit(1)
	}
	if err := syscall.Setuid(0); err != nil {
		fmt.Fprintln(os.Stderr, "fakesudo: setuid:", err)
		os.Exit(1)
	}
	path, err := exec.LookPath(args[0])
	if err != nil {
		fmt.Fprintln(os.Stderr, "fakesudo:", err)
		os.Exit(1)
	}
	env := []string{"PATH=" + os.Getenv("PATH")}
	if err := syscall.Exec(path, args, env); err != nil {
		fmt.Fprintln(os.Stderr, "fakesudo: exec:", err)
		os.Exit(1)
	}
}

func joinArgs(a []string) string {
	s := ""
	for i, x := range a {
		if i > 0 {
			s += " "
		}
		s += x
	}
	return s
}
