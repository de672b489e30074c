package e2b_test

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/quro-dev/quro/internal/api/e2b"
)

// envelope is a Connect streaming request body: one message, flags 0.
func envelope(msg string) []byte {
	b := make([]byte, 5, 5+len(msg))
	binary.BigEndian.PutUint32(b[1:], uint32(len(msg)))
	return append(b, msg...)
}

// The Connect procedures of envd, and the content types a client may send.
var (
	fuzzProcedures = []string{
		"/process.Process/Start", "/process.Process/Connect", "/process.Process/List",
		"/process.Process/Update", "/process.Process/StreamInput", "/process.Process/SendInput",
		"/process.Process/SendSignal", "/process.Process/CloseStdin",
		"/filesystem.Filesystem/Stat", "/filesystem.Filesystem/MakeDir", "/filesystem.Filesystem/Move",
		"/filesystem.Filesystem/ListDir", "/filesystem.Filesystem/Remove", "/filesystem.Filesystem/WatchDir",
		"/filesystem.Filesystem/CreateWatcher", "/filesystem.Filesystem/GetWatcherEvents",
		"/filesystem.Filesystem/RemoveWatcher",
	}
	fuzzContentTypes = []string{"application/json", "application/proto", "application/connect+json",
		"application/connect+proto", "text/plain", "", "application/grpc", "application/json; charset=utf-16"}
)

// sandboxRequest is a request to port of sandbox id with its access
// token, bounded by within (a stream ends with its client); late: within
// passed before the answer.
func sandboxRequest(t testing.TB, e *env, id string, port int, method, path, ctype string, body []byte, within time.Duration) (rec *httptest.ResponseRecorder, late bool) {
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	req := httptest.NewRequestWithContext(ctx, method, "http://localhost"+path, strings.NewReader(string(body)))
	req.Header.Set(e2b.HeaderSandboxID, id)
	req.Header.Set(e2b.HeaderSandboxPort, strconv.Itoa(port))
	req.Header.Set("X-Access-Token", e.accessToken(id))
	req.Header.Set("Connect-Protocol-Version", "1")
	if ctype != "" {
		req.Header.Set("Content-Type", ctype)
	}
	rec = httptest.NewRecorder()
	e.Server.ServeHTTP(rec, req)
	return rec, ctx.Err() != nil
}

// fuzzWithin bounds each fuzzed request: a stream (a process that reads
// its stdin, a watch) ends there.
const fuzzWithin = 3 * time.Second

// reachWithin bounds a harness's first, well-formed request: the first
// run of a session (its box, its Python worker) takes longer than
// fuzzWithin at load.
const reachWithin = 5 * time.Minute

// wellFormedError checks a refusal: a 4xx (never a 500 for what a client
// sent), with E2B's error JSON {code: status, message}, a Connect error
// {code: name, message}, a plain-text message (the code interpreter's),
// or no body where Connect's protocol answers with the status alone (405,
// 415).
//
// late: the request's own bound passed (at load, before the call ended):
// its deadline_exceeded or canceled is the harness's, not the server's
// answer to the input.
func wellFormedError(t *testing.T, what string, rec *httptest.ResponseRecorder, late bool) {
	t.Helper()
	status, body := rec.Code, rec.Body.String()
	if late && (status == http.StatusGatewayTimeout || status == 499 || status == http.StatusRequestTimeout) {
		return
	}
	// A stream's end (status 200) carries its error too; output in a
	// stream is base64, so this text is only ever an error's.
	if strings.Contains(body, `"code":"internal"`) {
		t.Fatalf("%s: an internal Connect error for a client's input:\n%.500s", what, body)
	}
	if status < 400 {
		return
	}
	if status >= 500 && status != http.StatusBadGateway && status != http.StatusServiceUnavailable {
		t.Fatalf("%s: %d for a client's input:\n%.500s", what, status, body)
	}
	if body == "" {
		if status != http.StatusMethodNotAllowed && status != http.StatusUnsupportedMediaType {
			t.Fatalf("%s: %d with no message", what, status)
		}
		return
	}
	if strings.HasPrefix(rec.Header().Get("Content-Type"), "application/json") {
		var e struct {
			Code    any    `json:"code"`
			Message string `json:"message"`
		}
		if err := json.Unmarshal([]byte(body), &e); err != nil || e.Code == nil {
			t.Fatalf("%s: %d with a body that is not an error's JSON (%v):\n%.500s", what, status, err, body)
		}
		if n, ok := e.Code.(float64); ok && int(n) != status {
			t.Fatalf("%s: %d with code %v", what, status, e.Code)
		}
	}
}

