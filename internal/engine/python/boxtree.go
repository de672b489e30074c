package python

import (
	"path/filepath"

	"github.com/quro-dev/quro/internal/sandbox"
)

// BoxTree is where a box shows the embedded interpreter's tree: a link
// (sandbox.Options.Links, BoxLinks) to the tree, which the box shows at
// its host path. Run through it, the interpreter's sys.executable and
// sys.prefix are box paths: no host path (the data directory's) in what
// the session's code reads of its Python.
const BoxTree = sandbox.RunDir + "/python"

// boxPython is the box path of the interpreter python (a host path in
// the tree at tree), when sb's boxes have the link BoxTree to tree; else
// python itself.
func boxPython(sb *sandbox.Sandbox, tree, python string) string {
	if tree == "" {
		return python
	}
	rel, err := filepath.Rel(tree, python)
	if err != nil || !filepath.IsLocal(rel) {
		return python
	}
	if t, ok := sb.LinkTarget(BoxTree); ok && t == tree {
		return BoxTree + "/" + filepath.ToSlash(rel)
	}
	return python
}
