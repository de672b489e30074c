package main

import (
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/quro-dev/quro/internal/store"
)

// schema2UID is the uid schema 2 gave the session whose workspace is ws.
func schema2UID(ws string) int {
	h := fnv.New32a()
	h.Write([]byte(filepath.Clean(ws)))
	return 2_000_000 + int(h.Sum32()%1_000_000)
}

// TestUIDCollisionCannotCrossTenants replays the attack: tenants c5 and
// c23 each have a session whose hashed uid (the scheme before session uids
// were allocated) is the same — in a schema-2 database, with c5's secret in
// its workspace and both workspaces owned by that uid. After the upgrade,
// code in c23's session, calling back with `quro call` and with raw HTTP
// on its socket, is c23's session: it sees its own workspace, never c5's
// file, session or box. Then the allocator is made to propose c5's uid for
// a new session of tenant c7, which gets a uid of its own and is just as
// confined.
func TestUIDCollisionCannotCrossTenants(t *testing.T) {
	t.Parallel()
	if os.Geteuid() != 0 {
		t.Skip("in-session calls need the server to run as root (a uid per session)")
	}
	data := t.TempDir()
	root := filepath.Join(data, "sessions")
	// Two session ids whose old uids collide (about a thousand tries).
	seen := map[int]string{}
	var c5, c23 string
	for c23 == "" {
		var b [16]byte
		rand.Read(b[:])
		id := hex.EncodeToString(b[:])
		u := schema2UID(filepath.Join(root, id, "workspace"))
		if other, ok := seen[u]; ok {
			c5, c23 = other, id
		}
		seen[u] = id
	}
	oldUID := schema2UID(filepath.Join(root, c5, "workspace"))
	writeSchema2DB(t, filepath.Join(data, "quro.db"), [][2]string{{c5, "c5"}, {c23, "c23"}})
	const secret = "C5-SECRET-91b2"
	for _, id := range []string{c5, c23} {
		// As the old server left them: the session's directory the
		// server's, its workspace and tmp the (shared) uid's, private.
		ws, tmp := filepath.Join(root, id, "workspace"), filepath.Join(root, id, "tmp")
		for _, d := range []string{ws, tmp} {
			if err := os.MkdirAll(d, 0o755); err != nil {
				t.Fatal(err)
			}
		}
		if id == c5 {
			if err := os.WriteFile(filepath.Join(ws, "secret.txt"), []byte(secret), 0o600); err != nil {
				t.Fatal(err)
			}
		}
		for _, d := range []string{ws, tmp} {
			filepath.WalkDir(d, func(p string, _ os.DirEntry, _ error) error {
				return os.Lchown(p, oldUID, oldUID)
			})
			os.Chmod(d, 0o700)
		}
	}

	srv := startServerIn(t, data)
	token := func(tenant string) []string {
		out, errs, code := quro(t, "", "token", "create", "--data", data, "--tenant", tenant, "--scopes", "read,exec")
		if code != 0 {
			t.Fatalf("token: %s", errs)
		}
		return []string{"Authorization", "Bearer " + strings.TrimSpace(out)}
	}
	const js = "application/json"
	run := func(auth []string, session, code string) string {
		t.Helper()
		// timeout_ms: the attack's few calls from inside the box took
		// longer than the default 30 s on a loaded machine.
		body, _ := json.Marshal(map[string]any{"lang": "sh", "session": session, "code": code, "timeout_ms": 240000})
		r := do(t, "POST", srv.url+"/v1/run_code", js, string(body), append([]string{"Accept", "text/plain"}, auth...)...)
		if r.status != 200 {
			t.Fatalf("%d %s", r.status, r.body)
		}
		return r.body
	}
	asC5, asC23 := token("c5"), token("c23")
	// The status waits for the engine probes the server started (the
	// Python one extracts into the data directory), so none still writes
	// there when the test ends.
	if r := do(t, "POST", srv.url+"/v1/get_service_status", js, `{}`, asC5...); r.status != 200 {
		t.Fatalf("%d %s", r.status, r.body)
	}

	// c5 still reaches its own file through its socket (the check below
	// would pass for a socket that answered nobody).
	if out := run(asC5, "work", `quro call read_file '{"path":"secret.txt"}'`); !strings.Contains(out, secret) {
		t.Fatalf("c5 cannot read its own file by quro call:\n%s", out)
	}
	// c23: its own session, its own files, its own uid.
	attack := `quro call --json get_session_status | grep '"id"'
quro call read_file '{"path":"secret.txt"}'; echo "read=$?"
quro call run_code '{"lang":"sh","code":"cat secret.txt ` + filepath.Join(root, c5, "workspace", "secret.txt") + `; ls /proc/*/root/ 2>/dev/null | head -1"}'
curl -sS --unix-socket /run/quro/api.sock -H 'Content-Type: application/json' -d '{"path":"secret.txt","session":"` + c5 + `"}' http://localhost/v1/read_file; echo
touch mine`
	out := run(asC23, "work", attack)
	if strings.Contains(out, secret) || !strings.Contains(out, `"id": "`+c23+`"`) || !strings.Contains(out, "read=1") {
		t.Fatalf("c23's code acted as c5's session or failed to call as its own:\n%s", out)
	}
	var st syscall.Stat_t
	if err := syscall.Stat(filepath.Join(root, c23, "workspace", "mine"), &st); err != nil {
		t.Fatal(err)
	}
	if int(st.Uid) == oldUID || int(st.Uid) < store.UIDFirst || int(st.Uid) >= store.UIDLimit {
		t.Fatalf("c23's code runs as uid %d (c5's is %d)", st.Uid, oldUID)
	}
	c23UID := int(st.Uid)
	// The session's terminal shell and its resident Python worker run
	// under its uid too, with its own socket.
	r := do(t, "POST", srv.url+"/v1/terminal_exec", js, `{"session":"work","command":"touch via-term; quro call --json get_session_status | grep '\"id\"'"}`,
		append([]string{"Accept", "text/plain"}, asC23...)...)
	if r.status != 200 || !strings.Contains(r.body, c23) || strings.Contains(r.body, c5) {
		t.Fatalf("terminal of c23: %d %s", r.status, r.body)
	}
	body, _ := json.Marshal(map[string]any{"lang": "python", "session": "work",
		"code": "import os; open('via-py', 'w').close(); print(os.path.exists('/run/quro/api.sock'))"})
	if r := do(t, "POST", srv.url+"/v1/run_code", js, string(body), append([]string{"Accept", "text/plain"}, asC23...)...); r.status != 200 || !strings.Contains(r.body, "True") {
		t.Fatalf("python of c23: %d %s", r.status, r.body)
	}
	for _, f := range []string{"via-term", "via-py"} {
		if err := syscall.Stat(filepath.Join(root, c23, "workspace", f), &st); err != nil || int(st.Uid) != c23UID {
			t.Fatalf("%s: uid %d (want c23's %d), %v", f, st.Uid, c23UID, err)
		}
	}
	if err := syscall.Stat(filepath.Join(root, c5, "workspace", "secret.txt"), &st); err != nil || int(st.Uid) != oldUID {
		t.Fatalf("c5's file changed hands: uid %d, %v", st.Uid, err)
	}

	// The new allocator, told to hand out c5's uid again, does not.
	t.Cleanup(store.SetUIDCandidate(func() int { return oldUID }))
	asC7 := token("c7")
	if r := do(t, "POST", srv.url+"/v1/sessions", js, `{"name":"work"}`, asC7...); r.status != 201 {
		t.Fatalf("%d %s", r.status, r.body)
	}
	out = run(asC7, "work", attack+`; quro call list_sessions`)
	if strings.Contains(out, secret) || strings.Contains(out, c5) && !strings.Contains(out, "not_found") || strings.Contains(out, c23) {
		t.Fatalf("c7's code reached another tenant:\n%s", out)
	}
	if err := syscall.Stat(filepath.Join(data, "sessions"), &st); err != nil {
		t.Fatal(err)
	}
	var c7ws string
	entries, _ := os.ReadDir(root)
	for _, e := range entries {
		if e.Name() != c5 && e.Name() != c23 {
			if _, err := os.Stat(filepath.Join(root, e.Name(), "workspace", "mine")); err == nil {
				c7ws = filepath.Join(root, e.Name(), "workspace")
			}
		}
	}
	if c7ws == "" {
		t.Fatalf("c7's code did not run in a workspace of its own:\n%s", out)
	}
	if err := syscall.Stat(filepath.Join(c7ws, "mine"), &st); err != nil || int(st.Uid) == oldUID {
		t.Fatalf("c7's session got c5's uid %d: %v", oldUID, err)
	}
}

// writeSchema2DB makes file a database of schema 2 with one session called
// "work" per {id, tenant}, the first the oldest.
func writeSchema2DB(t *testing.T, file string, sessions [][2]string) {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+file)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	for v, name := range []string{"0001_sessions.sql", "0002_tenancy_tokens_audit.sql"} {
		body, err := os.ReadFile(filepath.Join("..", "..", "internal", "store", "migrations", name))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := db.Exec(string(body)); err != nil {
			t.Fatal(err)
		}
		if _, err := db.Exec(fmt.Sprintf("PRAGMA user_version = %d", v+1)); err != nil {
			t.Fatal(err)
		}
	}
	for i, s := range sessions {
		if _, err := db.Exec("INSERT INTO sessions (id, name, tenant, created_at, last_used_at) VALUES (?, 'work', ?, ?, ?)", s[0], s[1], i, i); err != nil {
			t.Fatal(err)
		}
	}
}
