package app

import (
	"cmp"
	"context"
	"errors"
	"io"
	"os"
	"path"
	"strings"
	"sync"
	"time"

	"github.com/quro-dev/quro/internal/boxfs"
	"github.com/quro-dev/quro/internal/boxfs/boxhelper"
	"github.com/quro-dev/quro/internal/capability"
	"github.com/quro-dev/quro/internal/hostpath"
	"github.com/quro-dev/quro/internal/sandbox"
	"github.com/quro-dev/quro/internal/session"
	"github.com/quro-dev/quro/internal/workspace"
)

// The file capabilities reach two places. Paths relative to the workspace,
// /home/user and under it (and ~) go through internal/workspace: the
// server's own os.Root at the workspace, atomic writes, its guarantees.
// Any other absolute path is a path of the session's box (its /tmp, what
// its code made elsewhere, the read-only system directories) and goes
// through internal/boxfs: the operation runs inside the box as a program
// of the session, so it reaches what the session's code reaches, with the
// same permissions, and nothing of the server's.

// fileOps is what the file capabilities call: a workspace.FS or a
// boxfs.FS.
type fileOps interface {
	Read(p string, offset, limit int64) (*workspace.Content, error)
	Write(p string, data []byte, appendTo bool) (*workspace.Written, error)
	Info(p string) (*workspace.Entry, error)
	List(p string, o workspace.ListOptions) (*workspace.Listing, error)
	MakeDir(p string) (*workspace.Entry, bool, error)
	Move(src, dst string) (*workspace.Entry, error)
	Remove(p string) (string, error)
	Options() workspace.Options
}

// boxOps wraps a boxfs.FS: workspace paths given beside a box path (a
// move from /tmp into the workspace) are named /home/user/… for the box,
// which shows the workspace there.
type boxOps struct{ *boxfs.FS }

func inBox(p string) string {
	switch {
	case path.IsAbs(p):
		return p
	case p == "~" || strings.HasPrefix(p, "~/"):
		return hostpath.Home + p[1:]
	}
	return path.Join(hostpath.Home, p)
}

func (b boxOps) Read(p string, offset, limit int64) (*workspace.Content, error) {
	return b.FS.Read(inBox(p), offset, limit)
}

func (b boxOps) Write(p string, data []byte, appendTo bool) (*workspace.Written, error) {
	return b.FS.Write(inBox(p), data, appendTo)
}
func (b boxOps) Info(p string) (*workspace.Entry, error) { return b.FS.Info(inBox(p)) }
func (b boxOps) List(p string, o workspace.ListOptions) (*workspace.Listing, error) {
	return b.FS.List(inBox(p), o)
}
func (b boxOps) MakeDir(p string) (*workspace.Entry, bool, error) { return b.FS.MakeDir(inBox(p)) }
func (b boxOps) Move(src, dst string) (*workspace.Entry, error) {
	return b.FS.Move(inBox(src), inBox(dst))
}
func (b boxOps) Remove(p string) (string, error) { return b.FS.Remove(inBox(p)) }

// openFiles opens what the paths of a file call reach in the session the
// call entered: the workspace, or the session's box when one of them is
// a path of the box outside the workspace. close releases it.
func (a *App) openFiles(ctx context.Context, paths ...string) (sess *session.Session, ops fileOps, close func(), err error) {
	sess, err = entered(ctx)
	if err != nil {
		return nil, nil, nil, err
	}
	box := false
	for _, p := range paths {
		if boxfs.IsBoxPath(p) && !a.hostWorkspacePath(sess, p) {
			box = true
		}
	}
	if !box {
		_, w, err := a.openSessionFS(sess)
		if err != nil {
			return nil, nil, nil, err
		}
		return sess, w, func() { _ = w.Close() }, nil
	}
	if !a.Sandbox.SessionBoxes() {
		return nil, nil, nil, capability.Errorf(capability.Unavailable, "%v: give a path under %s (the session workspace), or reach other paths with commands", boxfs.ErrNoBox, hostpath.Home)
	}
	if bx := a.Sandbox.Box(sess.ID); bx != nil && bx.Paused() {
		return nil, nil, nil, capability.Errorf(capability.Unavailable,
			"session %s is paused, and paths outside %s are reached in its box: resume it (resume_session, or any run in it), then call again", sess.Name, hostpath.Home)
	}
	opts := workspace.Options{Names: boxNames(a.sessionUID(sess))}
	return sess, boxOps{boxfs.New(ctx, a.boxFilesRunner(sess), opts)}, func() {}, nil
}

