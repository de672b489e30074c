package python

import (
	"crypto/rand"
	"encoding/hex"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/quro-dev/quro/internal/rootfs"
	"github.com/quro-dev/quro/internal/rootfs/rootfstest"
	"github.com/quro-dev/quro/internal/runcode/enginetest"
	"github.com/quro-dev/quro/internal/sandbox"
	"github.com/quro-dev/quro/internal/session"
)

// perRunStart is the loop's budget of the engines that start a box and
// an interpreter for each run (system, gpython): that start is inside the
// budget, and at a load of 60 it took over 3 s (enginetest's default),
// so the loop had printed nothing when its budget ended.
const perRunStart = 10 * time.Second

// pythonCaps are the contract snippets of Python 3. The embedded worker
// shows the value of a last bare expression, as a notebook does, so the
// snippets end with statements. Loop sleeps rather than spins (see the
// toolchain engine's contractCaps): the timeout check's run of it lasts
// its whole budget, 10 s for the system and gpython tiers, a core's worth
// of CPU each when it spun. A busy loop's timeout keeping the state is
// TestEarlyInterruptIsNotLost's (embedded) and
// TestRootfsWorkerTimeoutKeepsState's, gpython's TestGPython's.
func pythonCaps(stateful bool) enginetest.Caps {
	return enginetest.Caps{
		Lang:       "python",
		Stateful:   stateful,
		Print:      "import sys\nprint('contract-out')\nprint('contract-err', file=sys.stderr)",
		Exit:       "import sys\nprint('bye')\nsys.exit(3)",
		ExitCode:   3,
		Loop:       "import sys, time\nprint('before-loop')\nsys.stdout.flush()\nwhile True:\n    time.sleep(3600)",
		Huge:       "for i in range(100000):\n    print(i)",
		BadUTF8:    "import sys\n_ = sys.stdout.buffer.write(b'a\\xff\\xfeb\\n')",
		BadUTF8Raw: []byte("a\xff\xfeb\n"),
		SetVar:     "x = 42",
		GetVar:     "print(globals().get('x', 'unset'))",
	}
}

// contractSession is a session for the contract suite, on the host
// userland or on the rootfs named rootfsName.
func contractSession(rootfsName string) func(t *testing.T) *session.Session {
	return func(t *testing.T) *session.Session {
		t.Helper()
		var b [8]byte
		rand.Read(b[:])
		s := &session.Session{ID: "c" + hex.EncodeToString(b[:]), Dir: filepath.Join(t.TempDir(), "session"), Rootfs: rootfsName}
		for _, d := range []string{s.Workspace(), s.TmpDir()} {
			if err := os.MkdirAll(d, 0o755); err != nil {
				t.Fatal(err)
			}
		}
		return s
	}
}

// TestContract runs the run_code engine contract over every tier of the
// Python chain that can run here: the embedded worker (stateful; not in
// the slim build), the rootfs's python3 (a resident worker too, when the
// test rootfs is installed, see internal/app's testRootfs), the host's python3 and
// gpython (stateless, one process per run).
func TestContract(t *testing.T) {
	t.Parallel()
	sb, err := sandbox.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Run("embedded", func(t *testing.T) {
		e := contractEmbedded(t, sb)
		enginetest.Run(t, enginetest.Target{Engine: e, NewSession: func(t *testing.T) *session.Session {
			s := contractSession("")(t)
			t.Cleanup(func() { e.Stop(s.ID) })
			return s
		}, Required: embeddedInBuild}, pythonCaps(true))
	})
	t.Run("rootfs", func(t *testing.T) {
		m := rootfstest.Default(t)
		e := NewRootfsWorker(t.TempDir(), sb, m, nil)
		t.Cleanup(func() { e.Close() })
		enginetest.Run(t, enginetest.Target{Engine: e, NewSession: func(t *testing.T) *session.Session {
			s := contractSession(rootfs.DefaultName)(t)
			t.Cleanup(func() { e.Stop(s.ID) })
			return s
		}}, pythonCaps(true))
	})
	t.Run("system", func(t *testing.T) {
		caps := pythonCaps(false)
		caps.LoopTimeout = perRunStart
		enginetest.Run(t, enginetest.Target{Engine: NewSystem(sb), NewSession: contractSession(""), Required: true}, caps)
	})
	t.Run("gpython", func(t *testing.T) {
		caps := pythonCaps(false)
		caps.LoopTimeout = perRunStart
		caps.BadUTF8 = ""
		caps.Missing = map[string]string{"bad UTF-8": "gpython has no sys.stdout.buffer and its str cannot hold bytes that are not UTF-8"}
		enginetest.Run(t, enginetest.Target{Engine: NewGPython(sb), NewSession: contractSession(""), Required: true}, caps)
	})
}
