//go:build !slim && linux && amd64

package python

import (
	"embed"
	"io/fs"
	"runtime"
)

// precompiledFS is precompiled/: its README.md always, and the archive
// when it was generated.
//
//go:embed precompiled
var precompiledFS embed.FS

// precompiledArchive is this platform's archive (see precompiled.go), nil
// when the build has none.
var precompiledArchive, _ = fs.ReadFile(precompiledFS, "precompiled/"+precompiledName(runtime.GOOS, runtime.GOARCH))
