package boxfs

import (
	"errors"
	"path"
	"strings"
	"testing"

	"github.com/quro-dev/quro/internal/hostpath"
	"github.com/quro-dev/quro/internal/workspace"
)

// routeCases are spellings a session may use to make the server take a
// path for the workspace's while it names the box's (or the reverse).
var routeCases = []string{
	"/home/user", "/home/user/", "//home/user", "//home/user/x", "/home/user/./x", "/home/user/x/",
	"/home/user/../tmp", "/home/user/../tmp/x", "/home/user/..", "/home/user/../../etc/passwd",
	"/home/user/x/../../user/y", "/home/user/x/../../user2/y", "/home/user2", "/home/user2/x", "/home/userx",
	"/home/./user/x", "/home/../home/user/x", "/./home/user", "/../home/user/x", "///tmp", "/tmp/../home/user/x",
	"/home/usér/x", "/home/user\u200b/x", "/HOME/USER/x", "/home/user/\n/x", "/home/user/..x", "/home/user/...",
	"~", "~/x", "~/../tmp", "~user/x", "x", "./x", "../x", "x/../../tmp", "", ".",
}

// TestRouteAgreesWithWorkspace: every path the server sends to the
// workspace (IsBoxPath false) is one workspace.FS takes inside the
// workspace, and every path it sends to the box is one workspace.FS
// refuses as outside it: no spelling is served by the server's own
// os.Root as a path of the box, nor reaches the box as the workspace's
// while the server thinks otherwise.
func TestRouteAgreesWithWorkspace(t *testing.T) {
	w, err := workspace.Open(t.TempDir(), workspace.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	for _, p := range routeCases {
		checkRoute(t, w, p)
	}
}

func checkRoute(t *testing.T, w *workspace.FS, p string) {
	t.Helper()
	rel, werr := w.Rel(p)
	if IsBoxPath(p) {
		if !errors.Is(werr, workspace.ErrOutside) && !errors.Is(werr, workspace.ErrInvalid) {
			t.Errorf("%q goes to the box, but the workspace takes it as %q (%v)", p, rel, werr)
		}
		c, err := Path(p)
		if err == nil && (c == hostpath.Home || strings.HasPrefix(c, hostpath.Home+"/")) {
			t.Errorf("%q goes to the box as the workspace's %q", p, c)
		}
		return
	}
	if werr == nil && (rel == ".." || strings.HasPrefix(rel, "../") || path.IsAbs(rel)) {
		t.Errorf("%q goes to the workspace as %q, outside it", p, rel)
	}
}

// FuzzRoute: checkRoute for any path.
func FuzzRoute(f *testing.F) {
	for _, p := range routeCases {
		f.Add(p)
	}
	f.Fuzz(func(t *testing.T, p string) {
		w, err := workspace.Open(t.TempDir(), workspace.Options{})
		if err != nil {
			t.Fatal(err)
		}
		defer w.Close()
		checkRoute(t, w, p)
	})
}
