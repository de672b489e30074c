package app

import (
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/quro-dev/quro/internal/rootfs"
	"github.com/quro-dev/quro/internal/rootfs/rootfstest"
	"github.com/quro-dev/quro/internal/runcode"
)

// sciRootfs returns a manager of the shared test rootfs directory in
// which the rootfs "sci" is ready: "default" plus rootfstest.Sci (see
// rootfstest.Derived).
func sciRootfs(t testing.TB) *rootfs.Manager {
	t.Helper()
	return rootfstest.Derived(t, "sci", rootfstest.Sci)
}

// TestSciRootfs builds (once per machine) the rootfs the plot tests run in.
func TestSciRootfs(t *testing.T) {
	m := sciRootfs(t)
	for _, p := range []string{"usr/lib/python3/dist-packages/matplotlib", "usr/lib/python3/dist-packages/pandas", "usr/lib/python3/dist-packages/PIL"} {
		if _, err := os.Stat(filepath.Join(m.Path("sci"), p)); err != nil {
			t.Error(err)
		}
	}
}

// sciSession is an App over the test rootfses with a session "sci" on the
// rootfs sci, whose Python keeps its state between runs (the resident
// worker): the plots need it, and skip until the rootfs tier has it.
func sciSession(t testing.TB) *App {
	t.Helper()
	a := appOnRootfs(t, sciRootfs(t))
	if _, err := call(t, a, "create_session", CreateSessionInput{Name: "sci", Rootfs: "sci"}); err != nil {
		t.Fatal(err)
	}
	runCode(t, a, RunCodeInput{Session: "sci", Code: "kept = 1"})
	if r := runCode(t, a, RunCodeInput{Session: "sci", Code: "print(kept)"}); r.Stdout != "1\n" {
		t.Skip("run_code python on a rootfs runs one process per run (no resident worker): plots need the worker of issue 18, deliverable 2")
	}
	return a
}

// pngSize checks that an artifact's data is the base64 of a PNG and
// returns the width and height its IHDR says.
func pngSize(t testing.TB, data string) (w, h int) {
	t.Helper()
	b, err := base64.StdEncoding.DecodeString(data)
	if err != nil {
		t.Fatalf("not base64: %v", err)
	}
	if len(b) < 24 || string(b[:8]) != "\x89PNG\r\n\x1a\n" || string(b[12:16]) != "IHDR" {
		t.Fatalf("not a PNG: % x", b[:min(len(b), 24)])
	}
	return int(binary.BigEndian.Uint32(b[16:20])), int(binary.BigEndian.Uint32(b[20:24]))
}

func kinds(arts []runcode.Artifact) string {
	var k []string
	for _, a := range arts {
		k = append(k, a.Kind)
	}
	return strings.Join(k, ",")
}

