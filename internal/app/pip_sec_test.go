package app

import (
	"runtime"
	"strings"
	"testing"
)

// TestPipInstallOutputBoundedAgainstPth: install_packages' pip runs in the
// session's box with the session's user site, so a .pth the session wrote
// there runs inside pip and writes what it likes to pip's stdout (here
// 512 MiB). Both of pip's passes keep a bounded capture: the call returns,
// its output says it was cut, and the server did not allocate the stream.
func TestPipInstallOutputBoundedAgainstPth(t *testing.T) {
	ix := newTestIndex(t, pureWheel(t, "quropth", "1.0", "v"))
	a := pipApp(t, ix)
	s := sessionAs(t, a, pipAlice, "pth", "", nil)
	r := runIn(t, a, pipAlice, RunCodeInput{Session: s.ID, Code: `import os, site
d = site.getusersitepackages()
os.makedirs(d, exist_ok=True)
with open(os.path.join(d, "zz-flood.pth"), "w") as f:
    f.write("import os,sys; [os.write(1, b'A'*(1<<20)) for _ in range(512)] if 'install' in sys.argv else None\n")
print(d)`})
	if r.ExitCode != 0 || !strings.Contains(r.Stdout, "/.local/lib/python3.14/site-packages") {
		t.Fatalf("planting the .pth: %+v", r)
	}
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	res, err := installPip(t, a, pipAlice, s.ID, "quropth")
	runtime.ReadMemStats(&after)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(res.Output, "cut from the middle") || len(res.Output) > 4*aptOutputMax {
		t.Fatalf("output not cut (%d bytes): %.300q", len(res.Output), res.Output)
	}
	// 512 MiB went through pip's stdout; a bounded capture allocates a
	// few of its 16 KiB buffers, an unbounded one at least the stream.
	if grew := after.TotalAlloc - before.TotalAlloc; grew > 128<<20 {
		t.Fatalf("the server allocated %d MiB for pip's output", grew>>20)
	}
}
