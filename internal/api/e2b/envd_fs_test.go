package e2b_test

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"mime/multipart"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"connectrpc.com/connect"

	"github.com/quro-dev/quro/internal/api/e2b"
	"github.com/quro-dev/quro/internal/api/e2b/gen/filesystem"
	"github.com/quro-dev/quro/internal/api/e2b/gen/filesystem/filesystemconnect"
	"github.com/quro-dev/quro/internal/app"
	"github.com/quro-dev/quro/internal/capability"
	"github.com/quro-dev/quro/internal/controller"
)

// fsClient is the SDK's filesystem client of sandbox id: Connect with the
// JSON codec.
func (e *env) fsClient(id string) filesystemconnect.FilesystemClient {
	return filesystemconnect.NewFilesystemClient(e.sandboxClient(id, e2b.EnvdPort), e.URL, connect.WithProtoJSON())
}

// rpc is a request as the SDK sends it: with the envd user "user".
func rpc[T any](msg *T) *connect.Request[T] {
	r := connect.NewRequest(msg)
	r.Header().Set("Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte("user:")))
	return r
}

// shell runs a command in sandbox id's box through the controller, as
// the session's tenant.
func (e *env) shell(t *testing.T, id, code string) string {
	t.Helper()
	args, _ := json.Marshal(map[string]any{"session": id, "lang": "sh", "code": code})
	reply, err := e.App.Controller.Call(context.Background(),
		controller.Caller{Path: "cli", Tenant: e.Tenant, Scope: capability.ScopeExec}, "run_code", args)
	if err != nil {
		t.Fatalf("%q: %v", code, err)
	}
	b, _ := json.Marshal(reply.Output)
	var out struct {
		Stdout   string `json:"stdout"`
		Stderr   string `json:"stderr"`
		ExitCode int    `json:"exit_code"`
	}
	if err := json.Unmarshal(b, &out); err != nil || out.ExitCode != 0 {
		t.Fatalf("%q: %s (%v)", code, b, err)
	}
	return out.Stdout
}

func wantConnect(t *testing.T, err error, code connect.Code, msg string) {
	t.Helper()
	if connect.CodeOf(err) != code || !strings.Contains(err.Error(), msg) {
		t.Fatalf("want %v with %q, got %v", code, msg, err)
	}
}

func TestEnvdFilesystemRPC(t *testing.T) {
	e := newEnv(t, nil)
	id := e.newSession(t)
	c := e.fsClient(id)
	ctx := context.Background()
	e.shell(t, id, "mkdir -p a/b && printf hello > a/b/f.txt && ln -s /etc evil && ln -s b/f.txt a/rel")

	st, err := c.Stat(ctx, rpc(&filesystem.StatRequest{Path: "/home/user/a/b/f.txt"}))
	if err != nil {
		t.Fatal(err)
	}
	if en := st.Msg.GetEntry(); en.GetPath() != "/home/user/a/b/f.txt" || en.GetName() != "f.txt" || en.GetSize() != 5 ||
		en.GetType() != filesystem.FileType_FILE_TYPE_FILE || en.GetPermissions() != "-rw-r--r--" || en.GetMode() != 0o644 || en.GetModifiedTime() == nil {
		t.Fatalf("%v", en)
	}
	if st, err := c.Stat(ctx, rpc(&filesystem.StatRequest{Path: "/home/user/"})); err != nil || st.Msg.GetEntry().GetName() != "user" ||
		st.Msg.GetEntry().GetPath() != "/home/user" || st.Msg.GetEntry().GetType() != filesystem.FileType_FILE_TYPE_DIRECTORY {
		t.Fatalf("%v %v", st, err)
	}
	// Relative paths are taken from the home.
	if st, err = c.Stat(ctx, rpc(&filesystem.StatRequest{Path: "a/rel"})); err != nil ||
		st.Msg.GetEntry().GetType() != filesystem.FileType_FILE_TYPE_FILE || st.Msg.GetEntry().GetSymlinkTarget() != "/home/user/a/b/f.txt" {
		t.Fatalf("%v %v", st, err)
	}
	_, err = c.Stat(ctx, rpc(&filesystem.StatRequest{Path: "/home/user/nope"}))
	wantConnect(t, err, connect.CodeNotFound, "nope")

	// MakeDir: new, then AlreadyExists (the SDK's false).
	md, err := c.MakeDir(ctx, rpc(&filesystem.MakeDirRequest{Path: "/home/user/x/y"}))
	if err != nil || md.Msg.GetEntry().GetType() != filesystem.FileType_FILE_TYPE_DIRECTORY || md.Msg.GetEntry().GetPath() != "/home/user/x/y" {
		t.Fatalf("%v %v", md, err)
	}
	_, err = c.MakeDir(ctx, rpc(&filesystem.MakeDirRequest{Path: "/home/user/x/y"}))
	wantConnect(t, err, connect.CodeAlreadyExists, "already exists")
	if out := e.shell(t, id, "touch x/y/by-code && ls x/y"); out != "by-code\n" {
		t.Fatalf("the session's code cannot write into a made directory: %q", out)
	}

	ls, err := c.ListDir(ctx, rpc(&filesystem.ListDirRequest{Path: "/home/user/a", Depth: 2}))
	if err != nil {
		t.Fatal(err)
	}
	var paths []string
	for _, en := range ls.Msg.GetEntries() {
		paths = append(paths, en.GetPath())
	}
	if strings.Join(paths, " ") != "/home/user/a/b /home/user/a/b/f.txt /home/user/a/rel" {
		t.Fatalf("%v", paths)
	}
	if ls, err = c.ListDir(ctx, rpc(&filesystem.ListDirRequest{Path: "/home/user/a", Depth: 1})); err != nil || len(ls.Msg.GetEntries()) != 2 {
		t.Fatalf("%v %v", ls, err)
	}

	mv, err := c.Move(ctx, rpc(&filesystem.MoveRequest{Source: "/home/user/a/b/f.txt", Destination: "/home/user/moved/g.txt"}))
	if err != nil || mv.Msg.GetEntry().GetPath() != "/home/user/moved/g.txt" {
		t.Fatalf("%v %v", mv, err)
	}
	if _, err := c.Remove(ctx, rpc(&filesystem.RemoveRequest{Path: "/home/user/a"})); err != nil {
		t.Fatal(err)
	}
	// Gone already: envd's os.RemoveAll answers success.
	if _, err := c.Remove(ctx, rpc(&filesystem.RemoveRequest{Path: "/home/user/a"})); err != nil {
		t.Fatal(err)
	}
	if out := e.shell(t, id, "ls; cat moved/g.txt"); out != "evil\nmoved\nx\nhello" {
		t.Fatalf("%q", out)
	}

	// Attacks: paths outside the home, through a link the box planted, a
	// user other than the sandbox's.
	for _, tc := range []struct {
		call func() error
		code connect.Code
		msg  string
	}{
		{func() error {
			_, err := c.MakeDir(ctx, rpc(&filesystem.MakeDirRequest{Path: "/home/user/../../etc/quro-made"}))
			return err
		}, connect.CodePermissionDenied, "/etc/quro-made: permission denied"},
		{func() error {
			_, err := c.Stat(ctx, rpc(&filesystem.StatRequest{Path: "../../etc/passwd"}))
			return err
		}, connect.CodePermissionDenied, "outside"},
		{func() error {
			_, err := c.Stat(ctx, rpc(&filesystem.StatRequest{Path: "/home/user/evil/passwd"}))
			return err
		}, connect.CodePermissionDenied, "symbolic link"},
		{func() error {
			_, err := c.ListDir(ctx, rpc(&filesystem.ListDirRequest{Path: "/home/user/evil", Depth: 1}))
			return err
		}, connect.CodePermissionDenied, "symbolic link"},
		{func() error {
			_, err := c.Remove(ctx, rpc(&filesystem.RemoveRequest{Path: "/home/user/evil/passwd"}))
			return err
		}, connect.CodePermissionDenied, "symbolic link"},
		{func() error {
			_, err := c.Move(ctx, rpc(&filesystem.MoveRequest{Source: "/home/user/evil/passwd", Destination: "/home/user/h"}))
			return err
		}, connect.CodePermissionDenied, "symbolic link"},
		{func() error {
			_, err := c.MakeDir(ctx, rpc(&filesystem.MakeDirRequest{Path: "/home/user/evil/quro-made"}))
			return err
		}, connect.CodePermissionDenied, "symbolic link"},
		{func() error {
			r := connect.NewRequest(&filesystem.StatRequest{Path: "moved"})
			r.Header().Set("Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte("root:")))
			_, err := c.Stat(ctx, r)
			return err
		}, connect.CodePermissionDenied, `user "root"`},
	} {
		wantConnect(t, tc.call(), tc.code, tc.msg)
	}
	// Remove of the link itself removes the link, not /etc.
	if _, err := c.Remove(ctx, rpc(&filesystem.RemoveRequest{Path: "evil"})); err != nil {
		t.Fatal(err)
	}
	if out := e.shell(t, id, "test -f /etc/passwd && echo still"); out != "still\n" {
		t.Fatalf("%q", out)
	}
	// Another sandbox's token cannot reach this one.
	other := e.newSession(t)
	wrong := filesystemconnect.NewFilesystemClient(&http.Client{Transport: sandboxTransport{id: id, port: e2b.EnvdPort, token: e.accessToken(other)}},
		e.URL, connect.WithProtoJSON())
	_, err = wrong.Stat(ctx, rpc(&filesystem.StatRequest{Path: "moved"}))
	wantConnect(t, err, connect.CodeUnauthenticated, "")
}

// upload posts body to /files of sandbox id.
func (e *env) filesReq(t *testing.T, id, method, query, contentType string, body io.Reader, hdr map[string]string) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, e.URL+"/files?"+query, body)
	if err != nil {
		t.Fatal(err)
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	// A plain transport: gzip answers arrive as sent.
	tr := &http.Transport{DisableCompression: true}
	defer tr.CloseIdleConnections()
	c := &http.Client{Transport: sandboxTransportOver{sandboxTransport{id: id, port: e2b.EnvdPort, token: e.accessToken(id)}, tr}}
	res, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	return res, b
}

type sandboxTransportOver struct {
	s  sandboxTransport
	rt http.RoundTripper
}

func (s sandboxTransportOver) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set(e2b.HeaderSandboxID, s.s.id)
	r.Header.Set(e2b.HeaderSandboxPort, "49983")
	r.Header.Set("X-Access-Token", s.s.token)
	return s.rt.RoundTrip(r)
}

