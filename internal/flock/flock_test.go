package flock

import (
	"os"
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

// TryRemove removes nothing while another holds the lock shared, and
// removes once the holder is gone; a Shared that waited behind the
// removal holds a lock file at the path, not the unlinked one.
func TestTryRemoveSkipsAHeldLock(t *testing.T) {
	path := filepath.Join(t.TempDir(), "x.lock")
	unlock, err := Shared(path)
	if err != nil {
		t.Fatal(err)
	}
	calls := 0
	remove := func(existed bool) (bool, error) {
		calls++
		if !existed {
			t.Error("the lock file was there")
		}
		return true, nil
	}
	if ok, err := TryRemove(path, remove); ok || err != nil || calls != 0 {
		t.Fatalf("TryRemove of a held lock: %v, %v, %d calls", ok, err, calls)
	}
	unlock()
	if ok, err := TryRemove(path, remove); !ok || err != nil || calls != 1 {
		t.Fatalf("TryRemove of a free lock: %v, %v, %d calls", ok, err, calls)
	}
	if _, err := os.Lstat(path); !os.IsNotExist(err) {
		t.Fatalf("the lock file is left: %v", err)
	}
	// One TryRemove made is unlinked when it removes nothing.
	if ok, _ := TryRemove(path, func(existed bool) (bool, error) {
		if existed {
			t.Error("the lock file was not there")
		}
		return false, nil
	}); ok {
		t.Fatal("removed")
	}
	if _, err := os.Lstat(path); !os.IsNotExist(err) {
		t.Fatalf("the lock file TryRemove made is left: %v", err)
	}
}

// A Shared that opened the lock file before TryRemove unlinked it, and
// got it after, holds the file now at the path.
func TestSharedAfterARemovalHoldsTheNewFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "x.lock")
	removing := make(chan struct{})
	goOn := make(chan struct{})
	done := make(chan bool)
	go func() {
		ok, err := TryRemove(path, func(bool) (bool, error) {
			close(removing)
			<-goOn
			return true, nil
		})
		if err != nil {
			t.Error(err)
		}
		done <- ok
	}()
	<-removing
	got := make(chan func())
	go func() {
		u, err := Shared(path) // opens the file TryRemove holds, and waits
		if err != nil {
			t.Error(err)
		}
		got <- u
	}()
	close(goOn)
	if !<-done {
		t.Fatal("TryRemove removed nothing")
	}
	unlock := <-got
	defer unlock()
	if ok, err := TryRemove(path, func(bool) (bool, error) { return true, nil }); ok || err != nil {
		t.Fatalf("TryRemove took a lock Shared holds: %v, %v", ok, err)
	}
}

// TryLock takes a free lock, and refuses at once, holding nothing, while
// another holds it.
func TestTryLockDoesNotWait(t *testing.T) {
	path := filepath.Join(t.TempDir(), "x.lock")
	unlock, ok, err := TryLock(path)
	if !ok || err != nil {
		t.Fatalf("a free lock: %v, %v", ok, err)
	}
	if u, ok, err := TryLock(path); ok || err != nil || u != nil {
		t.Fatalf("a held lock: %v, %v", ok, err)
	}
	unlock()
	unlock, ok, err = TryLock(path)
	if !ok || err != nil {
		t.Fatalf("once released: %v, %v", ok, err)
	}
	unlock()
}
