package quota

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"syscall"
	"testing"
)

// TestMain runs the package's tests in a mount namespace of their own
// (private propagation): every box made on the machine while a test's
// disk is mounted in the host's namespace holds a copy of that mount
// (see Disks.grow), and the boxes of other test processes (make test
// runs packages side by side) made TestQuotaRemountAndGrow's online
// resize meet "in use in another mount namespace". Here only this
// process's own boxes see its mounts, as the tests intend.
func TestMain(m *testing.M) {
	if os.Getenv("QURO_QUOTA_TEST_NS") != "" || os.Geteuid() != 0 {
		os.Exit(m.Run())
	}
	cmd := exec.Command(os.Args[0], os.Args[1:]...)
	cmd.Env = append(os.Environ(), "QURO_QUOTA_TEST_NS=1")
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	// Go makes the new namespace's mounts private (MS_REC|MS_PRIVATE).
	cmd.SysProcAttr = &syscall.SysProcAttr{Unshareflags: syscall.CLONE_NEWNS}
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case err == nil:
		os.Exit(0)
	case errors.As(err, &ee) && ee.ExitCode() >= 0:
		os.Exit(ee.ExitCode())
	}
	fmt.Fprintln(os.Stderr, "quota tests: running them in a mount namespace of their own:", err)
	os.Exit(1)
}