func TestEnvdFilesUploadDownload(t *testing.T) {
	e := newEnv(t, nil)
	id := e.newSession(t)
	all := make([]byte, 256)
	for i := range all {
		all[i] = byte(i)
	}
	big := make([]byte, 9<<20+12345) // three chunks of /files' transfers
	if _, err := rand.Read(big); err != nil {
		t.Fatal(err)
	}

	// Multipart, two files (the SDK's writeFiles): the filenames are the paths.
	var mp bytes.Buffer
	mw := multipart.NewWriter(&mp)
	for _, f := range []struct {
		name string
		data []byte
	}{{"/home/user/bin/all.bin", all}, {"deep/er/big.bin", big}} {
		pw, err := mw.CreateFormFile("file", f.name)
		if err != nil {
			t.Fatal(err)
		}
		pw.Write(f.data)
	}
	mw.Close()
	res, body := e.filesReq(t, id, "POST", "username=user", mw.FormDataContentType(), &mp, nil)
	if res.StatusCode != 200 {
		t.Fatalf("%d %s", res.StatusCode, body)
	}
	var infos []map[string]string
	if err := json.Unmarshal(body, &infos); err != nil || len(infos) != 2 ||
		infos[0]["path"] != "/home/user/bin/all.bin" || infos[0]["name"] != "all.bin" || infos[0]["type"] != "file" ||
		infos[1]["path"] != "/home/user/deep/er/big.bin" {
		t.Fatalf("%s (%v)", body, err)
	}
	// The box sees the bytes (and owns the files: it can append).
	if out := e.shell(t, id, "sha256sum < bin/all.bin | cut -c1-16; wc -c < deep/er/big.bin; echo x >> deep/er/big.bin"); out != "40aff2e9d2d8922e\n"+strconv.Itoa(len(big))+"\n" {
		t.Fatalf("%q", out)
	}
	e.shell(t, id, "truncate -s "+strconv.Itoa(len(big))+" deep/er/big.bin")

	// Downloads, plain and gzip: a client that takes gzip gets it when
	// the bytes compress (text, over three chunks), and the bytes as
	// they are when they do not (random bytes, a tiny file).
	text := bytes.Repeat([]byte("print('hello from /home/user')\n"), (9<<20)/31+7)
	if res, body := e.filesReq(t, id, "POST", "path=/home/user/deep/er/text.py", "application/octet-stream", bytes.NewReader(text), nil); res.StatusCode != 200 {
		t.Fatalf("POST text.py: %d %s", res.StatusCode, body)
	}
	for _, tc := range []struct {
		path string
		want []byte
		gzip bool
	}{{"/home/user/bin/all.bin", all, false}, {"deep/er/big.bin", big, false}, {"deep/er/text.py", text, true}} {
		res, got := e.filesReq(t, id, "GET", "path="+url.QueryEscape(tc.path)+"&username=user", "", nil, nil)
		if res.StatusCode != 200 || res.Header.Get("Content-Type") != "application/octet-stream" || !bytes.Equal(got, tc.want) {
			t.Fatalf("GET %s: %d %s, %d bytes", tc.path, res.StatusCode, res.Header.Get("Content-Type"), len(got))
		}
		res, got = e.filesReq(t, id, "GET", "path="+url.QueryEscape(tc.path), "", nil, map[string]string{"Accept-Encoding": "gzip"})
		if res.StatusCode != 200 || (res.Header.Get("Content-Encoding") == "gzip") != tc.gzip || res.Header.Get("Vary") != "Accept-Encoding" {
			t.Fatalf("GET gzip %s: %d %v (want gzip: %v)", tc.path, res.StatusCode, res.Header, tc.gzip)
		}
		if tc.gzip {
			if len(got) > len(tc.want)/4 {
				t.Fatalf("GET gzip %s: %d bytes for %d", tc.path, len(got), len(tc.want))
			}
			zr, err := gzip.NewReader(bytes.NewReader(got))
			if err != nil {
				t.Fatal(err)
			}
			if got, err = io.ReadAll(zr); err != nil {
				t.Fatalf("gunzipping %s: %v", tc.path, err)
			}
		}
		if !bytes.Equal(got, tc.want) {
			t.Fatalf("GET gzip %s: %d bytes, want %d", tc.path, len(got), len(tc.want))
		}
	}

	// Octet-stream, gzip-encoded, over an existing file.
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write(all)
	zw.Close()
	res, body = e.filesReq(t, id, "POST", "path=/home/user/deep/er/big.bin", "application/octet-stream", &gz, map[string]string{"Content-Encoding": "gzip"})
	if res.StatusCode != 200 || !strings.Contains(string(body), `"path":"/home/user/deep/er/big.bin"`) {
		t.Fatalf("%d %s", res.StatusCode, body)
	}
	if _, got := e.filesReq(t, id, "GET", "path=deep/er/big.bin", "", nil, nil); !bytes.Equal(got, all) {
		t.Fatalf("overwritten: %d bytes", len(got))
	}
	// Empty files.
	if res, body = e.filesReq(t, id, "POST", "path=empty", "application/octet-stream", strings.NewReader(""), nil); res.StatusCode != 200 {
		t.Fatalf("%d %s", res.StatusCode, body)
	}
	if res, body = e.filesReq(t, id, "GET", "path=empty", "", nil, nil); res.StatusCode != 200 || len(body) != 0 || res.Header.Get("Content-Length") != "0" {
		t.Fatalf("%d %q %v", res.StatusCode, body, res.Header)
	}

	// Errors, as envd's JSON {code, message}.
	e.shell(t, id, "ln -s /etc/passwd pw && ln -s /etc etc && ln -s /proc/self/root/etc/passwd selfpw && mkfifo fifo")
	for _, tc := range []struct {
		method, query, ct string
		body              string
		status            int
		msg               string
	}{
		{"GET", "path=/home/user/nope", "", "", 404, "nope"},
		{"POST", "path=/etc/passwd", "application/octet-stream", "pwned", 403, "/etc/passwd: permission denied"},
		{"GET", "path=pw", "", "", 403, "outside"},
		{"GET", "path=etc/shadow", "", "", 403, "outside"},
		{"GET", "path=selfpw", "", "", 403, "outside"},
		{"GET", "path=fifo", "", "", 400, "not a regular file"},
		{"GET", "path=empty&username=root", "", "", 401, `user "root"`},
		{"POST", "path=etc/quro-planted", "application/octet-stream", "pwned", 403, "outside"},
		{"POST", "path=pw", "application/octet-stream", "pwned", 403, "outside"},
		{"POST", "", "application/octet-stream", "x", 400, "path parameter"},
		{"POST", "path=x", "text/plain", "x", 415, "multipart/form-data"},
		{"POST", "path=x", "multipart/form-data; boundary=zz", "--zz--\r\n", 400, `part named "file"`},
		{"PUT", "path=x", "", "", 501, "PUT /files"},
	} {
		res, body := e.filesReq(t, id, tc.method, tc.query, tc.ct, strings.NewReader(tc.body), nil)
		var eb struct {
			Code    int    `json:"code"`
			Message string `json:"message"`
		}
		if res.StatusCode != tc.status || json.Unmarshal(body, &eb) != nil || eb.Code != tc.status || !strings.Contains(eb.Message, tc.msg) {
			t.Errorf("%s ?%s: %d %s, want %d with %q", tc.method, tc.query, res.StatusCode, body, tc.status, tc.msg)
		}
	}
	if out := e.shell(t, id, "test -e /etc/quro-planted || echo none; head -c 5 /etc/passwd"); out != "none\nroot:" {
		t.Fatalf("%q", out)
	}
	// /health is open and empty.
	req, _ := http.NewRequest("GET", e.URL+"/health", nil)
	req.Header.Set(e2b.HeaderSandboxID, id)
	req.Header.Set(e2b.HeaderSandboxPort, "49983")
	hres, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	hres.Body.Close()
	if hres.StatusCode != http.StatusNoContent {
		t.Fatalf("/health: %d", hres.StatusCode)
	}
}