// The real libraries, as Debian ships them (matplotlib 3.6, pandas 1.5,
// Pillow 9.4 on Python 3.11), in a session on the rootfs sci: figures,
// DataFrames and PIL images come back as Jupyter shows them.
func TestPlotsInSciRootfs(t *testing.T) {
	t.Parallel()
	a := sciSession(t)
	run := func(code string, env map[string]string) *runcode.Result {
		t.Helper()
		// The longest timeout: the default 30 s (the first import of
		// matplotlib builds its font cache) passed at a load of 100.
		r := runCode(t, a, RunCodeInput{Session: "sci", Code: code, Env: env, TimeoutMS: -1})
		if r.ExitCode != 0 || r.Error != "" {
			t.Fatalf("%q: exit %d, error %q, stderr %q", code, r.ExitCode, r.Error, r.Stderr)
		}
		return r
	}

	t.Run("plt.show", func(t *testing.T) {
		r := run("import matplotlib.pyplot as plt\nplt.plot([1, 4, 2])\nplt.show()\nprint(plt.get_fignums())\nplt.plot([2, 1])\nplt.show()", nil)
		if kinds(r.Artifacts) != "png,png" || r.Stdout != "[]\n" {
			t.Fatalf("artifacts %s, stdout %q (shown figures are closed)", kinds(r.Artifacts), r.Stdout)
		}
		// 6.4×4.8 in at 100 dpi, cut to its content (bbox_inches="tight").
		if w, h := pngSize(t, r.Artifacts[0].Data); w < 400 || w > 700 || h < 300 || h > 520 {
			t.Errorf("figure of %d×%d", w, h)
		}
	})
	t.Run("left open", func(t *testing.T) {
		r := run("plt.figure(figsize=(4, 3), dpi=50)\n_ = plt.plot([1, 2])", nil)
		if kinds(r.Artifacts) != "png" {
			t.Fatalf("artifacts %s", kinds(r.Artifacts))
		}
		if w, h := pngSize(t, r.Artifacts[0].Data); w < 120 || w > 230 || h < 90 || h > 175 {
			t.Errorf("a 4×3 in figure at 50 dpi is %d×%d", w, h)
		}
		// Shown once: closed after the run.
		if r := run("print(plt.get_fignums())", nil); len(r.Artifacts) != 0 || r.Stdout != "[]\n" {
			t.Errorf("the next run: %s %q", kinds(r.Artifacts), r.Stdout)
		}
		// A figure as the last value is shown once, as its value.
		if r := run("fig, ax = plt.subplots()\n_ = ax.plot([3, 1])\nfig", nil); kinds(r.Artifacts) != "png" || r.Stdout != "" {
			t.Errorf("a figure as the value: %s %q", kinds(r.Artifacts), r.Stdout)
		}
	})
	t.Run("svg", func(t *testing.T) {
		r := run("import matplotlib\nmatplotlib.rcParams['savefig.format'] = 'svg'\nplt.plot([1])\nplt.show()\nmatplotlib.rcParams['savefig.format'] = 'png'", nil)
		if kinds(r.Artifacts) != "svg" || !strings.Contains(r.Artifacts[0].Data, "<svg") || r.Artifacts[0].MIME != "image/svg+xml" {
			t.Fatalf("savefig.format svg: %s", kinds(r.Artifacts))
		}
		r = run("plt.plot([1])", map[string]string{"QURO_FIGURE_FORMATS": "png,svg,gif"})
		if kinds(r.Artifacts) != "png,svg" || !hasNoteWith(r, "QURO_FIGURE_FORMATS: 'gif' is not png, svg or jpeg") {
			t.Fatalf("QURO_FIGURE_FORMATS=png,svg,gif: %s %q", kinds(r.Artifacts), r.Notes)
		}
	})
	t.Run("pandas", func(t *testing.T) {
		r := run("import pandas as pd\ndf = pd.DataFrame({'city': ['Oslo', 'Lima'], 'temp': [3.5, 19.0]})\ndf", nil)
		if kinds(r.Artifacts) != "html" || !strings.Contains(r.Artifacts[0].Data, "<table") || !strings.Contains(r.Artifacts[0].Data, "Lima") {
			t.Fatalf("a DataFrame: %+v", r.Artifacts)
		}
		if r.Stdout != "" {
			t.Errorf("one representation: the text repr is not printed too: %q", r.Stdout)
		}
		// A plot made by pandas is a matplotlib figure like any other.
		if r := run("_ = df.plot(x='city', y='temp')", nil); kinds(r.Artifacts) != "png" {
			t.Errorf("df.plot(): %s", kinds(r.Artifacts))
		}
	})
	t.Run("PIL", func(t *testing.T) {
		r := run("from PIL import Image\ndisplay(Image.new('RGB', (7, 5), (255, 0, 0)), Image.new('F', (3, 2), 0.5))", nil)
		if kinds(r.Artifacts) != "png,png" {
			t.Fatalf("artifacts %s, notes %q", kinds(r.Artifacts), r.Notes)
		}
		if w, h := pngSize(t, r.Artifacts[0].Data); w != 7 || h != 5 {
			t.Errorf("the RGB image is %d×%d", w, h)
		}
		// Pillow's own _repr_png_ cannot save a float image; it is
		// converted instead, and the note says what failed.
		if w, h := pngSize(t, r.Artifacts[1].Data); w != 3 || h != 2 || !hasNoteWith(r, "an Image's _repr_png_() failed (ValueError") {
			t.Errorf("the float image: %d×%d, notes %q", w, h, r.Notes)
		}
	})
	// Pillow's show() and save() to a file name show the image, as in
	// E2B's kernel (its startup script patches Pillow so): in a plain run
	// an artifact, in a rich one a result; a save to a buffer shows nothing.
	t.Run("PIL show and save", func(t *testing.T) {
		r := run("from PIL import Image\nimport io\nim = Image.new('RGB', (6, 4), (0, 9, 0))\nim.show()\nim.save('shown.png')\n"+
			"im.save(io.BytesIO(), 'PNG')\nprint(Image.open('shown.png').size)", nil)
		if kinds(r.Artifacts) != "png,png" || r.Stdout != "(6, 4)\n" {
			t.Fatalf("artifacts %s, stdout %q, notes %q", kinds(r.Artifacts), r.Stdout, r.Notes)
		}
		if w, h := pngSize(t, r.Artifacts[1].Data); w != 6 || h != 4 {
			t.Errorf("the saved image is %d×%d", w, h)
		}
		r = runCode(t, a, RunCodeInput{Session: "sci", Context: "default", Rich: true,
			Code: "from PIL import Image\nim = Image.new('L', (3, 3))\nim.show()\nim.save('again.png')\nprint('done')"})
		if r.Exception != nil || len(r.Results) != 2 || r.Stdout != "done\n" {
			t.Fatalf("exception %+v, results %d, stdout %q", r.Exception, len(r.Results), r.Stdout)
		}
		for i, res := range r.Results {
			if s, _ := res.Data["image/png"].(string); s == "" || res.Main {
				t.Errorf("result %d: %v (main %v)", i, keys(res.Data), res.Main)
			}
		}
	})
	// A DataFrame's rich bundle carries its values as data too (E2B's
	// `data`): columns to lists, numpy numbers as numbers, NaN as null,
	// times as ISO text.
	t.Run("DataFrame data", func(t *testing.T) {
		r := runCode(t, a, RunCodeInput{Session: "sci", Context: "default", Rich: true,
			Code: "import pandas as pd, numpy as np\npd.DataFrame({'a': [1, 2, 3], 'b': [0.5, np.nan, 2.0], " +
				"3: ['x', 'y', 'z'], 't': pd.to_datetime(['2024-01-02', '2024-01-03', '2024-01-04'])})"})
		if r.Exception != nil || len(r.Results) != 1 {
			t.Fatalf("exception %+v, results %+v", r.Exception, r.Results)
		}
		got, _ := json.Marshal(r.Results[0].Data["e2b/data"])
		want := `{"3":["x","y","z"],"a":[1,2,3],"b":[0.5,null,2],"t":["2024-01-02T00:00:00.000","2024-01-03T00:00:00.000","2024-01-04T00:00:00.000"]}`
		if string(got) != want {
			t.Errorf("data %s\nwant %s", got, want)
		}
		if h, _ := r.Results[0].Data["text/html"].(string); !strings.Contains(h, "<table") {
			t.Errorf("the table is still there: %v", keys(r.Results[0].Data))
		}
		// Not a DataFrame: no data.
		r = runCode(t, a, RunCodeInput{Session: "sci", Context: "default", Rich: true, Code: "pd.Series([1])"})
		if len(r.Results) != 1 || r.Results[0].Data["e2b/data"] != nil {
			t.Errorf("a Series: %+v", r.Results)
		}
	})
	t.Run("rich run", func(t *testing.T) {
		r := runCode(t, a, RunCodeInput{Session: "sci", Context: "default", Rich: true,
			Code: "import matplotlib.pyplot as plt, pandas as pd\nfrom PIL import Image\ndf = pd.DataFrame({'city': ['Oslo']})\n" +
				"plt.plot([1, 2])\nplt.show()\ndisplay(Image.new('RGB', (4, 4)))\ndf"})
		if r.Exception != nil || len(r.Results) != 3 {
			t.Fatalf("exception %+v, results %+v", r.Exception, r.Results)
		}
		fig, img, main := r.Results[0].Data, r.Results[1].Data, r.Results[2]
		if fig["text/plain"] != "<Figure size 640x480 with 1 Axes>" || len(fig) != 2 {
			t.Errorf("the figure's bundle: %v", keys(fig))
		} else {
			pngSize(t, fig["image/png"].(string))
		}
		if s, _ := img["image/png"].(string); s == "" || !strings.HasPrefix(img["text/plain"].(string), "<PIL.Image.Image image mode=RGB size=4x4") {
			t.Errorf("the image's bundle: %v", keys(img))
		}
		if h, _ := main.Data["text/html"].(string); !main.Main || !strings.Contains(h, "<table") || !strings.Contains(main.Data["text/plain"].(string), "Oslo") {
			t.Errorf("the DataFrame's bundle: %v", keys(main.Data))
		}
		r = runCode(t, a, RunCodeInput{Session: "sci", Context: "default", Rich: true, Code: "_ = plt.plot([0])",
			Env: map[string]string{"QURO_FIGURE_FORMATS": "svg,png"}})
		if len(r.Results) != 1 || len(r.Results[0].Data) != 3 || r.Results[0].Data["image/svg+xml"] == nil {
			t.Errorf("a figure in svg and png: %+v", r.Results)
		}
	})
}

