package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// settled waits for the server's start-up probe of the engines (it
// extracts the embedded Python into the data directory, which must be done
// before the test's cleanup removes the directory).
func settled(t *testing.T, srv *server) {
	t.Helper()
	if r := do(t, "POST", srv.url+"/v1/get_service_status", "application/json", "{}", "Authorization", "Bearer "+srv.token); r.status != 200 {
		t.Fatalf("get_service_status: %d %s", r.status, trim(r.body))
	}
}

// dialFrom connects to addr from the loopback address from (127.x.y.z).
func dialFrom(t *testing.T, from, addr string) net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// metricValues returns the values of the samples of /metrics whose line
// starts with prefix (name and labels).
func metricValues(t *testing.T, srv *server, prefix string) []float64 {
	t.Helper()
	r := do(t, "GET", srv.url+"/metrics", "", "", "Authorization", "Bearer "+srv.token)
	if r.status != 200 {
		t.Fatalf("metrics: %d %s", r.status, trim(r.body))
	}
	var vals []float64
	for line := range strings.SplitSeq(r.body, "\n") {
		if rest, ok := strings.CutPrefix(line, prefix); ok {
			f := strings.Fields(rest)
			v, err := strconv.ParseFloat(f[len(f)-1], 64)
			if err != nil {
				t.Fatalf("%q: %v", line, err)
			}
			vals = append(vals, v)
		}
	}
	return vals
}

// TestServeConnectionFlood: an attacker without a token floods the real
// quro serve with connections — tokenless calls, idle keep-alive
// connections to the public web UI, half-sent headers — from one loopback
// address and from hundreds; the server holds no more than its cap, the
// tokenless ones are closed once answered, and the admin's calls (on a
// connection made before the flood, and on a new one) still succeed.
func TestServeConnectionFlood(t *testing.T) {
	const maxConns = 48
	srv := startServer(t, "--max-conns", strconv.Itoa(maxConns), "--max-conns-per-ip", "8")
	settled(t, srv)
	addr := strings.TrimPrefix(srv.url, "http://")
	host := "Host: " + addr + "\r\n"
	const js = "application/json"
	run := `{"code":"echo ok","lang":"sh"}`
	admin := []string{"Authorization", "Bearer " + srv.token}

	// The admin's keep-alive connection, made before the flood.
	keep := dialFrom(t, "127.0.0.1", addr)
	kbr := bufio.NewReader(keep)
	call := func(c net.Conn, br *bufio.Reader, token string) (*http.Response, string) {
		t.Helper()
		req := "POST /v1/run_code HTTP/1.1\r\n" + host + "Content-Type: application/json\r\nContent-Length: " + strconv.Itoa(len(run)) + "\r\n"
		if token != "" {
			req += "Authorization: Bearer " + token + "\r\n"
		}
		if _, err := io.WriteString(c, req+"\r\n"+run); err != nil {
			t.Fatal(err)
		}
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		return resp, string(b)
	}
	if resp, body := call(keep, kbr, srv.token); resp.StatusCode != 200 || !strings.Contains(body, `"stdout":"ok\n"`) {
		t.Fatalf("before the flood: %d %s", resp.StatusCode, body)
	}

	// Tokenless calls: 401, and the server closes the connection.
	for range 40 {
		c := dialFrom(t, "127.0.0.1", addr)
		br := bufio.NewReader(c)
		resp, body := call(c, br, "")
		if resp.StatusCode != 401 || !resp.Close || !strings.Contains(body, "no token") {
			t.Fatalf("tokenless: %d close=%v %s", resp.StatusCode, resp.Close, body)
		}
		if rest, err := io.ReadAll(br); len(rest) != 0 || err != nil {
			t.Fatalf("the connection outlived its 401: %q %v", rest, err)
		}
	}
	// Idle keep-alive connections on the public web UI, from 100 addresses.
	for i := range 100 {
		c := dialFrom(t, fmt.Sprintf("127.0.5.%d", i+1), addr)
		br := bufio.NewReader(c)
		if _, err := io.WriteString(c, "GET / HTTP/1.1\r\n"+host+"\r\n"); err != nil {
			t.Fatal(err)
		}
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("web UI %d: %v", i, err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("web UI: %d", resp.StatusCode)
		}
	}
	// Half-sent headers: 100 addresses, and 30 more from the admin's own.
	var half []net.Conn
	for i := range 130 {
		from := fmt.Sprintf("127.0.6.%d", i+1)
		if i >= 100 {
			from = "127.0.0.1"
		}
		c := dialFrom(t, from, addr)
		if _, err := io.WriteString(c, "POST /v1/run_code HTTP/1.1\r\n"+host); err != nil {
			t.Fatal(err)
		}
		half = append(half, c)
	}
	// The first of them were closed to make room for the later ones.
	if _, err := half[0].Read(make([]byte, 1)); err == nil {
		t.Fatal("the oldest half-sent request is still held")
	}

	// The admin: on the connection from before, and on a new one.
	if resp, body := call(keep, kbr, srv.token); resp.StatusCode != 200 || !strings.Contains(body, `"stdout":"ok\n"`) {
		t.Fatalf("after the flood, on the old connection: %d %s", resp.StatusCode, body)
	}
	if r := do(t, "POST", srv.url+"/v1/run_code", js, run, admin...); r.status != 200 || !strings.Contains(r.body, `"stdout":"ok\n"`) {
		t.Fatalf("after the flood, on a new connection: %d %s", r.status, r.body)
	}
	// The server held at most its cap, and says so.
	open := 0.0
	for _, v := range metricValues(t, srv, `quro_connections{listener="http"`) {
		open += v
	}
	if open > maxConns || open < 2 {
		t.Fatalf("quro_connections says %v connections are held; the cap is %d", open, maxConns)
	}
	if ev := metricValues(t, srv, `quro_connections_evicted_total{listener="http"}`); len(ev) != 1 || ev[0] < 100 {
		t.Fatalf("quro_connections_evicted_total: %v", ev)
	}
	if mx := metricValues(t, srv, `quro_connections_max{listener="http"}`); len(mx) != 1 || mx[0] != maxConns {
		t.Fatalf("quro_connections_max: %v", mx)
	}
}