// GET /files sends a workspace file from the file it opened, with its
// Content-Length: a file renamed over its path mid-read is not what is
// sent (the opened one is, whole), and one cut short mid-read ends the
// body short, never a silently short file. The client reads the headers
// and then waits: the rest of 64 MiB is more than the kernel's socket
// buffers hold, so the server is still sending when the box acts.
func TestEnvdFilesSendsTheFileItOpened(t *testing.T) {
	e := newEnv(t, nil)
	id := e.newSession(t)
	const size = 64 << 20
	tr := &http.Transport{DisableCompression: true}
	defer tr.CloseIdleConnections()
	c := &http.Client{Transport: sandboxTransportOver{sandboxTransport{id: id, port: e2b.EnvdPort, token: e.accessToken(id)}, tr}}
	get := func(p string) *http.Response {
		t.Helper()
		req, err := http.NewRequest("GET", e.URL+"/files?path="+p, nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Accept-Encoding", "identity")
		res, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		if res.StatusCode != 200 || res.ContentLength != size {
			t.Fatalf("GET %s: %d, Content-Length %d", p, res.StatusCode, res.ContentLength)
		}
		return res
	}

	// Zeros (a sparse file); what is renamed over it is not.
	e.shell(t, id, "truncate -s "+strconv.Itoa(size)+" swapped && printf other > other")
	res := get("swapped")
	e.shell(t, id, "mv -f other swapped")
	got, err := io.ReadAll(res.Body)
	res.Body.Close()
	if err != nil || len(got) != size || !bytes.Equal(got, make([]byte, size)) {
		t.Fatalf("renamed over mid-read: %d bytes (%v), want the %d zeros opened", len(got), err, size)
	}

	e.shell(t, id, "truncate -s "+strconv.Itoa(size)+" cut")
	res = get("cut")
	e.shell(t, id, "truncate -s 1 cut")
	n, err := io.Copy(io.Discard, res.Body)
	res.Body.Close()
	if err == nil || n >= size {
		t.Fatalf("cut short mid-read: %d of %d bytes, error %v: want a failed read", n, size, err)
	}

	// The sandbox killed mid-read: the kill neither waits for the
	// client nor fails on the file still open (it outlives the call),
	// and it ends the send: a client that reads slowly (here: not until
	// the destroy returned) would otherwise hold the destroyed session's
	// disk for as long as it liked, outside every ceiling.
	e.shell(t, id, "truncate -s "+strconv.Itoa(size)+" last")
	res = get("last")
	args, _ := json.Marshal(map[string]any{"session": id})
	if _, err := e.App.Controller.Call(context.Background(), controller.Caller{Path: "cli", Tenant: e.Tenant, Scope: capability.ScopeExec}, "destroy_session", args); err != nil {
		t.Fatalf("destroy while a file is sent: %v", err)
	}
	n, err = io.Copy(io.Discard, res.Body)
	res.Body.Close()
	if err == nil || n >= size {
		t.Fatalf("destroyed mid-read: %d of %d bytes, error %v: want the send ended (a cut body)", n, size, err)
	}
}

// WatchDir streams start first, then the changes a process in the box
// makes, until the client goes.
func TestEnvdWatchDir(t *testing.T) {
	e := newEnv(t, nil)
	id := e.newSession(t)
	c := e.fsClient(id)
	e.shell(t, id, "mkdir w")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// As the SDK sends it (envd 0.6.4): entries in the events, network
	// mounts allowed (a box has none; the flag changes nothing).
	stream, err := c.WatchDir(ctx, rpc(&filesystem.WatchDirRequest{Path: "/home/user/w", Recursive: true, IncludeEntry: true, AllowNetworkMounts: true}))
	if err != nil {
		t.Fatal(err)
	}
	if !stream.Receive() || stream.Msg().GetStart() == nil {
		t.Fatalf("first message %v (%v), want start", stream.Msg(), stream.Err())
	}
	e.shell(t, id, "mkdir w/sub && printf hi > w/sub/a.txt && ln -s /etc w/out")
	seen := map[string]*filesystem.FilesystemEvent{}
	for seen["EVENT_TYPE_CREATE out"] == nil {
		if !stream.Receive() {
			t.Fatalf("stream ended: %v", stream.Err())
		}
		if ev := stream.Msg().GetFilesystem(); ev != nil {
			seen[ev.GetType().String()+" "+ev.GetName()] = ev
		}
	}
	if ev := seen["EVENT_TYPE_CREATE sub/a.txt"]; ev == nil || ev.GetEntry().GetPath() != "/home/user/w/sub/a.txt" {
		t.Fatalf("%v", seen)
	}
	// (a.txt may be written before sub's own watch is in place: then its
	// create is reported, from the listing of the new sub, but no write.)
	if seen["EVENT_TYPE_CREATE sub"] == nil {
		t.Fatalf("%v", seen)
	}
	cancel()
	for stream.Receive() {
	}
	stream.Close()

	// Killing the sandbox ends a watch on it (the stream ends with an
	// error, it does not hang).
	defer func() {
		s2, err := c.WatchDir(context.Background(), rpc(&filesystem.WatchDirRequest{Path: "/home/user"}))
		if err != nil || !s2.Receive() || s2.Msg().GetStart() == nil {
			t.Fatalf("second watch: %v %v", err, s2.Err())
		}
		args, _ := json.Marshal(map[string]any{"session": id})
		if _, err := e.App.Controller.Call(context.Background(), controller.Caller{Path: "cli", Tenant: e.Tenant, Scope: capability.ScopeExec}, "destroy_session", args); err != nil {
			t.Fatal(err)
		}
		for s2.Receive() {
		}
		if s2.Err() == nil {
			t.Fatal("the watch of a killed sandbox ended without an error")
		}
		t.Logf("watch after the kill: %v", s2.Err())
		s2.Close()
	}()
	// A watch on a link out, or outside the home, is refused before start.
	for _, p := range []string{"/home/user/w/out", "/etc"} {
		s, err := c.WatchDir(context.Background(), rpc(&filesystem.WatchDirRequest{Path: p}))
		if err == nil {
			if s.Receive() {
				t.Fatalf("watch %s: %v", p, s.Msg())
			}
			err = s.Err()
			s.Close()
		}
		if code := connect.CodeOf(err); code != connect.CodePermissionDenied && code != connect.CodeInvalidArgument {
			t.Fatalf("watch %s: %v", p, err)
		}
	}
}

// The Python SDK's polling watcher: events kept between polls, per
// sandbox, until removed.
func TestEnvdPollingWatcher(t *testing.T) {
	e := newEnv(t, nil)
	id := e.newSession(t)
	c := e.fsClient(id)
	ctx := context.Background()
	cw, err := c.CreateWatcher(ctx, rpc(&filesystem.CreateWatcherRequest{Path: "/home/user"}))
	if err != nil {
		t.Fatal(err)
	}
	wid := cw.Msg.GetWatcherId()
	e.shell(t, id, "printf x > polled.txt")
	var got []string
	// The SDK polls; so does this test, until the change is there (the
	// watcher reads the kernel's events on its own goroutine).
	for deadline := time.Now().Add(time.Minute); !strings.Contains(strings.Join(got, " "), "EVENT_TYPE_WRITE polled.txt"); {
		if time.Now().After(deadline) {
			t.Fatalf("events %v", got)
		}
		ev, err := c.GetWatcherEvents(ctx, rpc(&filesystem.GetWatcherEventsRequest{WatcherId: wid}))
		if err != nil {
			t.Fatal(err)
		}
		for _, x := range ev.Msg.GetEvents() {
			got = append(got, x.GetType().String()+" "+x.GetName())
		}
		if len(ev.Msg.GetEvents()) == 0 {
			time.Sleep(5 * time.Millisecond) // a poll interval, as the SDK's
		}
	}
	// Another sandbox does not see it.
	other := e.fsClient(e.newSession(t))
	_, err = other.GetWatcherEvents(ctx, rpc(&filesystem.GetWatcherEventsRequest{WatcherId: wid}))
	wantConnect(t, err, connect.CodeNotFound, "not found")
	_, err = other.RemoveWatcher(ctx, rpc(&filesystem.RemoveWatcherRequest{WatcherId: wid}))
	wantConnect(t, err, connect.CodeNotFound, "not found")
	if _, err := c.RemoveWatcher(ctx, rpc(&filesystem.RemoveWatcherRequest{WatcherId: wid})); err != nil {
		t.Fatal(err)
	}
	_, err = c.GetWatcherEvents(ctx, rpc(&filesystem.GetWatcherEventsRequest{WatcherId: wid}))
	wantConnect(t, err, connect.CodeNotFound, "not found")
	// Bounded per sandbox: the removed watcher's watch has ended (Remove
	// waits for it), so eight fit and the ninth is refused.
	for i := range 8 {
		if _, err := c.CreateWatcher(ctx, rpc(&filesystem.CreateWatcherRequest{Path: "/home/user"})); err != nil {
			t.Fatalf("watcher %d of 8: %v", i+1, err)
		}
	}
	_, err = c.CreateWatcher(ctx, rpc(&filesystem.CreateWatcherRequest{Path: "/home/user"}))
	wantConnect(t, err, connect.CodeResourceExhausted, "8 watch")
	// Killing the sandbox ends its watchers (their hold on the workspace
	// too: the destroy removes it).
	args, _ := json.Marshal(map[string]any{"session": id})
	if _, err := e.App.Controller.Call(ctx, controller.Caller{Path: "cli", Tenant: e.Tenant, Scope: capability.ScopeExec}, "destroy_session", args); err != nil {
		t.Fatal(err)
	}
}

// GET /files gzips the answer when Accept-Encoding accepts gzip: by its q
// value, a number (q=0 refuses; q=0.5, q=0.01 accept). The file is text
// over 1 KiB: a smaller one, or one that does not compress, goes as it is.
func TestEnvdFilesAcceptEncodingQ(t *testing.T) {
	e := newEnv(t, nil)
	id := e.newSession(t)
	e.shell(t, id, "yes hello | head -c 8192 > q.txt")
	for _, tc := range []struct {
		accept string
		gzip   bool
	}{
		{"gzip", true},
		{"gzip;q=0.5", true},
		{"gzip; q=0.01", true},
		{"gzip;q=1.0", true},
		{"br, gzip;q=0.8", true},
		{"GZIP;Q=0.3", true},
		{"gzip;q=0", false},
		{"gzip; q=0.000", false},
		{"gzip;q=0, identity", false},
		{"identity", false},
		{"", false},
	} {
		res, _ := e.filesReq(t, id, "GET", "path=q.txt", "", nil, map[string]string{"Accept-Encoding": tc.accept})
		if res.StatusCode != 200 || (res.Header.Get("Content-Encoding") == "gzip") != tc.gzip {
			t.Errorf("Accept-Encoding %q: %d, Content-Encoding %q; want gzip %v", tc.accept, res.StatusCode, res.Header.Get("Content-Encoding"), tc.gzip)
		}
	}
}

// EntryInfo as E2B's SDK tests (tests/sandbox/files/{info,list,remove})
// assert it: mode is the permission bits only, a directory's size is
// whole blocks as on ext4 (above 0), a link's target is the absolute path the box sees, and
// removing what is not there succeeds (envd's os.RemoveAll), while Quro's
// own remove_file still says not_found.
func TestEnvdEntryInfoAsE2B(t *testing.T) {
	e := newEnv(t, nil)
	id := e.newSession(t)
	c := e.fsClient(id)
	ctx := context.Background()
	e.shell(t, id, "printf test > test_file.txt && ln -s test_file.txt test_symlink.txt && mkdir -p d/sub && ln -s ../test_file.txt d/up && ln -s /etc/hostname abs && "+
		"ln -s /home/user/d home_abs && ln -s test_symlink.txt chain && ln -s nothing dangling && ln -s loop1 loop2 && ln -s loop2 loop1 && ln -s ../../../../etc/passwd d/out")
	if _, err := c.MakeDir(ctx, rpc(&filesystem.MakeDirRequest{Path: "test_dir"})); err != nil {
		t.Fatal(err)
	}

	stat := func(p string) *filesystem.EntryInfo {
		t.Helper()
		st, err := c.Stat(ctx, rpc(&filesystem.StatRequest{Path: p}))
		if err != nil {
			t.Fatalf("%s: %v", p, err)
		}
		return st.Msg.GetEntry()
	}
	if en := stat("test_file.txt"); en.GetMode() != 0o644 || en.GetSize() != 4 || en.GetPermissions() != "-rw-r--r--" ||
		en.GetOwner() != "user" || en.GetGroup() != "user" || en.SymlinkTarget != nil {
		t.Errorf("file: %v", en)
	}
	// A directory's size is as on E2B's ext4 disk: whole 4096-byte
	// blocks, at least one, where stat says less (btrfs, a session disk,
	// counts its names' bytes: 0 for an empty directory; the SDK's
	// info.test.ts takes it above 0). Both directories here are empty.
	dirSize := func(p string) int64 {
		n, err := strconv.ParseInt(strings.TrimSpace(e.shell(t, id, "stat -c %s "+p)), 10, 64)
		if err != nil || n > 4096 {
			t.Fatalf("stat of the empty %s: %d %v", p, n, err)
		}
		return 4096
	}
	if en := stat("test_dir"); en.GetMode() != 0o755 || en.GetSize() != dirSize("test_dir") || en.GetPermissions() != "drwxr-xr-x" ||
		en.GetType() != filesystem.FileType_FILE_TYPE_DIRECTORY || en.GetOwner() != "user" || en.GetGroup() != "user" {
		t.Errorf("dir: %v", en)
	}
	// A link is described as envd describes it: its target's type (file
	// or directory; unspecified when it dangles, loops or leads where the
	// file API does not reach), never FILE_TYPE_SYMLINK, which the Python
	// SDK before 2.45 cannot map; symlinkTarget marks it as a link.
	for p, want := range map[string]struct {
		target string
		typ    filesystem.FileType
	}{
		"test_symlink.txt": {"/home/user/test_file.txt", filesystem.FileType_FILE_TYPE_FILE}, // beside it
		"d/up":             {"/home/user/test_file.txt", filesystem.FileType_FILE_TYPE_FILE}, // up from its directory
		"home_abs":         {"/home/user/d", filesystem.FileType_FILE_TYPE_DIRECTORY},        // absolute, in the home
		"chain":            {"/home/user/test_symlink.txt", filesystem.FileType_FILE_TYPE_FILE},
		"abs":              {"/etc/hostname", filesystem.FileType_FILE_TYPE_UNSPECIFIED}, // absolute: as it is
		"dangling":         {"/home/user/nothing", filesystem.FileType_FILE_TYPE_UNSPECIFIED},
		"loop1":            {"/home/user/loop2", filesystem.FileType_FILE_TYPE_UNSPECIFIED},
		"d/out":            {"/etc/passwd", filesystem.FileType_FILE_TYPE_UNSPECIFIED}, // never followed out
	} {
		en := stat(p)
		if en.GetSymlinkTarget() != want.target || en.GetType() != want.typ || en.GetSize() <= 0 {
			t.Errorf("%s: target %q type %v, want %q %v (%v)", p, en.GetSymlinkTarget(), en.GetType(), want.target, want.typ, en)
		}
	}

	ls, err := c.ListDir(ctx, rpc(&filesystem.ListDirRequest{Path: "/home/user/d", Depth: 1}))
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]*filesystem.EntryInfo{}
	for _, en := range ls.Msg.GetEntries() {
		got[en.GetName()] = en
	}
	if en := got["sub"]; en.GetMode() != 0o755 || en.GetSize() != dirSize("d/sub") || en.GetPath() != "/home/user/d/sub" {
		t.Errorf("listed dir: %v", en)
	}
	if en := got["up"]; en.GetSymlinkTarget() != "/home/user/test_file.txt" || en.GetType() != filesystem.FileType_FILE_TYPE_FILE {
		t.Errorf("listed link: %v", en)
	}

	if _, err := c.Remove(ctx, rpc(&filesystem.RemoveRequest{Path: "test_does_not_exist.txt"})); err != nil {
		t.Errorf("removing a missing file through E2B: %v", err)
	}
	_, err = e.App.Controller.Call(ctx, controller.Caller{Path: "cli", Tenant: e.Tenant, Scope: capability.ScopeExec}, "remove_file",
		json.RawMessage(`{"session":"`+id+`","path":"test_does_not_exist.txt"}`))
	if ce := (*capability.Error)(nil); !errors.As(err, &ce) || ce.Code != capability.NotFound {
		t.Errorf("Quro's remove_file of a missing file: %v", err)
	}
}

