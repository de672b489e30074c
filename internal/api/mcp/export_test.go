package mcp

// OnIdleClosed has f called after each idle session the handlers close,
// until the test ends (the returned func restores the previous hook).
func OnIdleClosed(f func()) (restore func()) {
	old := idleClosed.Swap(&f)
	return func() { idleClosed.Store(old) }
}

// OnStreamEnded has f called after each event stream the keepalive ends,
// until the test ends (the returned func restores the previous hook).
func OnStreamEnded(f func()) (restore func()) {
	old := streamEnded.Swap(&f)
	return func() { streamEnded.Store(old) }
}
