//go:build !slim

package main

import (
	"bufio"
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestServePreparesPythonAtStart: `quro serve` on an empty data directory
// extracts the embedded Python by itself, before any run asks for it, and
// says so in its log: one line as it starts, one as it ends (with the
// directory, which then holds the complete tree).
func TestServePreparesPythonAtStart(t *testing.T) {
	// Its own server on its own data directory, as the parallel serve tests.
	t.Parallel()
	data := t.TempDir() // not seeded: the server extracts
	ctx, cancel := context.WithCancel(context.Background())
	outR, outW := io.Pipe()
	errR, errW := io.Pipe()
	root := newRoot(strings.NewReader(""), outW, errW)
	root.SetArgs([]string{"serve", "--addr", "127.0.0.1:0", "--data", data})
	done := make(chan error, 1)
	go func() { done <- root.ExecuteContext(ctx); outW.Close(); errW.Close() }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	go io.Copy(io.Discard, outR)

	lines := make(chan string)
	go func() {
		sc := bufio.NewScanner(errR)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
		io.Copy(io.Discard, errR)
	}()
	var log []string
	prepared := ""
	guard := time.After(5 * time.Minute) // only a guard against waiting forever
wait:
	for {
		select {
		case line, ok := <-lines:
			if !ok {
				break wait
			}
			log = append(log, line)
			if strings.Contains(line, `msg="embedded Python prepared"`) {
				prepared = line
				break wait
			}
			if strings.Contains(line, "level=WARN") && strings.Contains(line, "embedded Python") {
				break wait // failed: said below
			}
		case <-guard:
			break wait
		}
	}
	go func() {
		for range lines {
		}
	}()
	if prepared == "" {
		t.Fatalf("the log ended without the preparation's end:\n%s", strings.Join(log, "\n"))
	}
	if !strings.Contains(strings.Join(log, "\n"), `msg="preparing the embedded Python (first start on this data directory)"`) {
		t.Errorf("no line at the preparation's start:\n%s", strings.Join(log, "\n"))
	}
	dirs, _ := filepath.Glob(filepath.Join(data, "python", "3.*"))
	if len(dirs) != 1 || !strings.Contains(prepared, "dir="+dirs[0]) {
		t.Fatalf("extracted %v; the log says %s", dirs, prepared)
	}
	if _, err := os.Stat(filepath.Join(dirs[0], ".quro-complete")); err != nil {
		t.Fatalf("the tree is not complete: %v", err)
	}
}
