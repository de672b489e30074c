package wiretest_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/rogpeppe/go-internal/txtar"

	"github.com/quro-dev/quro/internal/api/e2b"
	"github.com/quro-dev/quro/internal/api/httpauth"
	quromcp "github.com/quro-dev/quro/internal/api/mcp"
	"github.com/quro-dev/quro/internal/api/rest"
	"github.com/quro-dev/quro/internal/api/ws"
	"github.com/quro-dev/quro/internal/app"
	"github.com/quro-dev/quro/internal/engine/python/pythontest"
	"github.com/quro-dev/quro/internal/session"
	"github.com/quro-dev/quro/internal/version"
)

var update = flag.Bool("update", false, "rewrite the answers of testdata/wire/*.txtar from the server")

// testPython shares one extracted interpreter between test data dirs, as
// in internal/app.
var testPython = pythontest.Options()

// recordedHeaders are the response headers a transcript shows.
var recordedHeaders = []string{"Content-Type", "Allow", "Location", "Mcp-Session-Id", "Www-Authenticate", "Retry-After"}

// volatileNumbers are the JSON keys whose numbers change from run to run.
var volatileNumbers = map[string]bool{
	"duration_ms": true, "pid": true, "uptime_s": true, "uptime_ms": true,
	"started_ms": true, "idle_ms": true, "disk_bytes": true, "workspace_bytes": true,
	// E2B's sandbox metrics: a sample's time and what the box uses.
	"timestampUnix": true, "diskUsed": true, "memUsed": true,
}

var (
	runID   = regexp.MustCompile(`\d{8}-\d{6}\.\d{6}-[0-9a-f]{8}`)
	rfc3339 = regexp.MustCompile(`^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)$`)
)

// e2bSecret keys the E2B sandboxes' access tokens (a fixed one: the
// tokens are normalized anyway).
var e2bSecret = bytes.Repeat([]byte("wire"), 8)