// A full disk is envd's 507 (the SDK's NotEnoughSpaceError) because the
// session's disk is full, not because a message reads "no space left": a
// missing file of that name is a 404.
func TestEnvdFilesNoSpace(t *testing.T) {
	e := newEnv(t, &app.Options{Limits: app.Limits{Tenant: app.TenantLimits{Disk: 64 << 20}}})
	id := e.newSession(t)

	res, body := e.filesReq(t, id, "GET", "path="+url.QueryEscape("no space left"), "", nil, nil)
	if res.StatusCode != http.StatusNotFound {
		t.Errorf("a missing file named \"no space left\": %d %s, want 404", res.StatusCode, body)
	}

	if out := e.shell(t, id, "head -c 70M /dev/zero > fill 2>/dev/null; echo rc=$?"); out != "rc=1\n" {
		t.Skipf("no kernel disk quota here: writing 70 MiB into a 64 MiB quota: %q", out)
	}
	res, body = e.filesReq(t, id, "POST", "path=more.bin", "application/octet-stream", bytes.NewReader(make([]byte, 1<<20)), nil)
	if res.StatusCode != http.StatusInsufficientStorage || !strings.Contains(string(body), "no space left on the session's disk") {
		t.Errorf("an upload into the full disk: %d %s, want 507", res.StatusCode, body)
	}
}