// hostWorkspacePath: p is the workspace's host path or under it (the
// server's own callers name it so); workspace.FS takes it.
func (a *App) hostWorkspacePath(sess *session.Session, p string) bool {
	ws := sess.Workspace()
	c := path.Clean(p)
	return c == ws || strings.HasPrefix(c, ws+"/")
}

// sessionUID is the uid the session's files belong to as the box names
// them (see openSessionFS).
func (a *App) sessionUID(sess *session.Session) int {
	if uid := os.Geteuid(); uid != 0 {
		return uid
	}
	return sess.UID
}

// boxFilesTimeout bounds one operation of the box's file helper.
const boxFilesTimeout = 2 * time.Minute

// boxFiles holds each session's long-lived file helper (boxfs.Helper):
// started on the session's first call on a box path, stopped after
// boxfs.DefaultIdle unused, when the session is paused (sessionBoxes),
// and at its end (the "box files" ender).
type boxFiles struct {
	mu      sync.Mutex
	helpers map[string]*boxfs.Helper
}

// helper is session id's helper, made with start on first use.
func (f *boxFiles) helper(id string, start boxfs.Starter) *boxfs.Helper {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.helpers == nil {
		f.helpers = map[string]*boxfs.Helper{}
	}
	h := f.helpers[id]
	if h == nil {
		h = boxfs.NewHelper(start, boxfs.DefaultIdle)
		f.helpers[id] = h
	}
	return h
}

// stop ends session id's helper process (a pause); the next call starts
// another.
func (f *boxFiles) stop(id string) {
	f.mu.Lock()
	h := f.helpers[id]
	f.mu.Unlock()
	if h != nil {
		h.Stop()
	}
}

// forget ends session id's helper for good (the session ended).
func (f *boxFiles) forget(id string) {
	f.mu.Lock()
	h := f.helpers[id]
	delete(f.helpers, id)
	f.mu.Unlock()
	if h != nil {
		h.Close()
	}
}

// count is how many sessions have a helper (the leak test's).
func (f *boxFiles) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.helpers)
}

// boxFilesSpec is the helper's run in the session's box, as its
// processes run (start_process): its uid, binds, rootfs and network,
// HOME /home/user, and none of the session's variables (the helper is
// quro's, not the session's program; its answers are checked all the
// same).
func (a *App) boxFilesSpec(sess *session.Session, args ...string) (*sandbox.Spec, error) {
	spec := sess.Spec(append([]string{sandbox.BinDir + "/quro"}, args...)...)
	spec.Env = map[string]string{}
	spec.Home = sandbox.HomeUser
	if sess.Rootfs != "" {
		dir, err := RootfsDir(a.DataDir)(sess.Rootfs)
		if err != nil {
			return nil, err
		}
		spec.Rootfs = dir
	}
	return spec, nil
}

// boxFilesRunner serves boxfs's operations through the session's
// long-lived helper, each bounded by boxFilesTimeout: a helper still
// working after it is stuck on something the session made, and is
// killed (the next call starts another).
func (a *App) boxFilesRunner(sess *session.Session) boxfs.Runner {
	h := a.boxFiles.helper(sess.ID, func(lifetime context.Context, stdin, stdout *os.File) (int, <-chan struct{}, error) {
		spec, err := a.boxFilesSpec(sess, boxhelper.Arg, boxhelper.ServeOp)
		if err != nil {
			return 0, nil, err
		}
		spec.Stdin, spec.Stdout = stdin, stdout
		p, err := a.Sandbox.Start(lifetime, spec)
		if err != nil {
			return 0, nil, err
		}
		done := make(chan struct{})
		go func() {
			p.Wait()
			close(done)
		}()
		return p.Pid(), done, nil
	})
	return func(ctx context.Context, args []string, stdin []byte, max int64, stdout io.Writer) (int, error) {
		limit := cmp.Or(a.boxFilesTimeout, boxFilesTimeout)
		ctx, cancel := context.WithTimeout(ctx, limit)
		defer cancel()
		code, err := h.Run(ctx, args, stdin, max, stdout)
		if err != nil && errors.Is(ctx.Err(), context.DeadlineExceeded) {
			// args: boxhelper.Arg, the operation, the box path, …
			return 0, capability.Errorf(capability.DeadlineExceeded, "%s: the file operation in the session's box took over %s and was stopped (a file the session's code holds up?)", args[min(2, len(args)-1)], limit)
		}
		return code, err
	}
}
