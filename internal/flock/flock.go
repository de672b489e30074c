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
