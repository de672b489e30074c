package e2b_test

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"github.com/quro-dev/quro/internal/api/e2b"
)

// The Python SDK (e2b 2.45) speaks to envd through connectrpc-python over
// pyqwest (Rust's reqwest/hyper), which this machine cannot install (no
// PyPI, no crates.io). What it sends is read from its source
// (packages/python-sdk/e2b/envd, connection_config.py, commands):
//
//   - the Connect protocol with a JSON codec (ENVD_JSON_CODEC) and no
//     compression either way (ENVD_RPC_COMPRESSION: no Connect-Content-
//     Encoding, identity-only accept);
//   - HTTP/1.1 on a plaintext URL (E2B_SANDBOX_URL=http://…), HTTP/2 by
//     ALPN on TLS (a TLS proxy in front of Quro);
//   - the headers E2b-Sandbox-Id and E2b-Sandbox-Port, X-Access-Token,
//     User-Agent e2b-python-sdk/VERSION, Authorization Basic "user:" for a
//     command's user, Keepalive-Ping-Interval on streams, and
//     Connect-Timeout-Ms when a command has a timeout.
//
// pyClient sends exactly that, written out by hand rather than through
// connect-go, so that what is tested is the wire and not one library
// agreeing with itself.
type pyClient struct {
	t      *testing.T
	hc     *http.Client
	base   string
	id     string
	access string
}

func (c *pyClient) request(path, contentType string, body []byte, extra map[string]string) *http.Response {
	c.t.Helper()
	req, err := http.NewRequest(http.MethodPost, c.base+path, bytes.NewReader(body))
	if err != nil {
		c.t.Fatal(err)
	}
	req.Header.Set("Content-Type", contentType)
	req.Header.Set("Connect-Protocol-Version", "1")
	req.Header.Set("Accept-Encoding", "identity")
	req.Header.Set("User-Agent", "e2b-python-sdk/2.45.1")
	req.Header.Set(e2b.HeaderSandboxID, c.id)
	req.Header.Set(e2b.HeaderSandboxPort, strconv.Itoa(e2b.EnvdPort))
	req.Header.Set("X-Access-Token", c.access)
	for k, v := range extra {
		req.Header.Set(k, v)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		c.t.Fatal(err)
	}
	return resp
}

// unary posts a Connect unary call with a JSON body and decodes the JSON
// answer into out.
func (c *pyClient) unary(path, body string, out any) {
	c.t.Helper()
	resp := c.request(path, "application/json", []byte(body), nil)
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		c.t.Fatalf("%s: %d %s", path, resp.StatusCode, b)
	}
	if ce := resp.Header.Get("Content-Encoding"); ce != "" {
		c.t.Fatalf("%s: answered with Content-Encoding %q to a client that accepts only identity", path, ce)
	}
	if err := json.Unmarshal(b, out); err != nil {
		c.t.Fatalf("%s: %v in %s", path, err, b)
	}
}

// stream posts a Connect server-streaming call (one enveloped JSON
// message) and returns the messages of the answer and its end-of-stream
// message.
func (c *pyClient) stream(path, body string, extra map[string]string) (msgs []json.RawMessage, end json.RawMessage) {
	c.t.Helper()
	env := make([]byte, 5, 5+len(body))
	binary.BigEndian.PutUint32(env[1:], uint32(len(body)))
	env = append(env, body...)
	resp := c.request(path, "application/connect+json", env, extra)
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		c.t.Fatalf("%s: %d %s", path, resp.StatusCode, b)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "application/connect+json" {
		c.t.Fatalf("%s: Content-Type %q", path, ct)
	}
	if ce := resp.Header.Get("Connect-Content-Encoding"); ce != "" && ce != "identity" {
		c.t.Fatalf("%s: stream compressed with %q for a client that accepts only identity", path, ce)
	}
	r := bufio.NewReader(resp.Body)
	for {
		var head [5]byte
		if _, err := io.ReadFull(r, head[:]); err != nil {
			c.t.Fatalf("%s: stream ended without an end-of-stream message: %v", path, err)
		}
		msg := make([]byte, binary.BigEndian.Uint32(head[1:]))
		if _, err := io.ReadFull(r, msg); err != nil {
			c.t.Fatalf("%s: %v", path, err)
		}
		if head[0]&1 != 0 {
			c.t.Fatalf("%s: compressed envelope (flags %#x)", path, head[0])
		}
		if head[0]&2 != 0 {
			return msgs, msg
		}
		msgs = append(msgs, msg)
	}
}

