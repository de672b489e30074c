package js

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"net/http"
	"net/url"
	"path"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"modernc.org/quickjs"

	"github.com/quro-dev/quro/internal/engine/js/calc"
	"github.com/quro-dev/quro/internal/sandbox"
	"github.com/quro-dev/quro/internal/workspace"
)

// host is the one host function the prelude calls: host(op, args...). It
// runs on the VM's goroutine, in the middle of the user's code. Every file
// operation goes through r.ws, which confines paths to the workspace.
func (r *run) host(args []any) (any, error) {
	if len(args) == 0 {
		return nil, errors.New("no host operation")
	}
	op, _ := args[0].(string)
	a := args[1:]
	// Arguments are read defensively: a missing or mistyped one is the zero
	// value, never a panic in the middle of the engine.
	str := func(i int) string {
		if i < len(a) {
			if s, ok := a[i].(string); ok {
				return s
			}
		}
		return ""
	}
	flag := func(i int) bool {
		if i < len(a) {
			b, _ := a[i].(bool)
			return b
		}
		return false
	}
	num := func(i int) int {
		if i < len(a) {
			n, _ := a[i].(int)
			return n
		}
		return 0
	}
	switch op {
	case "print":
		w := r.req.Stdout
		if num(0) == 2 {
			w = r.req.Stderr
		}
		_, _ = io.WriteString(w, str(1)) // the run's output: nowhere else to report a failed write
		return nil, nil
	case "stack":
		return r.errorText(str(0)), nil
	case "resolve":
		p, kind, err := r.resolve(str(0), str(1))
		if err != nil {
			return nil, err
		}
		return jsonText(map[string]string{"path": p, "kind": kind})
	case "compileError":
		e := r.compileErr
		if e == nil {
			e = &jsError{Name: "Error", Message: "module could not be compiled"}
		}
		return jsonText(e)
	case "read":
		return r.file("read", str(0), func(rel string) (any, error) {
			c, err := r.ws.Read(rel, 0, 0)
			if err != nil {
				return nil, err
			}
			return string(c.Data), nil
		})
	case "write":
		data := str(1)
		return r.file("write", str(0), func(rel string) (any, error) {
			if _, err := r.ws.Write(rel, []byte(data), flag(2)); err != nil {
				return nil, err
			}
			return len(data), nil
		})
	case "list":
		return r.file("list", str(0), func(rel string) (any, error) {
			ents, err := list(r.ws, rel)
			if err != nil {
				return nil, err
			}
			return jsonText(ents)
		})
	case "exists":
		return r.file("exists", str(0), func(rel string) (any, error) { return r.ws.Exists(rel) })
	case "remove":
		return r.file("remove", str(0), func(rel string) (any, error) {
			if _, err := r.ws.Remove(rel); err != nil {
				return nil, err
			}
			return true, nil
		})
	case "fetch":
		return r.fetch(str(0))
	case "time":
		now := time.Now()
		zone, _ := now.Zone()
		return jsonText(map[string]any{"iso": now.UTC().Format(time.RFC3339Nano), "unix_ms": now.UnixMilli(), "timezone": zone})
	case "env":
		env := maps.Clone(r.req.Session.Env)
		if env == nil {
			env = map[string]string{}
		}
		if c := r.req.Context; c != nil {
			maps.Copy(env, c.Env) // this run's own variables
		}
		return jsonText(env)
	case "platform":
		lang := "js"
		if r.ts {
			lang = "ts"
		}
		return jsonText(map[string]any{
			"os": runtime.GOOS, "arch": runtime.GOARCH, "engine": "quickjs " + quickjs.Version(),
			"language": lang, "session": r.req.Session.Name,
			"memory_limit": r.eng.opts.MemoryLimit, "network": networked(r.req.Session.Network),
		})
	case "calc":
		v, err := calc.Eval(str(0))
		if err != nil {
			return nil, fmt.Errorf("Tools.calc: %w", err) //nolint:staticcheck // ST1005: the JS name the code called
		}
		return v, nil
	}
	return nil, fmt.Errorf("unknown host operation %q", op)
}

func jsonText(v any) (string, error) {
	b, err := json.Marshal(v)
	return string(b), err
}

// file runs the Tools.Files operation op on the path p of the code, bound
// to the run's deadline (see bounded); its errors name the operation.
func (r *run) file(op, p string, fn func(rel string) (any, error)) (any, error) {
	v, err := r.bounded(func() (any, error) {
		rel, err := wsRel(r.ws, ".", p)
		if err != nil {
			return nil, err
		}
		return fn(rel)
	})
	if err != nil && !errors.Is(err, errTimeUp) {
		return nil, fmt.Errorf("Tools.Files.%s: %w", op, err)
	}
	return v, err
}

