package js

// settle does the Engine's background work now and waits until it is
// done: the VMs of finished runs closed and the pool of prepared VMs full
// again. No run may be in progress.
func settle(e *Engine) {
	e.pool.kick()
	e.pool.wait()
}
