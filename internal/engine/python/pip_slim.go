//go:build slim

package python

import "github.com/quro-dev/quro/internal/sandbox"

// PipVersion is the version of the pip sessions get: none in a slim build
// (no embedded interpreter, no pip).
const PipVersion = ""

// OfflineHint: see the full build.
const OfflineHint = ""

// PipDir is empty in a slim build: it has no pip.
func PipDir(root string) string { return "" }

// ShimDirs are empty in a slim build: boxes keep the userland's python3.
func ShimDirs(root string) (host, rootfs string) { return "", "" }

// BoxPlaces are, in a slim build (no embedded interpreter), the worker
// module's directory at BoxWorker (a rootfs's worker runs it).
func BoxPlaces(root string) []sandbox.Bind {
	return []sandbox.Bind{{Src: workerDir(root), Dst: BoxWorker}}
}
