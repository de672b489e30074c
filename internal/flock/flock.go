// Package flock is the server's one exclusive file lock, held across quro
// processes and goroutines alike: the data directory's store, the embedded
// Python's extraction, a tenant's pip cache.
package flock

import (
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// Lock takes an exclusive flock on path (made, mode 0600, if missing),
// waiting for other holders; waiting, when not nil, is called first if
// someone else holds it. unlock releases it.
func Lock(path string, waiting func()) (unlock func(), err error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, err
	}
	if waiting != nil && errors.Is(unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB), unix.EWOULDBLOCK) {
		waiting()
	}
	for {
		err = unix.Flock(int(f.Fd()), unix.LOCK_EX)
		if !errors.Is(err, unix.EINTR) {
			break
		}
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("locking %s: %w", path, err)
	}
	return func() {
		_ = unix.Flock(int(f.Fd()), unix.LOCK_UN) // and if not, the Close releases it
		f.Close()
	}, nil
}

// TryLock takes an exclusive flock on path (made, mode 0600, if missing)
// without waiting: ok is false, and nothing is held, when someone else
// holds it.
func TryLock(path string) (unlock func(), ok bool, err error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, false, err
	}
	err = unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
	if errors.Is(err, unix.EWOULDBLOCK) || errors.Is(err, unix.EINTR) {
		f.Close()
		return nil, false, nil
	}
	if err != nil {
		f.Close()
		return nil, false, fmt.Errorf("locking %s: %w", path, err)
	}
	return func() {
		_ = unix.Flock(int(f.Fd()), unix.LOCK_UN) // and if not, the Close releases it
		f.Close()
	}, true, nil
}

// Shared takes a shared flock on path (made, mode 0600, if missing),
// waiting for an exclusive holder: held by whoever uses what path guards,
// so that TryRemove does not remove it meanwhile. A lock file that
// TryRemove unlinked while this waited is not the one at path any more:
// it is opened again.
func Shared(path string) (unlock func(), err error) {
	for {
		f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
		if err != nil {
			return nil, err
		}
		for {
			err = unix.Flock(int(f.Fd()), unix.LOCK_SH)
			if !errors.Is(err, unix.EINTR) {
				break
			}
		}
		if err != nil {
			f.Close()
			return nil, fmt.Errorf("locking %s: %w", path, err)
		}
		if same(f, path) {
			return func() {
				_ = unix.Flock(int(f.Fd()), unix.LOCK_UN)
				f.Close()
			}, nil
		}
		f.Close()
	}
}

// TryRemove takes path's flock exclusively without waiting: when nobody
// holds it (Shared), it calls remove, and when that removed what the lock
// guards (true), unlinks the lock file and reports true; when someone
// holds it, it calls nothing and reports false. existed tells remove
// whether the lock file was there before: what it guards may then be
// used by a program that takes no lock. A lock file TryRemove made is
// not left behind.
func TryRemove(path string, remove func(existed bool) (bool, error)) (bool, error) {
	existed := true
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if errors.Is(err, os.ErrNotExist) {
		existed = false
		f, err = os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	}
	if err != nil {
		return false, err
	}
	defer f.Close()
	err = unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
	if errors.Is(err, unix.EWOULDBLOCK) || errors.Is(err, unix.EINTR) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("locking %s: %w", path, err)
	}
	defer unix.Flock(int(f.Fd()), unix.LOCK_UN) //nolint:errcheck // and if not, the Close releases it
	if !same(f, path) {
		return false, nil // removed and made again meanwhile: another pass
	}
	removed, err := remove(existed)
	if !removed || err != nil {
		if !existed {
			os.Remove(path)
		}
		return false, err
	}
	// Unlinked before the unlock: a Shared that opened this file and now
	// gets it finds another (or none) at path, and opens that.
	return true, os.Remove(path)
}

// same reports whether f is still the file at path.
func same(f *os.File, path string) bool {
	var a, b unix.Stat_t
	if unix.Fstat(int(f.Fd()), &a) != nil || unix.Stat(path, &b) != nil {
		return false
	}
	return a.Dev == b.Dev && a.Ino == b.Ino
}
