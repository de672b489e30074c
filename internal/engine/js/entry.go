package js

import (
	"encoding/json"
	"fmt"
	"path"
	"regexp"
	"strings"

	"github.com/quro-dev/quro/internal/workspace"
)

// The two workspace entry points (run a file, call an exported function)
// are run as a line of generated JavaScript through run_code's runner, so
// that they share its time budget, output capture and result text. The path
// is checked here first, so that a bad one is the caller's error rather
// than a stack trace.

// CheckFile checks that rel names a JavaScript or TypeScript file inside the
// workspace dir and returns it clean and workspace-relative.
func CheckFile(dir, p string) (string, error) {
	ws, err := workspace.Open(dir, workspace.Options{})
	if err != nil {
		return "", err
	}
	defer ws.Close()
	rel, err := wsRel(ws, ".", p)
	if err != nil {
		return "", err
	}
	switch path.Ext(rel) {
	case ".js", ".ts", ".mjs", ".cjs", ".mts", ".cts":
	default:
		return "", fmt.Errorf("%q is not a .js or .ts file", p)
	}
	_, fi, err := ws.Stat(rel)
	if err != nil {
		return "", err
	}
	if !fi.Mode().IsRegular() {
		return "", fmt.Errorf("%q is not a regular file", p)
	}
	return rel, nil
}

// FileEntry is the code that runs the workspace file rel (from CheckFile)
// as a CommonJS module, as node runs a file: its output is its console
// output, and what it exports (when not an empty object) is the result.
func FileEntry(rel string) string {
	return fmt.Sprintf("void (module.exports = require(%s));\n", jsString("./"+rel))
}

var identRE = regexp.MustCompile(`^[A-Za-z_$][A-Za-z0-9_$]*$`)

// CallEntry is the code that loads the workspace module rel (from CheckFile)
// and calls its exported function fn with args (each a JSON value); the
// awaited return value is the result. fn may be "default".
func CallEntry(rel, fn string, args []json.RawMessage) (string, error) {
	if !identRE.MatchString(fn) {
		return "", fmt.Errorf("function %q is not a JavaScript identifier", fn)
	}
	var list []string
	for i, a := range args {
		if !json.Valid(a) {
			return "", fmt.Errorf("argument %d is not valid JSON", i+1)
		}
		list = append(list, string(a))
	}
	mod, name := jsString("./"+rel), jsString(fn)
	return fmt.Sprintf(`const __m = require(%[1]s);
const __f = __m == null ? undefined : (typeof __m === "function" && %[2]s === "default" ? __m : __m[%[2]s]);
if (typeof __f !== "function") throw new TypeError(%[3]s + " has no exported function " + %[2]s + "; it exports: " + (Object.keys(Object(__m)).join(", ") || "nothing"));
await __f(%[4]s);
`, mod, name, jsString(rel), strings.Join(list, ", ")), nil
}

// jsString quotes s as a JavaScript string literal (JSON's escaping, which
// also escapes U+2028 and U+2029).
func jsString(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}
