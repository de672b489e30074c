package e2b_test

import (
	"encoding/base64"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/quro-dev/quro/internal/rootfs"
	"github.com/quro-dev/quro/internal/rootfs/rootfstest"
)

// E2B's code interpreter on a rootfs template: the sandbox's Python is the
// rootfs's python3 as a resident worker (issue 18), so its state is kept
// between executions and a matplotlib figure from Debian's
// python3-matplotlib comes back as a PNG result. It runs on the "sci" test
// rootfs (rootfstest.Derived: built once per machine, by whichever package's
// test needs it first), linked into the App's data directory, never changed.
func TestExecuteOnRootfsTemplate(t *testing.T) {
	dir := rootfstest.Derived(t, "sci", rootfstest.Sci).Dir
	e := newEnv(t, nil)
	if err := os.Symlink(dir, rootfs.DirIn(e.App.DataDir)); err != nil {
		t.Fatal(err)
	}
	sb := e.create(t, map[string]any{"templateID": "sci", "timeout": 600})
	id := sb.SandboxID
	if r := ofType(e.execute(t, id, map[string]any{"code": "import sys\nx = 41\nsys.executable"}), "result"); len(r) != 1 || !strings.Contains(fmt.Sprint(r[0]["text"]), "/usr/bin/python3") {
		t.Fatalf("the rootfs's python3: %v", r)
	}
	if r := ofType(e.execute(t, id, map[string]any{"code": "x + 1"}), "result"); len(r) != 1 || r[0]["text"] != "42" {
		t.Fatalf("state between executions: %v", r)
	}
	lines := e.execute(t, id, map[string]any{"code": "import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.show()"})
	var png string
	for _, r := range ofType(lines, "result") {
		if p, ok := r["png"].(string); ok {
			png = p
		}
	}
	b, err := base64.StdEncoding.DecodeString(png)
	if err != nil || !strings.HasPrefix(string(b), "\x89PNG\r\n\x1a\n") {
		t.Fatalf("no PNG result from the figure: %v", lines)
	}
	// As E2B's kernel: a DataFrame's result has its columns as `data`
	// (code-interpreter's data.test.ts), and Pillow's show() and save()
	// give the image as a PNG result (images/bar.test.ts).
	r := ofType(e.execute(t, id, map[string]any{"code": "import pandas as pd\npd.DataFrame({'a': [1, 2, 3]})"}), "result")
	if len(r) != 1 || fmt.Sprint(r[0]["data"]) != "map[a:[1 2 3]]" {
		t.Fatalf("a DataFrame's data: %v", r)
	}
	r = ofType(e.execute(t, id, map[string]any{"code": "from PIL import Image\nim = Image.new('RGBA', (16, 16))\nim.show()\nim.save('test.png')\nprint('done')"}), "result")
	if len(r) != 2 || r[0]["png"] == nil || r[1]["png"] == nil {
		t.Fatalf("Image.show() and Image.save(): %v", r)
	}
}

// E2B's code-interpreter templates run on the rootfs code-interpreter
// when it is installed (its packages: pandas and the rest), and on the
// default userland before that. The "sci" test rootfs, which has pandas,
// stands in for it under that name.
func TestCodeInterpreterTemplateRunsOnItsRootfs(t *testing.T) {
	dir := rootfstest.Derived(t, "sci", rootfstest.Sci).Dir
	e := newEnv(t, nil)
	where := "import sys\nsys.executable"
	before := e.create(t, map[string]any{"templateID": "code-interpreter-v1", "timeout": 600})
	if r := ofType(e.execute(t, before.SandboxID, map[string]any{"code": where}), "result"); len(r) != 1 || strings.Contains(fmt.Sprint(r[0]["text"]), "/usr/bin/python3") {
		t.Fatalf("with no code-interpreter rootfs, the template runs on the default userland: %v", r)
	}
	if err := os.MkdirAll(rootfs.DirIn(e.App.DataDir), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(dir, "sci"), filepath.Join(rootfs.DirIn(e.App.DataDir), rootfs.CodeInterpreter)); err != nil {
		t.Fatal(err)
	}
	sb := e.create(t, map[string]any{"templateID": "code-interpreter-v1", "timeout": 600})
	if sb.TemplateID != "code-interpreter-v1" {
		t.Fatalf("the sandbox names its template %q", sb.TemplateID)
	}
	r := ofType(e.execute(t, sb.SandboxID, map[string]any{"code": "import pandas\n" + where}), "result")
	if len(r) != 1 || !strings.Contains(fmt.Sprint(r[0]["text"]), "/usr/bin/python3") {
		t.Fatalf("the template on the installed code-interpreter rootfs: %v", r)
	}
}
