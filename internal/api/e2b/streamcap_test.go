package e2b_test

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/quro-dev/quro/internal/api/e2b"
	"github.com/quro-dev/quro/internal/api/e2b/gen/filesystem"
	"github.com/quro-dev/quro/internal/api/e2b/gen/filesystem/filesystemconnect"
	"github.com/quro-dev/quro/internal/api/e2b/gen/process"
	"github.com/quro-dev/quro/internal/api/e2b/gen/process/processconnect"
	"github.com/quro-dev/quro/internal/api/streamcap"
	"github.com/quro-dev/quro/internal/controller"
)

// cappedEnv is an env whose E2B server counts long requests against a
// Limiter of max streams per token, with streams silent for idle ended
// (0: the default).
func cappedEnv(t *testing.T, max int, idle time.Duration) (*env, *streamcap.Limiter) {
	t.Helper()
	lim := streamcap.New(max, "--max-streams-per-token")
	e := newEnvWith(t, nil, func(o *e2b.Options) {
		o.Streams = lim
		o.StreamIdle = idle
	})
	return e, lim
}

// keyClients are the Connect clients of sandbox id that API key keyID's
// access token reaches, and a plain HTTP client for port.
func (e *env) keyClients(id, keyID string) (processconnect.ProcessClient, filesystemconnect.FilesystemClient, func(port int) *http.Client) {
	hc := func(port int) *http.Client {
		return &http.Client{Transport: sandboxTransport{id: id, port: port, token: e.Server.KeyAccessToken(id, keyID)}}
	}
	return processconnect.NewProcessClient(hc(e2b.EnvdPort), e.URL, connect.WithProtoJSON()),
		filesystemconnect.NewFilesystemClient(hc(e2b.EnvdPort), e.URL, connect.WithProtoJSON()), hc
}

// holdStart starts a process that waits for input and reads its start:
// the stream is then held until cancel.
func holdStart(t *testing.T, c processconnect.ProcessClient) (cancel context.CancelFunc, err error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	s, _ := c.Start(ctx, connect.NewRequest(bash("read x", true)))
	if !s.Receive() {
		return cancel, s.Err()
	}
	if s.Msg().GetEvent().GetStart() == nil {
		t.Fatalf("first event %v, want start", s.Msg())
	}
	go func() { // read on, keepalives included, until cancel
		for s.Receive() {
		}
	}()
	return cancel, nil
}

// holdWatch opens a WatchDir stream and reads its start.
func holdWatch(t *testing.T, c filesystemconnect.FilesystemClient, hdr map[string]string) (*connect.ServerStreamForClient[filesystem.WatchDirResponse], context.CancelFunc, error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	r := rpc(&filesystem.WatchDirRequest{Path: "/home/user"})
	for k, v := range hdr {
		r.Header().Set(k, v)
	}
	s, _ := c.WatchDir(ctx, r)
	if !s.Receive() {
		err := s.Err()
		return s, cancel, err
	}
	if s.Msg().GetStart() == nil {
		t.Fatalf("first message %v, want start", s.Msg())
	}
	return s, cancel, nil
}

// The attack: one API key holds its cap of envd streams (processes and
// a watch) with the real Connect clients, then asks for more of every
// kind of long request: each is refused in E2B's shape, naming the cap
// and its flag, while another key of the same tenant still gets its
// streams. Closing one of the first key's streams gives its place back.
func TestEnvdStreamsPerTokenCap(t *testing.T) {
	const max = 3
	e, lim := cappedEnv(t, max, 0)
	id := e.newSession(t)
	a := controller.Caller{Tenant: e.Tenant, TokenID: e.KeyID}
	procA, fsA, httpA := e.keyClients(id, e.KeyID)

	var cancels []context.CancelFunc
	for range max - 1 {
		cancel, err := holdStart(t, procA)
		if err != nil {
			t.Fatalf("a stream under the cap: %v", err)
		}
		cancels = append(cancels, cancel)
	}
	if _, cancel, err := holdWatch(t, fsA, nil); err != nil {
		t.Fatalf("a watch under the cap: %v", err)
	} else {
		cancels = append(cancels, cancel)
	}
	if got := lim.Held(a); got != max {
		t.Fatalf("held %d streams, want %d", got, max)
	}

	// Past the cap: Start, Connect, WatchDir and StreamInput are
	// resource_exhausted; /files and /execute 429.
	wantCap := func(what string, err error) {
		t.Helper()
		wantConnect(t, err, connect.CodeResourceExhausted, "this token holds 3 streams")
		if !strings.Contains(err.Error(), "--max-streams-per-token") {
			t.Errorf("%s: %v does not name the flag", what, err)
		}
	}
	_, err := holdStart(t, procA)
	wantCap("Start", err)
	_, _, err = holdWatch(t, fsA, nil)
	wantCap("WatchDir", err)
	cs, _ := procA.Connect(context.Background(), connect.NewRequest(&process.ConnectRequest{Process: pidSel(1)}))
	cs.Receive()
	wantCap("Connect", cs.Err())
	in := procA.StreamInput(context.Background())
	_ = in.Send(&process.StreamInputRequest{Event: &process.StreamInputRequest_Keepalive{Keepalive: &process.StreamInputRequest_KeepAlive{}}})
	_, err = in.CloseAndReceive()
	wantCap("StreamInput", err)
	for _, r := range []struct {
		port         int
		method, path string
	}{{e2b.EnvdPort, "GET", "/files?path=/home/user/x"}, {e2b.InterpPort, "POST", "/execute"}} {
		req, _ := http.NewRequest(r.method, e.URL+r.path, strings.NewReader(`{"code":"1"}`))
		req.Header.Set("Content-Type", "application/json")
		resp, err := httpA(r.port).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") == "" ||
			!strings.Contains(string(b), "--max-streams-per-token") {
			t.Errorf("%s %s past the cap: %s %q (Retry-After %q)", r.method, r.path, resp.Status, b, resp.Header.Get("Retry-After"))
		}
	}
	if got := lim.Held(a); got != max {
		t.Fatalf("after the refusals: held %d streams, want %d", got, max)
	}

	// Another key of the same tenant is not held back by the first's.
	tok, err := e.App.CreateToken(context.Background(), "cli", e.Tenant, []string{"read", "exec"}, "second key")
	if err != nil {
		t.Fatal(err)
	}
	procB, fsB, _ := e.keyClients(id, tok.ID)
	if _, err := holdStart(t, procB); err != nil {
		t.Fatalf("another key's stream: %v", err)
	}
	if _, _, err := holdWatch(t, fsB, nil); err != nil {
		t.Fatalf("another key's watch: %v", err)
	}
	if got := lim.Held(controller.Caller{Tenant: e.Tenant, TokenID: tok.ID}); got != 2 {
		t.Fatalf("the second key holds %d streams, want 2", got)
	}

	// A closed stream gives its place back, and every one at the end.
	cancels[0]()
	waitFor(t, "a closed stream's release", func() bool { return lim.Held(a) == max-1 })
	if cancel, err := holdStart(t, procA); err != nil {
		t.Fatalf("a stream after one closed: %v", err)
	} else {
		cancels = append(cancels, cancel)
	}
	for _, c := range cancels {
		c()
	}
	waitFor(t, "every stream's release", func() bool { return lim.Held(a) == 0 })
}

