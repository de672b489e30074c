package app

import (
	"strings"
	"testing"

	"github.com/quro-dev/quro/internal/runcode"
)

// run_js_file reports the language the file is written in: a .ts file is
// ts (it is transpiled), a .js file js.
func TestRunJSFileLang(t *testing.T) {
	t.Parallel()
	a := newApp(t, nil)
	for path, src := range map[string]string{
		"typed.ts": "const n: number = 6 * 7\nconsole.log('answer', n)\n",
		"plain.js": "console.log('answer', 6 * 7)\n",
	} {
		if _, err := call(t, a, "write_file", WriteFileInput{Path: path, Content: src}); err != nil {
			t.Fatal(err)
		}
		reply, err := call(t, a, "run_js_file", RunJSFileInput{Path: path})
		if err != nil {
			t.Fatal(err)
		}
		res := reply.Output.(*runcode.Result)
		want := strings.TrimPrefix(path[strings.LastIndex(path, "."):], ".")
		if res.Lang != want || res.Stdout != "answer 42\n" || res.Error != "" {
			t.Errorf("%s: lang %q (want %q), %+v", path, res.Lang, want, res)
		}
	}
}
