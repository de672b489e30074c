package flock

import (
	"path/filepath"
	"testing"
)

// A second Lock of the same file waits for the first holder's unlock, and
// says it waits.
func TestLockWaitsForTheHolder(t *testing.T) {
	path := filepath.Join(t.TempDir(), "x.lock")
	unlock, err := Lock(path, func() { t.Error("the first Lock waited") })
	if err != nil {
		t.Fatal(err)
	}
	waited := make(chan struct{})
	got := make(chan func(), 1)
	go func() {
		u, err := Lock(path, func() { close(waited) })
		if err != nil {
			t.Error(err)
		}
		got <- u
	}()
	<-waited
	select {
	case <-got:
		t.Fatal("the second Lock did not wait for the first holder")
	default:
	}
	unlock()
	(<-got)()
}