// A sandbox runs at most 8 watches at once, WatchDir streams and polling
// watchers together (under its tenant's cap): the next is refused,
// resource exhausted, saying what to do; one ending frees its place.
func TestEnvdWatchesBoundedPerSandbox(t *testing.T) {
	e := newEnv(t, nil)
	id := e.newSession(t)
	otherID := e.newSession(t)
	c := e.fsClient(id)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var streams []*connect.ServerStreamForClient[filesystem.WatchDirResponse]
	defer func() {
		cancel()
		for _, s := range streams {
			for s.Receive() {
			}
			s.Close()
		}
		// Killing the sandboxes ends their polling watchers.
		for _, sb := range []string{id, otherID} {
			args, _ := json.Marshal(map[string]any{"session": sb})
			if _, err := e.App.Controller.Call(context.Background(), controller.Caller{Path: "cli", Tenant: e.Tenant, Scope: capability.ScopeExec}, "destroy_session", args); err != nil {
				t.Error(err)
			}
		}
	}()
	for i := range 6 {
		s, err := c.WatchDir(ctx, rpc(&filesystem.WatchDirRequest{Path: "/home/user"}))
		if err != nil {
			t.Fatal(err)
		}
		streams = append(streams, s)
		if !s.Receive() || s.Msg().GetStart() == nil {
			t.Fatalf("watch %d: %v", i+1, s.Err())
		}
	}
	var wids []string
	for range 2 {
		cw, err := c.CreateWatcher(ctx, rpc(&filesystem.CreateWatcherRequest{Path: "/home/user"}))
		if err != nil {
			t.Fatal(err)
		}
		wids = append(wids, cw.Msg.GetWatcherId())
	}
	_, err := c.CreateWatcher(ctx, rpc(&filesystem.CreateWatcherRequest{Path: "/home/user"}))
	wantConnect(t, err, connect.CodeResourceExhausted, "8 watches running")
	s, err := c.WatchDir(ctx, rpc(&filesystem.WatchDirRequest{Path: "/home/user"}))
	if err == nil {
		streams = append(streams, s)
		if s.Receive() {
			t.Fatalf("a 9th watch started: %v", s.Msg())
		}
		err = s.Err()
	}
	wantConnect(t, err, connect.CodeResourceExhausted, "8 watches running")
	// Another sandbox is not affected.
	other := e.fsClient(otherID)
	if cw, err := other.CreateWatcher(ctx, rpc(&filesystem.CreateWatcherRequest{Path: "/home/user"})); err != nil {
		t.Fatalf("another sandbox: %v", err)
	} else if _, err := other.RemoveWatcher(ctx, rpc(&filesystem.RemoveWatcherRequest{WatcherId: cw.Msg.GetWatcherId()})); err != nil {
		t.Fatal(err)
	}
	// Removing a watcher frees its place (once its watch has ended: the
	// SDK's next call may come first, so this one retries until then).
	if _, err := c.RemoveWatcher(ctx, rpc(&filesystem.RemoveWatcherRequest{WatcherId: wids[0]})); err != nil {
		t.Fatal(err)
	}
	for {
		cw, err := c.CreateWatcher(ctx, rpc(&filesystem.CreateWatcherRequest{Path: "/home/user"}))
		if err == nil {
			wids[0] = cw.Msg.GetWatcherId()
			break
		}
		wantConnect(t, err, connect.CodeResourceExhausted, "8 watches running")
	}
}