// A counted watch that sees no change gets envd's keepalive events at
// the interval the SDK asks for, and stays open.
func TestEnvdIdleWatchGetsKeepalives(t *testing.T) {
	old := *e2b.KeepaliveUnit
	*e2b.KeepaliveUnit = 20 * time.Millisecond
	t.Cleanup(func() { *e2b.KeepaliveUnit = old })
	e, lim := cappedEnv(t, 2, 0)
	id := e.newSession(t)
	_, fsA, _ := e.keyClients(id, e.KeyID)
	s, _, err := holdWatch(t, fsA, map[string]string{"Keepalive-Ping-Interval": "1"})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if !s.Receive() {
			t.Fatalf("the idle watch ended: %v", s.Err())
		}
		if s.Msg().GetKeepalive() == nil {
			t.Fatalf("message %d of an idle watch: %v, want a keepalive", i, s.Msg())
		}
	}
	if got := lim.Held(controller.Caller{Tenant: e.Tenant, TokenID: e.KeyID}); got != 1 {
		t.Fatalf("held %d streams, want 1", got)
	}
}

// StreamInput's client must send something (data or envd's keepalive)
// within the stream idle timeout: one that sends keepalives stays, one
// that goes silent is ended and its place in the cap given back.
//
// The keepalives come every 100 ms against an idle timeout of 3 s: a
// client that keeps to its interval must never be taken for silent by a
// loaded machine's late wake-up (with 400 ms, a keepalive every 100 ms
// left 300 ms of slack, which a load of 30 can eat).
func TestEnvdStreamInputIdle(t *testing.T) {
	const idle = 3 * time.Second
	const every = 100 * time.Millisecond
	e, lim := cappedEnv(t, 4, idle)
	id := e.newSession(t)
	a := controller.Caller{Tenant: e.Tenant, TokenID: e.KeyID}
	procA, _, _ := e.keyClients(id, e.KeyID)
	ev := e.start(t, id, bash("cat", true), nil)
	pid := ev.startPid(t)
	keepalive := &process.StreamInputRequest{Event: &process.StreamInputRequest_Keepalive{Keepalive: &process.StreamInputRequest_KeepAlive{}}}
	startMsg := &process.StreamInputRequest{Event: &process.StreamInputRequest_Start{Start: &process.StreamInputRequest_StartEvent{Process: pidSel(pid)}}}

	// Keepalives for one and a half idle timeouts.
	talker := procA.StreamInput(context.Background())
	if err := talker.Send(startMsg); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the input stream's hold", func() bool { return lim.Held(a) == 2 })
	for range int(idle * 3 / 2 / every) {
		time.Sleep(every)
		if err := talker.Send(keepalive); err != nil {
			t.Fatalf("a stream sending keepalives was ended: %v", err)
		}
	}
	if got := lim.Held(a); got != 2 {
		t.Fatalf("with keepalives: held %d streams, want 2", got)
	}
	if _, err := talker.CloseAndReceive(); err != nil {
		t.Fatalf("the talking input stream: %v", err)
	}

	// Silence after the start: ended within about the idle timeout.
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel) // without the deadline, the server's read ends only when the client goes
	silent := procA.StreamInput(ctx)
	if err := silent.Send(startMsg); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the silent input stream's hold", func() bool { return lim.Held(a) == 2 })
	began := time.Now()
	waitFor(t, "the silent input stream's end", func() bool { return lim.Held(a) == 1 })
	if took := time.Since(began); took < idle/2 {
		t.Errorf("the silent stream ended after %v, before the idle timeout %v", took, idle)
	}
	_, _ = silent.CloseAndReceive()
}
