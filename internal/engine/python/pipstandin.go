package python

// PipFallback is the exit status of `quro __pip ARGS…` (cmd/quro's pip
// stand-in) that means "not mine": the shim then runs the local pip.
const PipFallback = 87

// PipStandIn is the quro binary in every box (sandbox.BinDir/quro), which
// the shims ask first in a session without network when the box has the
// server's in-session socket PipStandInSocket (insession.SocketInBox:
// sessions of quro serve only; a test binary in a box of another package's
// tests is never run as the stand-in). cmd/quro's tests check both.
const (
	PipStandIn       = "/run/quro/bin/quro"
	PipStandInSocket = "/run/quro/api.sock"
)
