//go:build !slim && linux && amd64

package python

import (
	"embed"
	"io/fs"
	"runtime"
	"sync"
)

// precompiledFS is precompiled/: its README.md always, and the archive
// when it was generated.
//
//go:embed precompiled
var precompiledFS embed.FS

// precompiledArchive is this platform's archive (see precompiled.go), nil
// when the build has none. It is read on first use, not in package
// initialisation: every quro process that runs the whole initialisation
// (each CLI command, and in a box the esbuild child of each TS/JS
// transform, the gpython child, the pip, apt-get and sudo stand-ins)
// paid a 4.2 MB allocation and copy there that only the server's
// extraction uses.
var precompiledArchive = sync.OnceValue(func() []byte {
	b, _ := fs.ReadFile(precompiledFS, "precompiled/"+precompiledName(runtime.GOOS, runtime.GOARCH))
	return b
})