// floodScript is run in a network-none session: it opens n connections to
// the in-session socket and holds them, and reports, through the FIFO
// ready, how many the server held and how many it refused at once.
const floodScript = `
import os, select, socket, sys
n = int(sys.argv[1])
socks = []
for i in range(n):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect("/run/quro/api.sock")
    socks.append(s)
# The last one is past the cap: its refusal comes at once, and when it has
# come the server has dealt with every earlier one (it accepts in order).
last = socks[-1].recv(4096)
readable = [s for s in socks[:-1] if select.select([s], [], [], 0)[0]]
refused = [s for s in readable if b" 503 " in s.recv(4096)] + ([socks[-1]] if b" 503 " in last else [])
held = n - 1 - len(readable)
# One more, with a whole request: refused too, with a reason.
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.connect("/run/quro/api.sock")
try:
    s.sendall(b"GET /v1/sessions HTTP/1.1\r\nHost: quro\r\n\r\n")
except OSError:
    pass
extra = s.recv(4096).split(b"\r\n")[0].decode()
with open(sys.argv[2], "w") as f:
    f.write("held=%d refused=%d last=%s extra=%s\n" % (held, len(refused), last.split(b"\r\n")[0].decode(), extra))
# Hold on until the server lets go (its header timeout).
for s in socks[:-1]:
    if s not in readable:
        s.recv(4096)
print("released")
`