// bounded runs fn, a host operation that may block in the kernel (file
// I/O), and returns when it does or when the run's deadline passes or its
// caller goes away, whichever comes first. Host functions run on the VM's
// goroutine, where QuickJS's interrupt handler cannot reach: without this a
// call that blocks would keep the run, and its slot, past timeout_ms. An
// operation left behind finishes (or fails on the closed workspace) on its
// own goroutine; the run ends as timed out.
func (r *run) bounded(fn func() (any, error)) (any, error) {
	if r.expired() {
		return nil, errTimeUp
	}
	type result struct {
		v   any
		err error
	}
	done := make(chan result, 1)
	go func() {
		v, err := fn()
		done <- result{v, err}
	}()
	t := time.NewTimer(time.Until(r.deadline))
	defer t.Stop()
	select {
	case res := <-done:
		return res.v, res.err
	case <-t.C:
	case <-r.ctx.Done():
	}
	return nil, errTimeUp
}

// errorText maps the frames of an error's text (name: message, then the
// stack) for console output.
func (r *run) errorText(s string) string {
	head, rest, ok := strings.Cut(s, "\n")
	if !ok {
		return s
	}
	frames, _ := r.src.stack(rest)
	if frames == "" {
		return head
	}
	return head + "\n" + frames
}

// moduleExts are tried, in order, after a require path as written.
var moduleExts = []string{".js", ".ts", ".mjs", ".cjs", ".mts", ".cts", ".json"}

// resolve finds the file require(spec) means, from the workspace directory
// dir: a relative path (or an absolute one inside the workspace), with or
// without its extension, or a directory with an index file.
func (r *run) resolve(dir, spec string) (rel, kind string, err error) {
	quoted := fmt.Sprintf("require(%q)", spec)
	if !(spec == "." || spec == ".." || strings.HasPrefix(spec, "./") || strings.HasPrefix(spec, "../") || filepath.IsAbs(spec)) {
		return "", "", fmt.Errorf("%s: only files of the session workspace can be required, by a relative path such as \"./util.js\"; there are no built-in or npm modules (the host API is Tools: Tools.Files, Tools.Net, Tools.System, Tools.calc)", quoted)
	}
	base, err := wsRel(r.ws, dir, spec)
	if err != nil {
		return "", "", fmt.Errorf("%s: %w", quoted, err)
	}
	cands := []string{base}
	for _, e := range moduleExts {
		cands = append(cands, base+e)
	}
	for _, e := range []string{"index.js", "index.ts", "index.json"} {
		cands = append(cands, path.Join(base, e))
	}
	for _, c := range cands {
		if c == "." {
			continue
		}
		v, err := r.bounded(func() (any, error) {
			_, fi, err := r.ws.Stat(c)
			return fi, err
		})
		if errors.Is(err, errTimeUp) {
			return "", "", err
		}
		fi, _ := v.(fs.FileInfo)
		if isOutside(err) {
			return "", "", fmt.Errorf("%s: %w", quoted, err)
		}
		if err != nil || !fi.Mode().IsRegular() {
			continue
		}
		kind := "js"
		switch path.Ext(c) {
		case ".json":
			kind = "json"
		case ".ts", ".mts", ".cts":
			kind = "ts"
		}
		return c, kind, nil
	}
	return "", "", fmt.Errorf("%s: no file %q (nor with %s, nor a directory with an index file) in the workspace", quoted, base, strings.Join(moduleExts, ", "))
}