// An upload over a watched file is seen as a write of that file (envd
// writes in place; E2B's watch tests wait for exactly that event).
func TestEnvdUploadIsAWriteToWatchers(t *testing.T) {
	e := newEnv(t, nil)
	id := e.newSession(t)
	c := e.fsClient(id)
	e.shell(t, id, "mkdir w && printf old > w/f.txt")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stream, err := c.WatchDir(ctx, rpc(&filesystem.WatchDirRequest{Path: "/home/user/w"}))
	if err != nil {
		t.Fatal(err)
	}
	if !stream.Receive() || stream.Msg().GetStart() == nil {
		t.Fatalf("first message %v (%v), want start", stream.Msg(), stream.Err())
	}
	req, _ := http.NewRequest(http.MethodPost, e.URL+"/files?path=/home/user/w/f.txt", strings.NewReader("new content"))
	req.Header.Set("Content-Type", "application/octet-stream")
	resp, err := e.sandboxClient(id, e2b.EnvdPort).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("upload: %d", resp.StatusCode)
	}
	// A mark after the upload: the watch's events keep their order, so
	// the write must come before it.
	e.shell(t, id, "touch w/zz-mark")
	for {
		if !stream.Receive() {
			t.Fatalf("stream ended before a write of f.txt: %v", stream.Err())
		}
		ev := stream.Msg().GetFilesystem()
		if ev == nil {
			continue
		}
		if ev.GetType() == filesystem.EventType_EVENT_TYPE_WRITE && ev.GetName() == "f.txt" {
			break
		}
		if ev.GetName() == "zz-mark" {
			t.Fatal("the upload over f.txt was no write of it")
		}
	}
}