// server is a real App behind a real HTTP listener, mounted as `quro
// serve` mounts it (with authentication off, as --no-auth): E2B's
// requests (the control plane under /e2b, sandboxes by E2b-Sandbox-Id)
// go to the E2B server first.
func server(t *testing.T) (*httptest.Server, string) {
	t.Helper()
	data := t.TempDir()
	a, err := app.New(context.Background(), data, &app.Options{Python: testPython})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	access := rest.Access{Auth: httpauth.Open}
	wsrv := ws.New(a.Controller, &ws.Options{Access: access, PTY: a.OpenPTY})
	mux := http.NewServeMux()
	mux.Handle("/v1/", rest.New(a.Controller, &rest.Options{Access: access, WebSocket: wsrv.Handlers()}))
	mux.Handle("/mcp", quromcp.Handler(a.Controller, httpauth.Open, nil))
	es, err := e2b.New(a.Controller, &e2b.Options{
		Secret:  e2bSecret,
		Version: version.String(),
		Sandbox: func(ctx context.Context, id string) (e2b.Sandbox, error) {
			s, err := a.Sessions.ByIDAnyTenant(ctx, id)
			if errors.Is(err, session.ErrNotFound) || err == nil && s.Tenant == session.SpareTenant {
				return e2b.Sandbox{}, fmt.Errorf("%w: %s", e2b.ErrNoSandbox, id)
			}
			if err != nil {
				return e2b.Sandbox{}, err
			}
			return e2b.Sandbox{Tenant: s.Tenant, Paused: s.Paused}, nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if es.Match(r) {
			es.ServeHTTP(w, r)
			return
		}
		mux.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	return srv, data
}

func TestWire(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("testdata", "wire", "*.txtar"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no transcripts: %v", err)
	}
	for _, file := range files {
		t.Run(strings.TrimSuffix(filepath.Base(file), ".txtar"), func(t *testing.T) {
			replay(t, file)
		})
	}
}

// norm is the placeholder state of one transcript.
type norm struct {
	real   map[string]string // placeholder -> real value
	ph     map[string]string // real value -> placeholder
	order  []string          // real values, longest first, for replacing
	ids    int
	tokens int
}

func (n *norm) add(real, ph string) {
	if real == "" || n.ph[real] != "" {
		return
	}
	n.real[ph], n.ph[real] = real, ph
	n.order = append(n.order, real)
	sort.Slice(n.order, func(i, j int) bool { return len(n.order[i]) > len(n.order[j]) })
}

func (n *norm) id(real string) {
	if real == "" || n.ph[real] != "" || strings.HasPrefix(real, "$") {
		return
	}
	n.ids++
	n.add(real, fmt.Sprintf("$ID%d", n.ids))
}

func (n *norm) token(real string) {
	if real == "" || n.ph[real] != "" || strings.HasPrefix(real, "$") {
		return
	}
	n.tokens++
	n.add(real, fmt.Sprintf("$TOKEN%d", n.tokens))
}

// text replaces every known real value in s by its placeholder.
func (n *norm) text(s string) string {
	for _, r := range n.order {
		s = strings.ReplaceAll(s, r, n.ph[r])
	}
	return runID.ReplaceAllString(s, "$$RUN")
}

// request replaces placeholders in a request by the real values.
func (n *norm) request(s string) string {
	keys := make([]string, 0, len(n.real))
	for k := range n.real {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return len(keys[i]) > len(keys[j]) })
	for _, k := range keys {
		s = strings.ReplaceAll(s, k, n.real[k])
	}
	return s
}

// collect registers the identifiers in v (first pass, so that an id is
// named in the order it appears).
func (n *norm) collect(key string, v any) {
	switch v := v.(type) {
	case map[string]any:
		keys := make([]string, 0, len(v))
		for k := range v {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			n.collect(k, v[k])
		}
	case []any:
		for _, e := range v {
			n.collect(key, e)
		}
	case string:
		switch {
		case key == "id" || key == "session" || strings.HasSuffix(key, "_id") || key == "sandboxID":
			n.id(v)
		case strings.HasSuffix(key, "AccessToken"):
			n.token(v)
		}
	}
}

func (n *norm) value(key string, v any) any {
	switch v := v.(type) {
	case map[string]any:
		for k, e := range v {
			v[k] = n.value(k, e)
		}
		return v
	case []any:
		for i, e := range v {
			v[i] = n.value(key, e)
		}
		return v
	case json.Number:
		if volatileNumbers[key] {
			return "$N"
		}
		return v
	case string:
		if rfc3339.MatchString(v) {
			return "$TIME"
		}
		if key == "version" && v == version.String() {
			return "$VERSION"
		}
		return n.text(v)
	}
	return v
}

// jsonText normalizes a JSON document and indents it; ok is false when b
// is not JSON.
func (n *norm) jsonText(b []byte, indent string) (string, bool) {
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil || d.More() {
		return "", false
	}
	n.collect("", v)
	v = n.value("", v)
	var out bytes.Buffer
	enc := json.NewEncoder(&out)
	enc.SetEscapeHTML(false)
	enc.SetIndent(indent, "  ")
	if err := enc.Encode(v); err != nil {
		return "", false
	}
	return indent + strings.TrimSuffix(out.String(), "\n"), true
}

// body renders a response body by its content type.
func (n *norm) body(ctype string, b []byte) string {
	if len(b) == 0 {
		return ""
	}
	if strings.HasPrefix(ctype, "text/event-stream") {
		var out []string
		sc := bufio.NewScanner(bytes.NewReader(b))
		sc.Buffer(nil, 16<<20)
		for sc.Scan() {
			line := sc.Text()
			if data, ok := strings.CutPrefix(line, "data: "); ok {
				if j, ok := n.jsonText([]byte(data), "  "); ok {
					out = append(out, "data:", j)
					continue
				}
			}
			out = append(out, n.text(line))
		}
		return strings.Join(out, "\n")
	}
	if strings.HasPrefix(ctype, "application/x-ndjson") {
		var out []string
		for _, line := range strings.Split(strings.TrimSuffix(string(b), "\n"), "\n") {
			if line == `{"type":"keepalive"}` {
				continue // by the clock
			}
			if j, ok := n.jsonText([]byte(line), ""); ok {
				out = append(out, j)
				continue
			}
			out = append(out, n.text(line))
		}
		return strings.Join(out, "\n")
	}
	if strings.HasPrefix(ctype, "application/connect+") {
		return n.envelopes(b)
	}
	if j, ok := n.jsonText(b, ""); ok {
		return j
	}
	return n.text(string(b))
}

// envelopes renders a Connect stream's messages (JSON codec): each as
// its JSON, the end of the stream (flag 2) after a line "end-stream";
// keepalive events, which come by the clock, are left out.
func (n *norm) envelopes(b []byte) string {
	var out []string
	for len(b) > 0 {
		if len(b) < 5 {
			return strings.Join(append(out, fmt.Sprintf("a cut envelope: %q", b)), "\n")
		}
		flags, size := b[0], binary.BigEndian.Uint32(b[1:5])
		if uint32(len(b)-5) < size {
			return strings.Join(append(out, fmt.Sprintf("a cut envelope: %q", b)), "\n")
		}
		msg := b[5 : 5+size]
		b = b[5+size:]
		if bytes.Contains(msg, []byte(`"keepalive"`)) {
			continue
		}
		if flags&2 != 0 {
			out = append(out, "end-stream")
		} else if flags != 0 {
			out = append(out, fmt.Sprintf("flags %d", flags))
		}
		if j, ok := n.jsonText(msg, ""); ok {
			out = append(out, j)
		} else {
			out = append(out, n.text(string(msg)))
		}
	}
	return strings.Join(out, "\n")
}

// envelope is body as one Connect stream message (JSON codec).
func envelope(body string) []byte {
	b := make([]byte, 5, 5+len(body))
	binary.BigEndian.PutUint32(b[1:], uint32(len(body)))
	return append(b, body...)
}

// exchange is one request section and its answer.
type exchange struct {
	name string
	req  string
}

func replay(t *testing.T, file string) {
	ar, err := txtar.ParseFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var steps []exchange
	golden := map[string]string{}
	for _, f := range ar.Files {
		switch {
		case strings.HasSuffix(f.Name, ".req"):
			steps = append(steps, exchange{strings.TrimSuffix(f.Name, ".req"), string(f.Data)})
		case strings.HasSuffix(f.Name, ".resp"):
			golden[strings.TrimSuffix(f.Name, ".resp")] = string(f.Data)
		default:
			t.Fatalf("%s: section %q is neither NN.req nor NN.resp", file, f.Name)
		}
	}
	srv, data := server(t)
	n := &norm{real: map[string]string{}, ph: map[string]string{}}
	// The data directory is replaced before any id inside it, and as it
	// is resolved too (t.TempDir may be under a symlink).
	n.add(data, "$DATA")
	if r, err := filepath.EvalSymlinks(data); err == nil {
		n.add(r, "$DATA")
	}
	c := &client{t: t, base: srv.URL, n: n}
	defer c.close()
	out := &txtar.Archive{Comment: ar.Comment}
	failed := false
	for _, s := range steps {
		got := c.do(s.req) + "\n"
		out.Files = append(out.Files, txtar.File{Name: s.name + ".req", Data: []byte(s.req)}, txtar.File{Name: s.name + ".resp", Data: []byte(got)})
		if !*update && got != golden[s.name] {
			failed = true
			t.Errorf("%s: exchange %s: %s\n%s\n--- got:\n%s--- want:\n%s", file, s.name, firstDiff(got, golden[s.name]), strings.TrimSpace(s.req), got, golden[s.name])
		}
	}
	if *update {
		if err := os.WriteFile(file, txtar.Format(out), 0o644); err != nil {
			t.Fatal(err)
		}
	} else if failed {
		t.Log("if the change of the wire is intended: go test ./internal/api/wiretest -run Wire -update")
	}
}

// firstDiff says where got and want first differ, by line.
func firstDiff(got, want string) string {
	g, w := strings.Split(got, "\n"), strings.Split(want, "\n")
	for i := 0; i < len(g) || i < len(w); i++ {
		var gl, wl string
		if i < len(g) {
			gl = g[i]
		}
		if i < len(w) {
			wl = w[i]
		}
		if gl != wl || i >= len(g) || i >= len(w) {
			return fmt.Sprintf("line %d is %q, want %q", i+1, gl, wl)
		}
	}
	return "equal"
}

// client sends a transcript's requests: HTTP, and one WebSocket at a time.
type client struct {
	t    *testing.T
	base string
	n    *norm
	conn *websocket.Conn
}

func (c *client) close() {
	if c.conn != nil {
		c.conn.CloseNow()
	}
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// do sends one request section and returns its normalized answer.
func (c *client) do(section string) string {
	t := c.t
	section = c.n.request(section)
	head, body, _ := strings.Cut(section, "\n\n")
	lines := strings.Split(strings.TrimSuffix(head, "\n"), "\n")
	first := strings.Fields(lines[0])
	body = strings.TrimSuffix(body, "\n")
	if len(first) < 2 {
		t.Fatalf("request %q: the first line must be METHOD /path, WS /path until=COND or SEND text|binary until=COND", lines[0])
	}
	switch first[0] {
	case "WS":
		return c.dial(first, lines[1:])
	case "SEND":
		if len(first) != 3 || !strings.HasPrefix(first[2], "until=") {
			t.Fatalf("request %q: SEND text|binary until=COND", lines[0])
		}
		// The body follows the first line directly.
		_, msg, _ := strings.Cut(section, "\n")
		msg = strings.TrimSuffix(msg, "\n")
		typ := websocket.MessageText
		if first[1] == "binary" {
			typ = websocket.MessageBinary
		}
		if c.conn == nil {
			t.Fatal("SEND before WS")
		}
		if err := c.conn.Write(ctxT(t), typ, []byte(msg)); err != nil {
			t.Fatalf("send: %v", err)
		}
		return c.receive(strings.TrimPrefix(first[2], "until="))
	}
	req, err := http.NewRequest(first[0], c.base+first[1], strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range lines[1:] {
		// A Connect stream's request is one enveloped message.
		if k, v, _ := strings.Cut(h, ":"); strings.EqualFold(strings.TrimSpace(k), "Content-Type") && strings.HasPrefix(strings.TrimSpace(v), "application/connect+") {
			e := envelope(body)
			req.Body, req.ContentLength = io.NopCloser(bytes.NewReader(e)), int64(len(e))
		}
	}
	var keepTools []string
	for _, h := range lines[1:] {
		k, v, ok := strings.Cut(h, ":")
		if !ok {
			t.Fatalf("request header %q is not Name: value", h)
		}
		k, v = strings.TrimSpace(k), strings.TrimSpace(v)
		if k == "Wire-Keep-Tools" {
			keepTools = strings.Split(v, ",")
			continue
		}
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if sid := resp.Header.Get("Mcp-Session-Id"); sid != "" {
		c.n.add(sid, "$MCP_SESSION")
	}
	var out strings.Builder
	fmt.Fprintf(&out, "%d %s\n", resp.StatusCode, http.StatusText(resp.StatusCode))
	for _, h := range recordedHeaders {
		if v := resp.Header.Get(h); v != "" {
			fmt.Fprintf(&out, "%s: %s\n", h, c.n.text(v))
		}
	}
	if keepTools != nil {
		b = keepOnly(t, b, keepTools)
	}
	if b := c.n.body(resp.Header.Get("Content-Type"), b); b != "" {
		out.WriteString("\n" + b)
	}
	return strings.TrimSuffix(out.String(), "\n")
}

func (c *client) dial(first, headers []string) string {
	t := c.t
	if len(first) != 3 || !strings.HasPrefix(first[2], "until=") {
		t.Fatalf("request %q: WS /path until=COND", strings.Join(first, " "))
	}
	var protocols []string
	for _, h := range headers {
		k, v, _ := strings.Cut(h, ":")
		if !strings.EqualFold(strings.TrimSpace(k), "Sec-WebSocket-Protocol") {
			t.Fatalf("WS header %q: only Sec-WebSocket-Protocol is supported", h)
		}
		for _, p := range strings.Split(v, ",") {
			protocols = append(protocols, strings.TrimSpace(p))
		}
	}
	if c.conn != nil {
		c.conn.CloseNow()
		c.conn = nil
	}
	conn, resp, err := websocket.Dial(ctxT(t), "ws"+strings.TrimPrefix(c.base, "http")+first[1], &websocket.DialOptions{Subprotocols: protocols})
	if err != nil {
		if resp == nil {
			t.Fatalf("dial %s: %v", first[1], err)
		}
		// A refused upgrade is an HTTP answer.
		b, _ := io.ReadAll(resp.Body)
		return fmt.Sprintf("%d %s\nContent-Type: %s\n\n%s", resp.StatusCode, http.StatusText(resp.StatusCode),
			resp.Header.Get("Content-Type"), c.n.body(resp.Header.Get("Content-Type"), b))
	}
	c.conn = conn
	conn.SetReadLimit(64 << 20)
	out := fmt.Sprintf("%d %s\nSec-WebSocket-Protocol: %s", resp.StatusCode, http.StatusText(resp.StatusCode), conn.Subprotocol())
	if until := strings.TrimPrefix(first[2], "until="); until != "none" {
		out += "\n\n" + c.receive(until)
	}
	return out
}

// receive reads messages until cond and renders them. The output
// messages between two other messages are joined per stream, stdout
// first: the two pipes are read apart, so neither their chunking nor
// their relative order is part of the wire.
func (c *client) receive(cond string) string {
	t := c.t
	var out []string
	pending := map[string]string{}
	flush := func() {
		for _, stream := range []string{"stdout", "stderr"} {
			if data, ok := pending[stream]; ok {
				j, _ := c.n.jsonText(mustJSON(map[string]string{"type": "output", "stream": stream, "data": data}), "")
				out = append(out, "text "+j)
			}
		}
		for stream := range pending {
			if stream != "stdout" && stream != "stderr" {
				t.Errorf("output on stream %q, which is neither stdout nor stderr", stream)
			}
		}
		clear(pending)
	}
	for {
		typ, data, err := c.conn.Read(ctxT(t))
		if err != nil {
			flush()
			if cs := websocket.CloseStatus(err); cs != -1 {
				var ce websocket.CloseError
				errors.As(err, &ce)
				out = append(out, fmt.Sprintf("close %d %q", int(cs), c.n.text(ce.Reason)))
				c.conn = nil
				if cond != "close" {
					t.Errorf("socket closed while waiting for %q", cond)
				}
				return strings.Join(out, "\n")
			}
			t.Fatalf("read: %v (so far: %s)", err, strings.Join(out, "\n"))
		}
		if typ == websocket.MessageBinary {
			continue
		}
		var m struct{ Type, Stream, Data string }
		if err := json.Unmarshal(data, &m); err != nil {
			t.Fatalf("text message is not JSON: %q", data)
		}
		if m.Type == "output" {
			pending[m.Stream] += m.Data
			continue
		}
		flush()
		j, ok := c.n.jsonText(data, "")
		if !ok {
			t.Fatalf("text message is not JSON: %q", data)
		}
		out = append(out, "text "+j)
		if m.Type == cond {
			return strings.Join(out, "\n")
		}
	}
}

func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return b
}

// keepOnly cuts the tools of a tools/list answer (JSON or one server-sent
// event) to the named ones, in the server's order, and fails when one of
// them is missing.
func keepOnly(t *testing.T, b []byte, names []string) []byte {
	t.Helper()
	prefix, doc := "", b
	if i := bytes.Index(b, []byte("data: ")); i >= 0 {
		end := bytes.IndexByte(b[i:], '\n')
		if end < 0 {
			end = len(b) - i
		}
		prefix, doc = string(b[:i+len("data: ")]), b[i+len("data: "):i+end]
	}
	var m map[string]any
	d := json.NewDecoder(bytes.NewReader(doc))
	d.UseNumber()
	if err := d.Decode(&m); err != nil {
		t.Fatalf("Wire-Keep-Tools: the answer is not a JSON object: %v: %s", err, b)
	}
	res, _ := m["result"].(map[string]any)
	tools, _ := res["tools"].([]any)
	var kept []any
	for _, tool := range tools {
		name, _ := tool.(map[string]any)["name"].(string)
		for _, n := range names {
			if strings.TrimSpace(n) == name {
				kept = append(kept, tool)
			}
		}
	}
	if len(kept) != len(names) {
		t.Fatalf("Wire-Keep-Tools %v: the answer lists %d of them", names, len(kept))
	}
	res["tools"] = kept
	return []byte(prefix + string(mustJSON(m)) + "\n")
}
