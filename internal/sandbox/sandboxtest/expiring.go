package sandboxtest

import (
	"context"
	"sync"
)

// Expiring is a context whose deadline passes when Expire is called: a
// run's timeout at an event of the run (it printed, it read its input),
// never at a time, which a loaded machine passes before the event. Its
// values are the embedded Context's, which a test may set after
// NewExpiring (a value whose hook calls Expire).
type Expiring struct {
	context.Context
	done chan struct{}
	once sync.Once
}

// NewExpiring is an Expiring over parent (its values; its own end is not
// followed).
func NewExpiring(parent context.Context) *Expiring {
	return &Expiring{Context: parent, done: make(chan struct{})}
}

// Done is closed when Expire is called.
func (c *Expiring) Done() <-chan struct{} { return c.done }

// Err is context.DeadlineExceeded once Expire was called, else nil.
func (c *Expiring) Err() error {
	select {
	case <-c.done:
		return context.DeadlineExceeded
	default:
		return nil
	}
}

// Expire passes the deadline (once; later calls do nothing).
func (c *Expiring) Expire() { c.once.Do(func() { close(c.done) }) }