// FuzzE2BConnect sends arbitrary bodies, under every content type, to
// each of envd's Connect procedures of a real sandbox (a session of a real
// App) through the E2B server's handler, as its access token's holder:
// nothing panics, and a refusal is a well-formed error, never a 500 or an
// internal Connect error. Valid requests run (a process, a listing), so
// run.sh counts its inputs (:slow).
func FuzzE2BConnect(f *testing.F) {
	e := newEnv(f, nil)
	id := e.newSession(f)
	// The harness reaches the handlers: a request as the SDKs send it is
	// answered, not refused at the door (an access token the server no
	// longer takes made every input a 401 once).
	if rec, _ := sandboxRequest(f, e, id, e2b.EnvdPort, http.MethodPost, "/filesystem.Filesystem/Stat", "application/json", []byte(`{"path":"/home/user"}`), reachWithin); rec.Code != 200 {
		f.Fatalf("a well-formed Stat: %d %s", rec.Code, rec.Body)
	}
	// Bodies as E2B's SDKs send them (Python's and JS's: Connect JSON;
	// server streams enveloped).
	seeds := []struct {
		proc  string
		ctype int
		body  []byte
	}{
		{"/process.Process/Start", 2, envelope(`{"process":{"cmd":"/bin/bash","args":["-l","-c","echo hi"],"envs":{},"cwd":"/home/user"},"stdin":false}`)},
		{"/process.Process/Start", 2, envelope(`{"process":{"cmd":"/bin/bash","args":["-l","-c","cat"]},"pty":{"size":{"cols":80,"rows":24}},"tag":"t"}`)},
		{"/process.Process/Connect", 2, envelope(`{"process":{"pid":1}}`)},
		{"/process.Process/List", 0, []byte(`{}`)},
		{"/process.Process/SendInput", 0, []byte(`{"process":{"pid":1},"input":{"stdin":"aGkK"}}`)},
		{"/process.Process/SendSignal", 0, []byte(`{"process":{"tag":"t"},"signal":"SIGNAL_SIGKILL"}`)},
		{"/process.Process/CloseStdin", 0, []byte(`{"process":{"pid":1}}`)},
		{"/process.Process/Update", 0, []byte(`{"process":{"pid":1},"pty":{"size":{"cols":100,"rows":30}}}`)},
		{"/filesystem.Filesystem/Stat", 0, []byte(`{"path":"/home/user"}`)},
		{"/filesystem.Filesystem/ListDir", 0, []byte(`{"path":"/home/user","depth":1}`)},
		{"/filesystem.Filesystem/MakeDir", 0, []byte(`{"path":"/home/user/d"}`)},
		{"/filesystem.Filesystem/Move", 0, []byte(`{"source":"/home/user/d","destination":"/home/user/e"}`)},
		{"/filesystem.Filesystem/Remove", 0, []byte(`{"path":"/home/user/e"}`)},
		{"/filesystem.Filesystem/WatchDir", 2, envelope(`{"path":"/home/user","recursive":false}`)},
		{"/filesystem.Filesystem/CreateWatcher", 0, []byte(`{"path":"/home/user","recursive":true}`)},
		{"/filesystem.Filesystem/GetWatcherEvents", 0, []byte(`{"watcherId":"w"}`)},
		{"/filesystem.Filesystem/RemoveWatcher", 0, []byte(`{"watcherId":"w"}`)},
		{"/filesystem.Filesystem/Stat", 0, []byte(`{"path":"../../../etc/passwd"}`)},
		{"/filesystem.Filesystem/Stat", 1, []byte{0x0a, 0x05, '/', 'h', 'o', 'm', 'e'}},
		{"/filesystem.Filesystem/Stat", 0, []byte(`{"path":1}`)},
		{"/process.Process/Start", 0, []byte(`{"process":{}}`)},
		{"/process.Process/StreamInput", 2, envelope(`{"start":{"process":{"pid":1}}}`)},
	}
	for _, s := range seeds {
		for i, p := range fuzzProcedures {
			if p == s.proc {
				f.Add(uint8(i), uint8(s.ctype), s.body)
			}
		}
	}
	f.Fuzz(func(t *testing.T, proc, ctype uint8, body []byte) {
		p := fuzzProcedures[int(proc)%len(fuzzProcedures)]
		ct := fuzzContentTypes[int(ctype)%len(fuzzContentTypes)]
		rec, late := sandboxRequest(t, e, id, e2b.EnvdPort, http.MethodPost, p, ct, body, fuzzWithin)
		wellFormedError(t, p+" "+ct, rec, late)
	})
}

// FuzzE2BExecute sends arbitrary bodies to the code interpreter's
// /execute of a real sandbox: nothing panics, and a refusal is a 4xx
// with its message (the code interpreter's plain text, or E2B's error
// JSON), never a 500. Valid requests run code (:slow in run.sh).
func FuzzE2BExecute(f *testing.F) {
	e := newEnv(f, nil)
	id := e.newSession(f)
	// The harness reaches the handler: a run as the SDKs send it is run.
	if rec, _ := sandboxRequest(f, e, id, e2b.InterpPort, http.MethodPost, "/execute", "application/json", []byte(`{"code":"print(1)"}`), reachWithin); rec.Code != 200 {
		f.Fatalf("a well-formed /execute: %d %s", rec.Code, rec.Body)
	}
	// As the code interpreter SDKs send them (Python's run_code, JS's
	// runCode).
	for _, s := range []string{
		`{"code":"print(1)","context_id":null,"language":null,"env_vars":null}`,
		`{"code":"x = 1\nx","language":"python","env_vars":{"A":"b"}}`,
		`{"code":"console.log(1)","language":"js"}`,
		`{"code":"echo hi","language":"bash"}`,
		`{"code":"1","context_id":"nope"}`,
		`{"code":"1","context_id":"a","language":"python"}`,
		`{"code":"1","language":"r"}`,
		`{"code":1}`,
		`{"code":"1","env_vars":{"":"x","A=B":"y"}}`,
		`not json`,
		``,
	} {
		f.Add(uint8(0), []byte(s))
	}
	f.Fuzz(func(t *testing.T, ctype uint8, body []byte) {
		ct := []string{"application/json", "", "text/plain", "application/json; charset=latin1"}[int(ctype)%4]
		rec, late := sandboxRequest(t, e, id, e2b.InterpPort, http.MethodPost, "/execute", ct, body, fuzzWithin)
		wellFormedError(t, "/execute "+ct, rec, late)
	})
}