// File metadata as envd 0.6.2 keeps it: X-Metadata-KEY upload headers
// become the file's user.e2b.key xattrs, shown in the upload's answer and
// in Stat, ListDir and Move; a replacement without them clears them;
// invalid ones write nothing.
func TestEnvdFileMetadata(t *testing.T) {
	e := newEnv(t, nil)
	id := e.newSession(t)
	c := e.fsClient(id)
	ctx := context.Background()
	md := map[string]string{"X-Metadata-author": "mish", "X-Metadata-Purpose": "up load"}
	want := map[string]string{"author": "mish", "purpose": "up load"}
	res, body := e.filesReq(t, id, "POST", "path=m.txt", "application/octet-stream", strings.NewReader("x"), md)
	if res.StatusCode != 200 || !strings.Contains(string(body), `"metadata":{"author":"mish","purpose":"up load"}`) {
		t.Fatalf("octet-stream upload: %d %s", res.StatusCode, body)
	}
	var mp bytes.Buffer
	mw := multipart.NewWriter(&mp)
	for _, name := range []string{"d/one.txt", "d/two.txt"} {
		pw, _ := mw.CreateFormFile("file", name)
		pw.Write([]byte(name))
	}
	mw.Close()
	if res, body := e.filesReq(t, id, "POST", "", mw.FormDataContentType(), &mp, md); res.StatusCode != 200 ||
		strings.Count(string(body), `"metadata":{"author":"mish","purpose":"up load"}`) != 2 {
		t.Fatalf("multipart upload: %d %s", res.StatusCode, body)
	}
	st, err := c.Stat(ctx, rpc(&filesystem.StatRequest{Path: "/home/user/m.txt"}))
	if err != nil || !maps.Equal(st.Msg.GetEntry().GetMetadata(), want) {
		t.Fatalf("stat: %v %v", st, err)
	}
	ls, err := c.ListDir(ctx, rpc(&filesystem.ListDirRequest{Path: "/home/user/d"}))
	if err != nil || len(ls.Msg.GetEntries()) != 2 || !maps.Equal(ls.Msg.GetEntries()[1].GetMetadata(), want) {
		t.Fatalf("list: %v %v", ls, err)
	}
	mv, err := c.Move(ctx, rpc(&filesystem.MoveRequest{Source: "/home/user/m.txt", Destination: "/home/user/n.txt"}))
	if err != nil || !maps.Equal(mv.Msg.GetEntry().GetMetadata(), want) {
		t.Fatalf("move: %v %v", mv, err)
	}
	// The box sees them as xattrs (E2B's namespace).
	if out := e.shell(t, id, `python3 -c "import os; print(os.getxattr('n.txt', 'user.e2b.author').decode())"`); out != "mish\n" {
		t.Fatalf("xattr in the box: %q", out)
	}
	// A replacement without metadata has none.
	if res, body := e.filesReq(t, id, "POST", "path=n.txt", "application/octet-stream", strings.NewReader("y"), nil); res.StatusCode != 200 ||
		strings.Contains(string(body), "metadata") {
		t.Fatalf("overwrite: %d %s", res.StatusCode, body)
	}
	if st, err := c.Stat(ctx, rpc(&filesystem.StatRequest{Path: "n.txt"})); err != nil || st.Msg.GetEntry().GetMetadata() != nil {
		t.Fatalf("stat after overwrite: %v %v", st, err)
	}
	// Invalid metadata: 400, and nothing written.
	for _, hdr := range []map[string]string{
		{"X-Metadata-Good": "caf\u00e9"},
		{"X-Metadata-" + strings.Repeat("k", 300): "v"},
		{"X-Metadata-Big": strings.Repeat("v", 5000)},
	} {
		res, body := e.filesReq(t, id, "POST", "path=bad.txt", "application/octet-stream", strings.NewReader("x"), hdr)
		if res.StatusCode != 400 || !strings.Contains(string(body), "metadata") {
			t.Errorf("invalid metadata: %d %s", res.StatusCode, body)
		}
	}
	if _, err := c.Stat(ctx, rpc(&filesystem.StatRequest{Path: "bad.txt"})); connect.CodeOf(err) != connect.CodeNotFound {
		t.Fatalf("a refused upload wrote: %v", err)
	}
}

