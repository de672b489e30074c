package js

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"sort"
	"strings"

	qtranspile "github.com/quro-dev/quro/internal/transpile"
)

// transpiled is source that esbuild rewrote, with the map back to the
// original.
type transpiled struct {
	code string
	sm   *sourceMap
}

// diagnostic is one esbuild error, positioned in the original source.
type diagnostic qtranspile.Diagnostic

// transpileError is a source esbuild refused (invalid TypeScript).
type transpileError struct {
	file  string
	diags []diagnostic
}

func (e *transpileError) Error() string {
	var b strings.Builder
	for i, d := range e.diags {
		if i > 0 {
			b.WriteByte('\n')
		}
		if i == 10 {
			fmt.Fprintf(&b, "… and %d more errors", len(e.diags)-10)
			break
		}
		fmt.Fprintf(&b, "SyntaxError: %s\n    at %s:%d:%d", d.Text, e.file, d.Line, d.Column)
		if d.LineText != "" {
			b.WriteByte('\n')
			b.WriteString(caret(d.Line, d.LineText, d.Column))
		}
	}
	return b.String()
}

// caret shows a source line with a caret under column col (1-based).
func caret(line int, text string, col int) string {
	text = strings.TrimRight(text, "\r")
	r := []rune(text)
	if len(r) > 160 {
		start := max(0, col-80)
		r = r[start:min(len(r), start+160)]
		col -= start
	}
	gutter := fmt.Sprintf("%d | ", line)
	return "  " + gutter + string(r) + "\n  " + strings.Repeat(" ", len(gutter)-2) + "| " + strings.Repeat(" ", max(0, col-1)) + "^"
}

// transpile turns TypeScript (ts) or a JavaScript ES module (!ts) into a
// script QuickJS can run: types stripped, import/export turned into
// require/module.exports. A script with top-level await keeps its ES syntax
// (the main script is evaluated as an async script, where await is allowed).
// esbuild runs in a child process (internal/transpile); its crash or
// timeout is a *transpile.Error.
func transpile(ctx context.Context, src, file string, ts bool) (*transpiled, error) {
	r, err := qtranspile.Transform(ctx, &qtranspile.Request{Src: src, File: file, TS: ts, Target: qtranspile.ES2022, SourceMap: true})
	if err != nil {
		return nil, err
	}
	if len(r.Errors) > 0 {
		e := &transpileError{file: file}
		for _, m := range r.Errors {
			e.diags = append(e.diags, diagnostic(m))
		}
		return nil, e
	}
	sm, err := parseSourceMap(r.Map)
	if err != nil {
		return nil, fmt.Errorf("esbuild source map: %w", err)
	}
	return &transpiled{code: r.Code, sm: sm}, nil
}

// esmSyntax finds import and export statements: JavaScript that has them is
// run through esbuild to become CommonJS.
var esmSyntax = regexp.MustCompile(`(?m)^[ \t]*(import[ \t]*[\w{*'"]|export[ \t]+(default|const|let|var|function|class|async|\{|\*))`)

// sourceMap maps generated positions to original ones (version 3, one
// source).
type sourceMap struct {
	lines [][]segment // per generated line, sorted by column
}

type segment struct {
	genCol, srcLine, srcCol int // 0-based
}

// lookup maps a 1-based generated line and column to the 1-based original.
func (m *sourceMap) lookup(line, col int) (int, int, bool) {
	l := line - 1
	if l < 0 || l >= len(m.lines) {
		return 0, 0, false
	}
	segs := m.lines[l]
	if len(segs) == 0 {
		// A generated line with no mapping (esbuild helpers): use the
		// nearest mapped line above.
		for k := l - 1; k >= 0; k-- {
			if s := m.lines[k]; len(s) > 0 {
				last := s[len(s)-1]
				return last.srcLine + 1, last.srcCol + 1, true
			}
		}
		return 0, 0, false
	}
	i := sort.Search(len(segs), func(i int) bool { return segs[i].genCol > col-1 }) - 1
	if i < 0 {
		i = 0
	}
	s := segs[i]
	return s.srcLine + 1, s.srcCol + 1 + max(0, col-1-s.genCol), true
}

func parseSourceMap(raw []byte) (*sourceMap, error) {
	var m struct {
		Mappings string `json:"mappings"`
	}
	if err := json.Unmarshal(raw, &m); err != nil {
		return nil, err
	}
	sm := &sourceMap{}
	var srcLine, srcCol int // field 1 (the source index) stays 0: one source
	for _, line := range strings.Split(m.Mappings, ";") {
		var segs []segment
		genCol := 0
		for _, seg := range strings.Split(line, ",") {
			if seg == "" {
				continue
			}
			f, err := decodeVLQ(seg)
			if err != nil {
				return nil, err
			}
			genCol += f[0]
			if len(f) >= 4 {
				srcLine += f[2]
				srcCol += f[3]
				segs = append(segs, segment{genCol: genCol, srcLine: srcLine, srcCol: srcCol})
			}
		}
		sm.lines = append(sm.lines, segs)
	}
	return sm, nil
}

const b64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"

func decodeVLQ(s string) ([]int, error) {
	var out []int
	v, shift := 0, 0
	for i := 0; i < len(s); i++ {
		d := strings.IndexByte(b64, s[i])
		if d < 0 {
			return nil, fmt.Errorf("bad VLQ character %q", s[i])
		}
		v += (d & 31) << shift
		if d&32 != 0 {
			shift += 5
			if shift > 30 {
				return nil, fmt.Errorf("VLQ value too large")
			}
			continue
		}
		n := v >> 1
		if v&1 != 0 {
			n = -n
		}
		out = append(out, n)
		v, shift = 0, 0
	}
	if shift != 0 {
		return nil, fmt.Errorf("truncated VLQ")
	}
	return out, nil
}
