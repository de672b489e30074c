package main

import (
	"bytes"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/quro-dev/quro/internal/engine/python"
)

// TestPythonCacheFallsBackWithALogLine: --python-cache names the install
// root the App gets when the directory can be used; one that others can
// write is refused with a log line naming why, and the data directory is
// used (InstallRoot ""); off is the data directory without a line.
func TestPythonCacheFallsBackWithALogLine(t *testing.T) {
	t.Parallel()
	good := filepath.Join(t.TempDir(), "cache")
	open := filepath.Join(t.TempDir(), "open")
	if err := os.Mkdir(open, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(open, 0o777); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ flag, root, log string }{
		{good, good, ""},
		{open, "", "the embedded Python is prepared in the data directory"},
		{python.CacheOff, "", ""},
	} {
		var buf bytes.Buffer
		g := &globals{pythonCache: c.flag}
		opts := g.options(slog.New(slog.NewTextHandler(&buf, nil)))
		if got := opts.Python.InstallRoot; got != c.root {
			t.Errorf("--python-cache %s: install root %q, want %q", c.flag, got, c.root)
		}
		switch {
		case c.log == "" && buf.Len() > 0:
			t.Errorf("--python-cache %s: logged %s", c.flag, buf.String())
		case c.log != "" && (!strings.Contains(buf.String(), c.log) || !strings.Contains(buf.String(), "writable by others")):
			t.Errorf("--python-cache %s: logged %q, want %q and why", c.flag, buf.String(), c.log)
		}
	}
}