// Attack: the box sets the xattrs it likes on its files (non-ASCII and
// control bytes, keys outside the token alphabet, a 60 KiB value, many
// keys); the server reads them as hostile: Stat still answers, with only
// what an upload could have set, within the bound.
func TestEnvdFileMetadataFromTheBox(t *testing.T) {
	e := newEnv(t, nil)
	id := e.newSession(t)
	e.shell(t, id, `python3 - <<'EOF'
import os
open('f.txt', 'w').close()
xs = [(b'user.e2b.ok', b'fine'), (b'user.e2b.bad\xff', b'x'), (b'user.e2b.Upper', b'x'), (b'user.e2b.ctl', b'a\x00\x1bb'),
      (b'user.e2b.utf', b'\xc3\x28'), (b'user.other', b'x'), (b'user.e2b.', b'empty key'), (b'user.e2b.big', b'v' * 1500)]
xs += [(b'user.e2b.k%03d' % i, b'v' * 30) for i in range(200)]
for k, v in xs:
    try:
        os.setxattr('f.txt', k, v)
    except OSError:
        pass  # the filesystem's own bounds (one block on ext4)
EOF`)
	st, err := e.fsClient(id).Stat(context.Background(), rpc(&filesystem.StatRequest{Path: "f.txt"}))
	if err != nil {
		t.Fatal(err)
	}
	got := st.Msg.GetEntry().GetMetadata()
	total := 0
	for k, v := range got {
		total += len("user.e2b.") + len(k) + len(v)
		if k == "upper" || k == "ctl" || k == "utf" || k == "" || !utf8.ValidString(v) || strings.ContainsAny(k+v, "\x00\x1b") {
			t.Errorf("a hostile xattr came through: %q=%q", k, v)
		}
	}
	if total > 4096 || got["ok"] != "fine" {
		t.Errorf("%d keys, %d bytes", len(got), total)
	}
}

// A gzip download leaves in large HTTP chunks: node's fetch (the JS SDK)
// decodes a stream of small chunks very slowly (a 50 MB file in 16 KiB
// chunks took over 90 s, past the SDK's timeout). Read over a raw
// connection, the chunked body's chunks are of at least 512 KiB but the
// last, and they gunzip to the file.
func TestEnvdFilesGzipInLargeChunks(t *testing.T) {
	e := newEnv(t, nil)
	id := e.newSession(t)
	// Text that compresses to about three quarters (base64 of random
	// bytes): random bytes themselves are sent as they are (compressible).
	e.shell(t, id, "head -c 4500000 /dev/urandom | base64 > big.bin")
	want := e.shell(t, id, "sha256sum < big.bin | cut -c1-64")
	u, err := url.Parse(e.URL)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := net.Dial("tcp", u.Host)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "GET /files?path=big.bin&username=user HTTP/1.1\r\nHost: %s\r\n%s: %s\r\n%s: %d\r\nX-Access-Token: %s\r\nAccept-Encoding: gzip\r\nConnection: close\r\n\r\n",
		u.Host, e2b.HeaderSandboxID, id, e2b.HeaderSandboxPort, e2b.EnvdPort, e.accessToken(id))
	br := bufio.NewReader(conn)
	chunked := false
	for first := true; ; first = false {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		line = strings.TrimSpace(line)
		if first && !strings.HasPrefix(line, "HTTP/1.1 200") {
			t.Fatalf("status %q", line)
		}
		if strings.EqualFold(line, "Transfer-Encoding: chunked") {
			chunked = true
		}
		if line == "" {
			break
		}
	}
	if !chunked {
		t.Fatal("the gzip download is not chunked")
	}
	var body bytes.Buffer
	var sizes []int64
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		n, err := strconv.ParseInt(strings.TrimSpace(line), 16, 64)
		if err != nil {
			t.Fatalf("chunk size %q: %v", line, err)
		}
		if n == 0 {
			break
		}
		sizes = append(sizes, n)
		if _, err := io.CopyN(&body, br, n+2); err != nil { // the data and its CRLF
			t.Fatal(err)
		}
		body.Truncate(body.Len() - 2)
	}
	for i, n := range sizes[:len(sizes)-1] {
		if n < 512<<10 {
			t.Errorf("chunk %d of %d is %d bytes (the first: %v)", i, len(sizes), n, sizes[:min(len(sizes), 10)])
			break
		}
	}
	zr, err := gzip.NewReader(&body)
	if err != nil {
		t.Fatal(err)
	}
	h := sha256.New()
	if _, err := io.Copy(h, zr); err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprintf("%x\n", h.Sum(nil)); got != want {
		t.Errorf("gunzipped sha256 %s, want %s", got, want)
	}
}