// runPySDKWire is what the Python SDK does first with a sandbox: stat the
// home directory, run a command as its user with a timeout, and list
// processes.
func runPySDKWire(t *testing.T, c *pyClient) {
	var stat struct {
		Entry struct {
			Name, Type, Path string
		}
	}
	c.unary("/filesystem.Filesystem/Stat", `{"path":"/home/user"}`, &stat)
	if stat.Entry.Type != "FILE_TYPE_DIRECTORY" || stat.Entry.Path != "/home/user" {
		t.Fatalf("Stat /home/user: %+v", stat.Entry)
	}

	msgs, end := c.stream("/process.Process/Start",
		`{"process":{"cmd":"/bin/bash","args":["-l","-c","echo out; echo err >&2; exit 3"],"envs":{"A":"b"}},"stdin":false}`,
		map[string]string{
			"Authorization":           "Basic " + base64.StdEncoding.EncodeToString([]byte("user:")),
			"Keepalive-Ping-Interval": "50",
			"Connect-Timeout-Ms":      "60000",
		})
	if strings.TrimSpace(string(end)) != "{}" {
		t.Fatalf("end of stream: %s", end)
	}
	var stdout, stderr, exit string
	var pid float64
	for _, m := range msgs {
		var ev struct {
			Event struct {
				Start *struct{ Pid float64 }
				Data  *struct{ Stdout, Stderr string }
				End   *struct {
					ExitCode float64
					Exited   bool
					Status   string
				}
			}
		}
		if err := json.Unmarshal(m, &ev); err != nil {
			t.Fatalf("event %s: %v", m, err)
		}
		switch e := ev.Event; {
		case e.Start != nil:
			pid = e.Start.Pid
		case e.Data != nil:
			o, _ := base64.StdEncoding.DecodeString(e.Data.Stdout)
			x, _ := base64.StdEncoding.DecodeString(e.Data.Stderr)
			stdout, stderr = stdout+string(o), stderr+string(x)
		case e.End != nil:
			exit = e.End.Status
			if !e.End.Exited || e.End.ExitCode != 3 {
				t.Fatalf("end event: %+v", *e.End)
			}
		}
	}
	if pid == 0 || stdout != "out\n" || stderr != "err\n" || exit == "" {
		t.Fatalf("Start: pid %v stdout %q stderr %q status %q (%d messages)", pid, stdout, stderr, exit, len(msgs))
	}

	var list struct{ Processes []json.RawMessage }
	c.unary("/process.Process/List", `{}`, &list)
}

// TestPythonSDKWireHTTP1 speaks the Python SDK's wire over plaintext
// HTTP/1.1, as it does with E2B_SANDBOX_URL=http://….
func TestPythonSDKWireHTTP1(t *testing.T) {
	e := newEnv(t, nil)
	id := e.newSession(t)
	tr := &http.Transport{ForceAttemptHTTP2: false}
	t.Cleanup(tr.CloseIdleConnections)
	runPySDKWire(t, &pyClient{t: t, hc: &http.Client{Transport: tr}, base: e.URL, id: id, access: e.accessToken(id)})
}

// TestPythonSDKWireHTTP2 speaks it over HTTP/2, which pyqwest chooses by
// ALPN when a TLS proxy stands in front of Quro and passes HTTP/2 on: the
// E2B handler behind a TLS listener that offers h2.
func TestPythonSDKWireHTTP2(t *testing.T) {
	e := newEnv(t, nil)
	id := e.newSession(t)
	hs := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.ProtoMajor != 2 {
			http.Error(w, "not HTTP/2", http.StatusHTTPVersionNotSupported)
			return
		}
		if !e.Server.Match(r) {
			http.Error(w, "not an E2B request", http.StatusTeapot)
			return
		}
		e.Server.ServeHTTP(w, r)
	}))
	hs.EnableHTTP2 = true
	hs.StartTLS()
	t.Cleanup(hs.Close)
	tr := hs.Client().Transport.(*http.Transport).Clone()
	tr.ForceAttemptHTTP2 = true
	tr.TLSClientConfig = &tls.Config{RootCAs: hs.Client().Transport.(*http.Transport).TLSClientConfig.RootCAs, NextProtos: []string{"h2"}}
	t.Cleanup(tr.CloseIdleConnections)
	runPySDKWire(t, &pyClient{t: t, hc: &http.Client{Transport: tr}, base: hs.URL, id: id, access: e.accessToken(id)})
}
