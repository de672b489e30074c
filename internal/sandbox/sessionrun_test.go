package sandbox

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"
)

// A run in a session's directory is spawned in that session's box, or
// names why it is not: a Spec that forgot its session is refused rather
// than given a box of its own (which a pause would not freeze nor a
// destroy kill), and so is one that names another session's box.
func TestARunInASessionDirectoryNamesItsBox(t *testing.T) {
	root := t.TempDir()
	sessionOf := func(dir string) (string, bool) {
		rel, err := filepath.Rel(root, dir)
		if err != nil || strings.HasPrefix(rel, "..") || rel == "." {
			return "", false
		}
		return strings.SplitN(rel, "/", 2)[0], true
	}
	s := &Sandbox{sessionOf: sessionOf}
	ws := filepath.Join(root, "aaaa", "workspace")
	for _, tc := range []struct {
		name string
		sb   *Sandbox
		spec Spec
		ok   bool
	}{
		{"its session", s, Spec{Dir: ws, Session: "aaaa"}, true},
		{"a ForSession sandbox", s.ForSession("aaaa", 0, nil), Spec{Dir: ws}, true},
		{"named outside", s, Spec{Dir: ws, Outside: "a fetch in the session's tenant"}, true},
		{"not in a session's directory", s, Spec{Dir: t.TempDir()}, true},
		{"forgot its session", s, Spec{Dir: ws}, false},
		{"another session's box", s, Spec{Dir: ws, Session: "bbbb"}, false},
		{"another session's ForSession sandbox", s.ForSession("bbbb", 0, nil), Spec{Dir: ws}, false},
	} {
		err := tc.sb.checkSessionRun(&tc.spec)
		if tc.ok && err != nil || !tc.ok && !errors.Is(err, ErrInvalidSpec) {
			t.Errorf("%s: %v", tc.name, err)
		}
	}
	// Through Start: refused before anything is made.
	if _, err := s.Start(t.Context(), &Spec{Args: []string{"true"}, Dir: ws}); !errors.Is(err, ErrInvalidSpec) || !strings.Contains(err.Error(), "names no session box") {
		t.Errorf("Start: %v", err)
	}
}
