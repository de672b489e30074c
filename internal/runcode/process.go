package runcode

import (
	"fmt"
	"time"

	"github.com/quro-dev/quro/internal/sandbox"
)

// ProcessSpec is the sandbox spec for running args in req's session: the
// workspace as working directory and HOME, the session's tmp directory, its
// variables, its network policy, req's output writers and req.Timeout as
// the run's timeout (which the sandbox counts from the program's start). Inside the box
// the workspace and tmp directory keep their host paths, so paths in
// results (stdout_file, …) are valid for the session's code too.
//
// The session's rootfs is a name; engines that run on a rootfs set
// Spec.Rootfs to its directory themselves (see python.Rootfs).
func ProcessSpec(req *Request, args ...string) *sandbox.Spec {
	spec := req.Session.Spec(args...)
	spec.Stdout, spec.Stderr = req.Stdout, req.Stderr
	spec.Timeout = req.Timeout // counted from the program's start, not its box's
	return spec
}

// ExitResult turns how a sandboxed process ended into a Result: the one
// wording of a timeout, a cancel, the memory limit and a killing signal.
func ExitResult(e sandbox.Exit, timeout time.Duration) *Result {
	res := &Result{ExitCode: e.Code}
	switch {
	case e.TimedOut:
		res.TimedOut, res.Interrupted = true, true
		res.Error = fmt.Sprintf("timed out after %s; the process group was killed (output so far is kept)", timeout.Round(time.Millisecond))
	case e.Canceled:
		res.Interrupted = true
		res.Error = "canceled by the caller; the process group was killed"
	case e.OOMKilled:
		res.OOMKilled = true
		res.Notes = append(res.Notes, "killed: "+e.OOM.Reason())
	case e.Signal != 0:
		res.Notes = append(res.Notes, fmt.Sprintf("killed by signal %d (%s)", int(e.Signal), e.Signal))
	}
	if e.Abandoned {
		res.Notes = append(res.Notes, "a process that left the run's process group kept the output open; its later output was not read")
	}
	return res
}