func keys(m map[string]any) []string {
	var k []string
	for key := range m {
		k = append(k, key)
	}
	return k
}

func hasNoteWith(r *runcode.Result, sub string) bool {
	for _, n := range r.Notes {
		if strings.Contains(n, sub) {
			return true
		}
	}
	return false
}

// BenchmarkFigurePNG is a matplotlib figure to a PNG artifact end to end
// through run_code in a session on the sci rootfs (the resident worker,
// in its box), beside the same code without the figure:
//
//	go test -run '^$' -bench FigurePNG -benchtime 20x -count 5 ./internal/app/
func BenchmarkFigurePNG(b *testing.B) {
	a := sciSession(b)
	runCode(b, a, RunCodeInput{Session: "sci", Code: "import matplotlib.pyplot as plt, numpy as np\nx = np.linspace(0, 6, 200)"})
	for _, bc := range []struct {
		name, code string
		arts       int
	}{
		{"figure", "plt.plot(x, np.sin(x))\nplt.title('sin')\nplt.show()", 1},
		{"no-figure", "y = np.sin(x)\nt = 'sin'", 0},
	} {
		args, _ := json.Marshal(RunCodeInput{Session: "sci", Code: bc.code})
		b.Run(bc.name, func(b *testing.B) {
			ctx := context.Background()
			for b.Loop() {
				reply, err := a.Controller.Call(ctx, admin, "run_code", args)
				if err != nil {
					b.Fatal(err)
				}
				if r := reply.Output.(*runcode.Result); r.ExitCode != 0 || len(r.Artifacts) != bc.arts {
					b.Fatalf("%+v", r)
				}
			}
		})
	}
}
