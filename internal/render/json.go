package render

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"html"
	"io"
	"strings"

	"github.com/quro-dev/quro/internal/runcode"
)

// JSON validates a JSON document, pretty-prints it to stdout and returns a
// collapsible tree view as an HTML artifact. Key order and number spelling
// are kept as written.
type JSON struct{}

// Shows implements runcode.Shower: the code is shown, not run.
func (JSON) Shows() {}

// Name is the engine's name in a run's result.
func (JSON) Name() string { return "render/json" }

// Probe reports the engine available: it is pure Go and needs nothing.
func (JSON) Probe(context.Context) error { return nil }

// Run checks req.Code as JSON and renders it as a tree.
func (JSON) Run(_ context.Context, req *runcode.Request) (*runcode.Result, error) {
	src := req.Code
	if err := validateJSON(src); err != nil {
		return userError(req.Stderr, "%s", err), nil
	}
	var pretty bytes.Buffer
	if err := json.Indent(&pretty, []byte(strings.TrimSpace(src)), "", "  "); err != nil {
		return userError(req.Stderr, "invalid JSON: %v", err), nil
	}
	pretty.WriteByte('\n')
	_, _ = req.Stdout.Write(pretty.Bytes()) // the run's output: nowhere else to report a failed write

	dec := json.NewDecoder(strings.NewReader(src))
	dec.UseNumber()
	var body strings.Builder
	body.WriteString(`<div class="tree">`)
	if err := jsonTree(dec, &body, ""); err != nil {
		return nil, fmt.Errorf("json tree: %w", err)
	}
	body.WriteString(`</div>`)
	return &runcode.Result{Artifacts: []runcode.Artifact{{
		Kind: "html", MIME: "text/html", Name: "tree.html",
		Data: page("JSON", "", body.String()),
	}}}, nil
}

// validateJSON checks that src holds exactly one JSON value and says where
// it is wrong, with line and column.
func validateJSON(src string) error {
	dec := json.NewDecoder(strings.NewReader(src))
	var v json.RawMessage
	err := dec.Decode(&v)
	if err == nil {
		// Exactly one value: anything after it but space is an error.
		var extra json.RawMessage
		if err2 := dec.Decode(&extra); err2 != io.EOF {
			off := dec.InputOffset() - int64(len(extra))
			if err2 != nil {
				off = dec.InputOffset()
			}
			line, col := lineCol(src, off)
			return fmt.Errorf("invalid JSON at line %d, column %d: unexpected data after the top-level value\n%s", line, col, excerpt(src, line, col))
		}
		return nil
	}
	var se *json.SyntaxError
	off := int64(len(src))
	msg := err.Error()
	switch {
	case errors.As(err, &se):
		off = se.Offset
		if off > 0 {
			off-- // Offset is just past the offending byte
		}
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		msg = "unexpected end of input"
	}
	line, col := lineCol(src, off)
	return fmt.Errorf("invalid JSON at line %d, column %d: %s\n%s", line, col, msg, excerpt(src, line, col))
}

// jsonTree renders the next value of dec as nested <details> elements.
func jsonTree(dec *json.Decoder, b *strings.Builder, label string) error {
	tok, err := dec.Token()
	if err != nil {
		return err
	}
	switch t := tok.(type) {
	case json.Delim:
		open, close := "{", "}"
		if t == '[' {
			open, close = "[", "]"
		}
		b.WriteString("<details open><summary>" + label + open + "</summary>")
		n := 0
		for dec.More() {
			var child string
			if t == '{' {
				kt, err := dec.Token()
				if err != nil {
					return err
				}
				child = `<span class="k">` + html.EscapeString(fmt.Sprintf("%q", kt)) + "</span>: "
			} else {
				child = fmt.Sprintf(`<span class="z">%d:</span> `, n)
			}
			b.WriteString("<div>")
			if err := jsonTree(dec, b, child); err != nil {
				return err
			}
			b.WriteString("</div>")
			n++
		}
		if _, err := dec.Token(); err != nil { // the closing delimiter
			return err
		}
		b.WriteString(close + "</details>")
	default:
		b.WriteString(label + jsonScalar(t))
	}
	return nil
}

func jsonScalar(v any) string {
	switch t := v.(type) {
	case string:
		var q bytes.Buffer
		enc := json.NewEncoder(&q)
		enc.SetEscapeHTML(false)
		_ = enc.Encode(t) // a string into a bytes.Buffer: cannot fail
		return `<span class="s">` + html.EscapeString(strings.TrimSuffix(q.String(), "\n")) + "</span>"
	case json.Number:
		return `<span class="n">` + html.EscapeString(t.String()) + "</span>"
	case bool:
		return fmt.Sprintf(`<span class="b">%t</span>`, t)
	case nil:
		return `<span class="b">null</span>`
	}
	return html.EscapeString(fmt.Sprint(v))
}
