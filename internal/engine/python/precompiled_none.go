//go:build !slim && !(linux && amd64)

package python

// precompiledArchive: only linux/amd64 ships one (see precompiled.go); this
// platform's standard library is compiled at extraction.
func precompiledArchive() []byte { return nil }