// TestInSessionSocketFlood: a background process in a network-none
// session opens hundreds of connections to /run/quro/api.sock and holds
// them; the server holds at most the per-uid share for it and refuses the
// rest at once (503), while another session's quro call and the admin's
// calls over TCP still succeed.
func TestInSessionSocketFlood(t *testing.T) {
	t.Parallel()
	if os.Geteuid() != 0 {
		t.Skip("in-session calls need the server to run as root (a uid per session)")
	}
	srv := startServer(t)
	settled(t, srv)
	admin := []string{"Authorization", "Bearer " + srv.token}
	const js = "application/json"
	var evil struct{ ID string }
	for _, name := range []string{"evil", "good"} {
		r := do(t, "POST", srv.url+"/v1/sessions", js, `{"name":"`+name+`","network":"none"}`, admin...)
		if r.status != 201 {
			t.Fatalf("%d %s", r.status, r.body)
		}
		if name == "evil" {
			json.Unmarshal([]byte(r.body), &evil)
		}
	}
	ws := filepath.Join(srv.data, "sessions", evil.ID, "workspace")
	fifo := filepath.Join(ws, "ready")
	if err := syscall.Mkfifo(fifo, 0o666); err != nil {
		t.Fatal(err)
	}
	os.Chmod(fifo, 0o666)
	if err := os.WriteFile(filepath.Join(ws, "flood.py"), []byte(floodScript), 0o644); err != nil {
		t.Fatal(err)
	}
	// The runs' own budgets are the work's, sized for a loaded machine:
	// the flood's run starts its session's box and a Python, opens its
	// connections and then holds them until the server's header timeout
	// (10 s) lets go; the other session's starts its box and a quro call.
	// run_code's default 30 s can be passed by that at a load of 40, and
	// a run cut at its budget never writes the flood's report.
	const budgetMS = 180_000
	runIn := func(sess, code string) string {
		t.Helper()
		body, _ := json.Marshal(map[string]any{"lang": "sh", "session": sess, "code": code, "timeout_ms": budgetMS})
		r := do(t, "POST", srv.url+"/v1/run_code", js, string(body), append([]string{"Accept", "text/plain"}, admin...)...)
		if r.status != 200 {
			t.Errorf("%d %s", r.status, r.body)
		}
		return r.body
	}
	const n = 200
	flood := make(chan string, 1)
	go func() {
		// Not runIn: no t.Fatal off the test's goroutine.
		body, _ := json.Marshal(map[string]any{"lang": "sh", "session": "evil", "timeout_ms": budgetMS,
			"code": fmt.Sprintf(`cd %q && python3 flood.py %d ready & wait; echo "exit=$?"`, ws, n)})
		req, _ := http.NewRequest("POST", srv.url+"/v1/run_code", strings.NewReader(string(body)))
		req.Header.Set("Content-Type", js)
		req.Header.Set("Accept", "text/plain")
		req.Header.Set("Authorization", "Bearer "+srv.token)
		var out string
		if resp, err := http.DefaultClient.Do(req); err != nil {
			out = err.Error()
		} else {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			out = resp.Status + "\n" + string(b)
		}
		flood <- out
		// If the script died before its report, the FIFO's reader is still
		// waiting: let it see EOF.
		if w, err := os.OpenFile(fifo, os.O_WRONLY|syscall.O_NONBLOCK, 0); err == nil {
			w.Close()
		}
	}()
	// The FIFO opens when the script writes its report, flood in place.
	f, err := os.Open(fifo)
	if err != nil {
		t.Fatal(err)
	}
	report, _ := io.ReadAll(f)
	f.Close()
	m := regexp.MustCompile(`held=(\d+) refused=(\d+) last=(.*) extra=(.*)`).FindStringSubmatch(string(report))
	if m == nil {
		t.Fatalf("flood report: %q\n%s", report, <-flood)
	}
	held, _ := strconv.Atoi(m[1])
	refused, _ := strconv.Atoi(m[2])
	if held > 32 || held < 1 || held+refused != n || !strings.Contains(m[3], "503") || !strings.Contains(m[4], "503") {
		t.Fatalf("one session held %d connections, %d were refused (of %d; the share is 32): %q", held, refused, n, report)
	}
	// Meanwhile another session and the admin are served.
	if out := runIn("good", `quro call get_session_status | head -3; echo "exit=$?"`); !strings.Contains(out, "good") || !strings.Contains(out, "exit=0") {
		t.Fatalf("another session's call during the flood:\n%s", out)
	}
	if r := do(t, "GET", srv.url+"/v1/sessions", "", "", admin...); r.status != 200 {
		t.Fatalf("the admin during the flood: %d %s", r.status, r.body)
	}
	if rf := metricValues(t, srv, `quro_connections_refused_total{listener="insession",reason="peer"}`); len(rf) != 1 || rf[0] < n-32 {
		t.Fatalf("refused by peer: %v", rf)
	}
	if out := <-flood; !strings.Contains(out, "released") || !strings.Contains(out, "exit=0") {
		t.Fatalf("flood script:\n%s", out)
	}
}

type bearerRT string

func (b bearerRT) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+string(b))
	return http.DefaultTransport.RoundTrip(r)
}

// TestServeMCPThroughTheLimits: an MCP client over streamable HTTP (POSTs
// answered as event streams, the standing GET stream) works through the
// real server's connection handling, and its connection is trusted.
func TestServeMCPThroughTheLimits(t *testing.T) {
	t.Parallel() // its own server, data directory and port
	srv := startServer(t)
	settled(t, srv)
	client := mcp.NewClient(&mcp.Implementation{Name: "limits-test", Version: "1"}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cs, err := client.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: srv.url + "/mcp", HTTPClient: &http.Client{Transport: bearerRT(srv.token)}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	for range 3 {
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "run_code", Arguments: map[string]any{"code": "echo ok", "lang": "sh"}})
		if err != nil || res.IsError {
			t.Fatalf("%v %+v", err, res)
		}
	}
	if tr := metricValues(t, srv, `quro_connections{listener="http",state="trusted"}`); len(tr) != 1 || tr[0] < 1 {
		t.Fatalf("trusted connections: %v", tr)
	}
}