// compile is __quro_compile(path): it reads a resolved module, transpiles
// it when it is TypeScript or an ES module, and evaluates it wrapped in a
// CommonJS function, at its own line range. It returns the function, or
// undefined with the reason in r.compileErr.
func (r *run) compile(rel string) quickjs.Value {
	r.compileErr = nil
	c, err := r.bounded(func() (any, error) { return r.ws.Read(rel, 0, 0) })
	if err != nil {
		r.compileErr = &jsError{Name: "Error", Message: fmt.Sprintf("require: %v", err)}
		return quickjs.UndefinedValue
	}
	original := string(c.(*workspace.Content).Data)
	code := original
	var sm *sourceMap
	ext := path.Ext(rel)
	ts := ext == ".ts" || ext == ".mts" || ext == ".cts"
	if ts || esmSyntax.MatchString(code) {
		t, err := r.eng.cache.transpile(r.ctx, r.req.Session.Tenant, code, rel, ts)
		if err != nil {
			name := "SyntaxError"
			if !errors.As(err, new(*transpileError)) {
				name = "Error"
			}
			r.compileErr = &jsError{Name: name, Message: "in a required module:\n" + err.Error()}
			return quickjs.UndefinedValue
		}
		code, sm = t.code, t.sm
	}
	code = stripShebang(code)
	pad := r.src.add(rel, original, code, sm, true)
	text := strings.Repeat("\n", pad) + "(function (exports, require, module, __filename, __dirname) {\n" + code + "\n})"
	v, err := r.vm.EvalValue(text, quickjs.EvalGlobal)
	if err != nil {
		var qe *quickjs.Error
		if !errors.As(err, &qe) {
			r.compileErr = &jsError{Name: "Error", Message: err.Error()}
			return quickjs.UndefinedValue
		}
		msg := qe.Message
		if qe.Name == "" {
			msg = qe.Error()
		}
		if frames, at := r.src.stack(qe.Stack); at != nil {
			msg += " (" + at.String() + ")\n" + at.excerpt()
		} else if frames != "" {
			msg += "\n" + frames
		}
		r.compileErr = &jsError{Name: qe.Name, Message: msg}
		return quickjs.UndefinedValue
	}
	return v
}

// networked reports whether a session's network policy lets its code
// reach anything beyond its box (the server's egress or the host's).
func networked(policy string) bool {
	return policy == sandbox.NetworkInternet || policy == sandbox.NetworkHost
}

var errNoNetwork = errors.New("network access is off for this session (its network policy is \"none\")")

const maxFetches = 100

// fetch performs Tools.Net.fetch. It blocks the VM; its context ends with
// the run's budget.
func (r *run) fetch(reqJSON string) (any, error) {
	var in struct {
		URL     string            `json:"url"`
		Method  string            `json:"method"`
		Headers map[string]string `json:"headers"`
		Body    string            `json:"body"`
	}
	if err := json.Unmarshal([]byte(reqJSON), &in); err != nil {
		return nil, fmt.Errorf("fetch: %v", err)
	}
	u, err := url.Parse(in.URL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("fetch(%q): only absolute http and https URLs can be fetched", in.URL)
	}
	check := func(u *url.URL) error {
		// The session's network policy, as for every process of its box;
		// then the server's own rule, if it has one.
		if !networked(r.req.Session.Network) {
			return errNoNetwork
		}
		if r.eng.opts.Network == nil {
			return nil
		}
		return r.eng.opts.Network(r.req.Session.ID, u)
	}
	if err := check(u); err != nil {
		return nil, fmt.Errorf("fetch(%q): %w", in.URL, err)
	}
	if r.fetches++; r.fetches > maxFetches {
		return nil, fmt.Errorf("fetch(%q): a run may make at most %d requests", in.URL, maxFetches)
	}
	ctx, cancel := context.WithDeadline(context.WithValue(r.ctx, sessionKey{}, r.req.Session.ID), r.deadline)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, in.Method, u.String(), strings.NewReader(in.Body))
	if err != nil {
		return nil, fmt.Errorf("fetch(%q): %v", in.URL, err)
	}
	for k, v := range in.Headers {
		req.Header.Set(k, v)
	}
	client := *r.eng.opts.HTTP
	client.CheckRedirect = func(req *http.Request, via []*http.Request) error {
		if len(via) >= 10 {
			return errors.New("stopped after 10 redirects")
		}
		return check(req.URL)
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("fetch(%q): %v", in.URL, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, r.eng.opts.MaxFetch+1))
	if err != nil {
		return nil, fmt.Errorf("fetch(%q): reading the body: %v", in.URL, err)
	}
	if int64(len(body)) > r.eng.opts.MaxFetch {
		return nil, fmt.Errorf("fetch(%q): the response body is larger than %s", in.URL, workspace.Human(r.eng.opts.MaxFetch))
	}
	headers := map[string]string{}
	for k, v := range resp.Header {
		headers[k] = strings.Join(v, ", ")
	}
	return jsonText(map[string]any{
		"url": resp.Request.URL.String(), "status": resp.StatusCode,
		"statusText": strings.TrimSpace(strings.TrimPrefix(resp.Status, fmt.Sprint(resp.StatusCode))),
		"headers":    headers, "body": string(body),
	})
}
