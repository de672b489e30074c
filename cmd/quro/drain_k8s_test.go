//go:build k8s

package main

// quro node drain on two nodes against a real API server (the harness of
// cluster_k8s_test.go): a node's sessions move with their files and
// settings, calls through any node reach the new owner, the next call
// says the processes were lost, the drained node places nothing new; and
// the node-to-node move route refuses hostile streams. Run:
//
//	go test -tags k8s -trimpath -count=1 -run TestClusterDrain ./cmd/quro/

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/tls"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"

	"github.com/quro-dev/quro/internal/cluster"
)

func TestClusterDrain(t *testing.T) {
	acme, admin := quroToken(), quroToken()
	a, b, dyn, owner := twoNodes(t, acme+" acme exec\n"+admin+" - admin\n")
	auth := func(tok string) []string { return []string{"Authorization", "Bearer " + tok} }
	create := func(via *node, body string) string {
		t.Helper()
		r := do(t, "POST", via.url+"/v1/sessions", "application/json", body, auth(acme)...)
		if r.status != http.StatusCreated {
			t.Fatalf("create %s: %d %s", body, r.status, r.body)
		}
		var out struct{ ID string }
		if err := json.Unmarshal([]byte(r.body), &out); err != nil || out.ID == "" {
			t.Fatalf("create: %s", r.body)
		}
		return out.ID
	}
	exec := func(t *testing.T, via *node, id, cmd string) string {
		t.Helper()
		return sessionExec(t, via, acme, id, cmd)
	}

	// Sessions through node a until two are node a's (placement spreads
	// them; the test needs some on the node it drains).
	var onA []string
	for i := 0; len(onA) < 2; i++ {
		if i == 10 {
			t.Fatalf("10 sessions, %d on node-a", len(onA))
		}
		id := create(a, fmt.Sprintf(`{"name":"d%d","env":{"KEPT":"v%d"},"metadata":{"team":"t%d"}}`, i, i, i))
		if owner(id) == "node-a" {
			onA = append(onA, id)
		}
	}
	// A nested tree, a large file and a link in the first; its sums.
	const setup = `mkdir -p tree/a/b/c && for i in 1 2 3; do echo "leaf $i" > tree/a/b/c/f$i.txt; done && echo top > tree/top.txt &&
head -c 24000000 /dev/urandom > big.bin && ln -s tree/a/b link && chmod 750 tree/a &&
mkdir -p venv/bin && ln -s /usr/bin/python3 venv/bin/python && ln -s python venv/bin/python3 && ln -s /etc/shadow shadow && cd tree &&
sha256sum ../big.bin a/b/c/f1.txt a/b/c/f2.txt a/b/c/f3.txt top.txt | sed 's#\.\./##'`
	sums := exec(t, a, onA[0], setup)
	exec(t, b, onA[1], "echo second > note.txt") // through the other node
	// A secret of the second session, set through the other node: it
	// moves with the session, its value in the move stream only.
	if r := do(t, "POST", b.url+"/v1/set_session_secret", "application/json",
		fmt.Sprintf(`{"session":%q,"name":"API_TOKEN","value":"s3cr3t-moved","hosts":["api.example.com"]}`, onA[1]), auth(acme)...); r.status != 200 {
		t.Fatalf("set_session_secret: %d %s", r.status, r.body)
	}
	var status struct {
		Secrets []struct{ Name, Placeholder string }
	}
	if r := do(t, "POST", a.url+"/v1/get_session_status", "application/json", fmt.Sprintf(`{"session":%q}`, onA[1]), auth(acme)...); r.status != 200 ||
		json.Unmarshal([]byte(r.body), &status) != nil || len(status.Secrets) != 1 || !strings.HasPrefix(status.Secrets[0].Placeholder, "quro-secret-") {
		t.Fatalf("the session's secret: %d %s", r.status, r.body)
	}
	placeholder := status.Secrets[0].Placeholder

	// An attack session that stays on node a: the move route's tests
	// below aim at it.
	var victim, victimName string
	for i := 0; victim == ""; i++ {
		if i == 10 {
			t.Fatal("no third session landed on node-a")
		}
		victimName = fmt.Sprintf("v%d", i)
		if id := create(a, `{"name":"`+victimName+`"}`); owner(id) == "node-a" {
			victim = id
		}
	}
	exec(t, a, victim, "echo mine > kept.txt")
	key := forwardKey(t, dyn)

	// A session on node a whose move fails: its tree is deeper than a
	// moved workspace may be, so node b refuses it after node a stopped
	// its processes.
	var stuck string
	for i := 0; stuck == ""; i++ {
		if i == 10 {
			t.Fatal("no fourth session landed on node-a")
		}
		if id := create(a, fmt.Sprintf(`{"name":"s%d"}`, i)); owner(id) == "node-a" {
			stuck = id
		}
	}
	exec(t, a, stuck, "mkdir -p $(printf 'd/%.0s' $(seq 300)) && echo stays > stays.txt")

	t.Run("a move on the public port is refused", func(t *testing.T) {
		// Signed with the cluster's key, on the port clients use: a move
		// comes from a node, over the node port, or not at all.
		req, _ := http.NewRequest("PUT", b.url+cluster.MovePath+victim, strings.NewReader("{}"))
		req.Header.Set(cluster.MoveHeader, cluster.MoveSignature(key, "node-a", "node-b", victim, time.Now()))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		rb, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusForbidden || !strings.Contains(string(rb), "node port") {
			t.Fatalf("a signed move on node b's public port: %d %s", resp.StatusCode, rb)
		}
	})

	t.Run("the move route refuses hostile streams", func(t *testing.T) {
		// What a node that is itself hostile sends: the move route's
		// checks, past the node port's (a client certificate a Lease pins).
		// It moves a session its record says it owns (a move is taken
		// only from the owner, as the node its certificate names).
		bPort, hostile := nodePort(t, dyn, "node-b", "node-hostile")
		own, ownName := fmt.Sprintf("%032x", time.Now().UnixNano()), "h0"
		ownedRecord(t, dyn, own, "node-hostile", ownName)
		putTo := func(t *testing.T, id, sig string, body io.Reader, hdr ...string) httpResult {
			t.Helper()
			return putMove(t, hostile, bPort, id, sig, body, hdr...)
		}
		put := func(t *testing.T, sig string, body io.Reader, hdr ...string) httpResult {
			t.Helper()
			return putTo(t, own, sig, body, hdr...)
		}
		// A session of node a's, moved by the hostile node as itself.
		if r := putTo(t, victim, cluster.MoveSignature(key, "node-hostile", "node-b", victim, time.Now()), strings.NewReader(fmt.Sprintf(`{"id":%q,"name":%q,"tenant":"acme","network":"none"}`+"\n", victim, victimName))); r.status != http.StatusForbidden || !strings.Contains(r.body, "not node-hostile's") {
			t.Errorf("node a's session moved by another node: %d %s", r.status, r.body)
		}
		settings := fmt.Sprintf(`{"id":%q,"name":%q,"tenant":"acme","network":"none"}`+"\n", own, ownName)
		stream := func(entries ...*tar.Header) io.Reader {
			var buf bytes.Buffer
			buf.WriteString(settings)
			tw := tar.NewWriter(&buf)
			for _, h := range entries {
				tw.WriteHeader(h)
				if (h.Typeflag == tar.TypeReg || h.Typeflag == 'Q') && h.Size < 1<<20 {
					tw.Write(bytes.Repeat([]byte("x"), int(h.Size)))
				}
			}
			tw.Flush() // an oversize entry's body is never written: the refusal comes first
			return &buf
		}
		// Each move signs anew: a header is good at its receiver, once.
		sign := func(to string) string { return cluster.MoveSignature(key, "node-hostile", to, own, time.Now()) }
		// A header captured from a move to node b that node b refused.
		captured := sign("node-b")
		outside := t.TempDir() // on the receiving node's host: stays empty
		defer func() {
			if ents, err := os.ReadDir(outside); err != nil || len(ents) != 0 {
				t.Errorf("a move stream wrote outside the workspace: %v %v", ents, err)
			}
		}()
		for _, tc := range []struct {
			name, sig string
			body      io.Reader
			status    int
			want      string
		}{
			{"no signature", "", stream(), http.StatusForbidden, "FROM TIME NONCE SIGNATURE"},
			{"a forged signature", "node-hostile " + fmt.Sprint(time.Now().Unix()) + " AAAAAAAAAAAAAAAAAAAAAA " + base64.RawURLEncoding.EncodeToString(make([]byte, 32)), stream(), http.StatusForbidden, "not signed"},
			{"a replay for another session", cluster.MoveSignature(key, "node-hostile", "node-b", onA[0], time.Now()), stream(), http.StatusForbidden, "not signed"},
			{"a stale signature", cluster.MoveSignature(key, "node-hostile", "node-b", own, time.Now().Add(-time.Hour)), stream(), http.StatusForbidden, "signed"},
			{"a move signed as another node", cluster.MoveSignature(key, "node-a", "node-b", own, time.Now()), stream(), http.StatusForbidden, "names node-a as its sender"},
			{"a header signed for another receiver", sign("node-c"), stream(), http.StatusForbidden, "not signed with the cluster's key for this session and this node"},
			{"a header captured from a refused move", captured, strings.NewReader(fmt.Sprintf(`{"id":%q,"name":"../x","tenant":"acme"}`+"\n", own)), http.StatusForbidden, "record says"},
			{"the captured header replayed to its receiver", captured, stream(), http.StatusForbidden, "used already"},
			{"a .. path", sign("node-b"), stream(&tar.Header{Name: "../escape.txt", Typeflag: tar.TypeReg, Size: 4, Mode: 0o644}), http.StatusBadRequest, "not a clean path"},
			{"an absolute path", sign("node-b"), stream(&tar.Header{Name: "/etc/cron.d/x", Typeflag: tar.TypeReg, Size: 4, Mode: 0o644}), http.StatusBadRequest, "not a clean path"},
			{"a file through a symlink out", sign("node-b"), stream(&tar.Header{Name: "out", Typeflag: tar.TypeSymlink, Linkname: "/etc"},
				&tar.Header{Name: "out/cron.d", Typeflag: tar.TypeReg, Size: 1, Mode: 0o644}), http.StatusBadRequest, "goes through the symbolic link"},
			{"a directory over a relative symlink out", sign("node-b"), stream(&tar.Header{Name: "up", Typeflag: tar.TypeSymlink, Linkname: "../../.."},
				&tar.Header{Name: "up/", Typeflag: tar.TypeDir, Mode: 0o777}), http.StatusBadRequest, "twice"},
			{"holes past a file's size", sign("node-b"), stream(&tar.Header{Name: "s", Typeflag: 'Q', Size: 1, Mode: 0o644,
				PAXRecords: map[string]string{"QURO.sparse.map": "4096+1", "QURO.sparse.size": "1"}}), http.StatusBadRequest, "map of holes"},
			// Links out of /home/user travel as links; nothing is written
			// through one made by an earlier entry, under it or in its place.
			{"a file through a link out", sign("node-b"), stream(&tar.Header{Name: "out", Typeflag: tar.TypeSymlink, Linkname: outside},
				&tar.Header{Name: "out/x", Typeflag: tar.TypeReg, Size: 1, Mode: 0o644}), http.StatusBadRequest, "goes through the symbolic link"},
			{"a file in place of a link out", sign("node-b"), stream(&tar.Header{Name: "out", Typeflag: tar.TypeSymlink, Linkname: outside + "/x"},
				&tar.Header{Name: "out", Typeflag: tar.TypeReg, Size: 1, Mode: 0o644}), http.StatusBadRequest, "twice"},
			{"a file through a relative link out", sign("node-b"), stream(&tar.Header{Name: "d/up", Typeflag: tar.TypeSymlink, Linkname: "../../../../../../../.." + outside},
				&tar.Header{Name: "d/up/x", Typeflag: tar.TypeReg, Size: 1, Mode: 0o644}), http.StatusBadRequest, "goes through the symbolic link"},
			{"a file through a link", sign("node-b"), stream(&tar.Header{Name: "in", Typeflag: tar.TypeSymlink, Linkname: "sub"},
				&tar.Header{Name: "in/x", Typeflag: tar.TypeReg, Size: 1, Mode: 0o644}), http.StatusBadRequest, "goes through the symbolic link"},
			{"a hard link to the host", sign("node-b"), stream(&tar.Header{Name: "h", Typeflag: tar.TypeLink, Linkname: "/etc/shadow"}), http.StatusBadRequest, "not a file made before it"},
			{"a device", sign("node-b"), stream(&tar.Header{Name: "mem", Typeflag: tar.TypeChar, Devmajor: 1, Devminor: 1}), http.StatusBadRequest, "character device"},
			{"oversize", sign("node-b"), stream(&tar.Header{Name: "huge", Typeflag: tar.TypeReg, Size: 3 << 30, Mode: 0o644}), 0, "disk quota"},
			{"settings of another session", sign("node-b"), strings.NewReader(fmt.Sprintf(`{"id":%q,"tenant":"acme"}`+"\n", onA[0])), http.StatusBadRequest, "not"},
			{"another tenant", sign("node-b"), strings.NewReader(fmt.Sprintf(`{"id":%q,"name":%q,"tenant":"other"}`+"\n", own, ownName)), http.StatusForbidden, "record says"},
			{"a bad name", sign("node-b"), strings.NewReader(fmt.Sprintf(`{"id":%q,"name":"../x","tenant":"acme"}`+"\n", own)), http.StatusForbidden, "record says"},
			// Settings a create refuses are refused in a move stream too.
			{"the loader's variable", sign("node-b"), strings.NewReader(fmt.Sprintf(`{"id":%q,"name":%q,"tenant":"acme","network":"none","env":{"LD_PRELOAD":"/home/user/x.so"}}`+"\n", own, ownName)), http.StatusBadRequest, "LD_PRELOAD"},
			{"egress rules of no internet policy", sign("node-b"), strings.NewReader(fmt.Sprintf(`{"id":%q,"name":%q,"tenant":"acme","network":"none","network_rules":{"allow":["10.0.0.0/8"]}}`+"\n", own, ownName)), http.StatusBadRequest, "rules of network internet"},
			{"a lifetime past the longest", sign("node-b"), strings.NewReader(fmt.Sprintf(`{"id":%q,"name":%q,"tenant":"acme","network":"none","expires_at":"2999-01-01T00:00:00Z"}`+"\n", own, ownName)), http.StatusBadRequest, "days from now"},
		} {
			r := put(t, tc.sig, tc.body)
			if r.status == http.StatusOK || tc.status != 0 && r.status != tc.status || !strings.Contains(r.body, tc.want) {
				t.Errorf("%s: %d %s (want %d, %q)", tc.name, r.status, r.body, tc.status, tc.want)
			}
		}
		// A drain's id goes into the tenant's audit log on the receiver:
		// anything but its form is refused, even under a good signature.
		for _, bad := range []string{`0123456789abcdef" to="node-z`, "../../../etc", strings.Repeat("a", 4000)} {
			if r := put(t, sign("node-b"), stream(), cluster.DrainHeader, bad); r.status != http.StatusBadRequest || !strings.Contains(r.body, "not a drain's id") {
				t.Errorf("drain id %.40q: %d %s", bad, r.status, r.body)
			}
		}
		// Nothing moved: the record is still node a's, and the session
		// works there with its file.
		if o := owner(victim); o != "node-a" {
			t.Fatalf("after the refused moves the record names %s", o)
		}
		if o := owner(own); o != "node-hostile" {
			t.Fatalf("after the refused moves the hostile node's record names %s", o)
		}
		if out := exec(t, b, victim, "cat kept.txt; ls"); !strings.Contains(out, "mine") || strings.Contains(out, "huge") || strings.Contains(out, "escape") {
			t.Fatalf("the victim after the refused moves: %q", out)
		}
	})

	t.Run("drain moves every session with its files", func(t *testing.T) {
		out, errOut, err := nodeDrain(t, a, admin)
		if err == nil || !strings.Contains(err.Error(), "1 sessions stay") {
			t.Fatalf("quro node drain with a session that cannot move: %v\n%s%s", err, out.String(), errOut.String())
		}
		t.Logf("quro node drain:\n%s", out.String())
		if !strings.Contains(out.String(), "NOT moved "+stuck) || !strings.Contains(out.String(), " moved, 1 not") {
			t.Errorf("the drain did not report %s not moved", stuck)
		}
		for _, id := range append(onA, victim) {
			if !strings.Contains(out.String(), "moved "+id) {
				t.Errorf("the drain did not report %s moved", id)
			}
			if o := owner(id); o != "node-b" {
				t.Errorf("session %s: owner %s after the drain", id, o)
			}
		}
		l, err := dyn.Resource(cluster.LeasesGVR).Namespace("default").Get(context.Background(), cluster.LeasePrefix+"node-a", metav1.GetOptions{})
		if err != nil || l.GetAnnotations()[cluster.AnnotDraining] != "true" {
			t.Fatalf("node a's Lease does not say draining: %v %v", err, l.GetAnnotations())
		}

		// The next call says the processes were lost (one line), and
		// runs on the new owner, reached through the drained node.
		body, _ := json.Marshal(map[string]any{"session": onA[0], "lang": "python", "code": "import os; print(open('tree/top.txt').read().strip(), os.environ.get('KEPT'))"})
		r := do(t, "POST", a.url+"/v1/run_code", "application/json", string(body), auth(acme)...)
		var rc struct {
			Stdout string   `json:"stdout"`
			Notes  []string `json:"notes"`
		}
		if r.status != 200 || json.Unmarshal([]byte(r.body), &rc) != nil || strings.TrimSpace(rc.Stdout) != "top v0" {
			t.Fatalf("run_code after the move: %d %s", r.status, r.body)
		}
		if len(rc.Notes) == 0 || !strings.Contains(rc.Notes[0], "moved to another node") || strings.Contains(rc.Notes[0], "\n") {
			t.Fatalf("the first call after the move does not say the processes were lost in one line: %q", rc.Notes)
		}
		r = do(t, "POST", a.url+"/v1/run_code", "application/json", string(body), auth(acme)...)
		if strings.Contains(r.body, "moved to another node") {
			t.Fatalf("the second call after the move says it again: %s", r.body)
		}

		// Files intact, through either node: the large file and the
		// tree by their sums, the link as a link, the modes.
		for _, via := range []*node{a, b} {
			got := exec(t, via, onA[0], "cd /home/user/tree && sha256sum ../big.bin a/b/c/f1.txt a/b/c/f2.txt a/b/c/f3.txt top.txt | sed 's#\\.\\./##'")
			if got != sums {
				t.Fatalf("sums through %s after the move:\n%s\nbefore:\n%s", via.name, got, sums)
			}
		}
		if got := exec(t, a, onA[0], `cd /home/user && readlink link; stat -c %a tree/a; echo "$KEPT"; id -u; stat -c %u big.bin`); !strings.HasPrefix(got, "tree/a/b\n750\nv0\n") {
			t.Fatalf("link, mode or variable after the move: %q", got)
		} else if f := strings.Fields(got); len(f) != 5 || f[3] != f[4] {
			t.Fatalf("the moved files are not the session's own uid: %q", got)
		}
		// A venv's links out of /home/user came as links (never
		// followed: the copy holds no python binary nor the host's
		// shadow file), and resolve in the new box.
		if got := exec(t, b, onA[0], `cd /home/user && for l in venv/bin/python venv/bin/python3 shadow; do test -L $l && readlink $l; done; venv/bin/python3 -c 'print(6*7)'`); got != "/usr/bin/python3\npython\n/etc/shadow\n42\n" {
			t.Fatalf("a venv's links after the move: %q", got)
		}
		if got := exec(t, a, onA[1], "cat /home/user/note.txt"); got != "second\n" {
			t.Fatalf("the second session's file after the move: %q", got)
		}
		// Its secret came with it: the same placeholder in the box (a
		// shell started since the move), the secret listed on its new
		// node; its value in no answer and not in the record.
		if got := exec(t, a, onA[1], `printf %s "$API_TOKEN"`); got != placeholder {
			t.Fatalf("the secret's variable after the move: %q, before %q", got, placeholder)
		}
		st := do(t, "POST", a.url+"/v1/get_session_status", "application/json", fmt.Sprintf(`{"session":%q}`, onA[1]), auth(acme)...)
		if st.status != 200 || !strings.Contains(st.body, `"API_TOKEN"`) || !strings.Contains(st.body, placeholder) || !strings.Contains(st.body, "api.example.com") || strings.Contains(st.body, "s3cr3t") {
			t.Fatalf("the moved session's secrets: %d %s", st.status, st.body)
		}
		rec, err := dyn.Resource(cluster.SessionsGVR).Namespace("default").Get(context.Background(), onA[1], metav1.GetOptions{})
		if raw, _ := json.Marshal(rec); err != nil || strings.Contains(string(raw), "s3cr3t") || strings.Contains(string(raw), "API_TOKEN") {
			t.Fatalf("the moved session's record holds its secret: %v %s", err, raw)
		}

		// The session whose move failed stays on node a with its files;
		// its next call, through either node, says its processes were
		// stopped, once.
		if o := owner(stuck); o != "node-a" {
			t.Fatalf("the session whose move failed is %s's", o)
		}
		body, _ = json.Marshal(map[string]any{"session": stuck, "lang": "python", "code": "print(open('stays.txt').read().strip())"})
		r = do(t, "POST", b.url+"/v1/run_code", "application/json", string(body), auth(acme)...)
		if r.status != 200 || json.Unmarshal([]byte(r.body), &rc) != nil || strings.TrimSpace(rc.Stdout) != "stays" {
			t.Fatalf("run_code after a failed move: %d %s", r.status, r.body)
		}
		if len(rc.Notes) == 0 || !strings.Contains(rc.Notes[0], "move of this session to another node of the cluster failed") ||
			!strings.Contains(rc.Notes[0], "processes") || strings.Contains(rc.Notes[0], "\n") {
			t.Fatalf("the first call after a failed move does not say its processes were stopped, in one line: %q", rc.Notes)
		}
		if r = do(t, "POST", b.url+"/v1/run_code", "application/json", string(body), auth(acme)...); strings.Contains(r.body, "failed; it stays") {
			t.Fatalf("the second call after a failed move says it again: %s", r.body)
		}
	})

	// Each move is in its session's tenant's audit log, with the nodes'
	// names and the drain's id, on both sides: the drained node's entry,
	// and the receiving node's (adopted from which node, by which drain);
	// the drain in the operator's; no host path in any.
	t.Run("drains are audited", func(t *testing.T) {
		type entries struct {
			Entries []struct {
				Capability, Args, Outcome, Message, Session, Node, Path string
			}
		}
		var moves entries
		r := do(t, "GET", a.url+"/v1/audit?capability=session_move&limit=100", "", "", auth(acme)...)
		if r.status != 200 || json.Unmarshal([]byte(r.body), &moves) != nil {
			t.Fatalf("acme's audit of moves: %d %s", r.status, r.body)
		}
		movesBody := r.body
		got := map[string]string{} // session and node -> its entry
		for _, e := range moves.Entries {
			k := e.Session + " on " + e.Node
			if _, dup := got[k]; dup {
				t.Errorf("two entries for the move of %s: %s", k, r.body)
			}
			got[k] = e.Outcome + " " + e.Path + " " + e.Args + " " + e.Message
		}
		drainID := regexp.MustCompile(`drain="([0-9a-f]{16})"`)
		var drain string
		for _, id := range append(onA, victim) {
			sent, took := got[id+" on node-a"], got[id+" on node-b"]
			if !strings.HasPrefix(sent, "ok ") || !strings.Contains(sent, `from="node-a"`) || !strings.Contains(sent, `to="node-b"`) {
				t.Errorf("the drained node's audit entry of %s's move: %q", id, sent)
			}
			if !strings.HasPrefix(took, "ok cluster ") || !strings.Contains(took, `from="node-a"`) || !strings.Contains(took, `to="node-b"`) ||
				!strings.Contains(took, "files=") {
				t.Errorf("the receiving node's audit entry of %s's move: %q", id, took)
			}
			m1, m2 := drainID.FindStringSubmatch(sent), drainID.FindStringSubmatch(took)
			if m1 == nil || m2 == nil || m1[1] != m2[1] || drain != "" && m1[1] != drain {
				t.Errorf("the entries of %s's move do not name one drain: %q, %q (the drain: %q)", id, sent, took, drain)
			} else {
				drain = m1[1]
			}
		}
		if g := got[stuck+" on node-a"]; !strings.HasPrefix(g, "unavailable ") || !strings.Contains(g, "failed") || !strings.Contains(g, `from="node-a"`) {
			t.Errorf("the audit entry of %s's failed move: %q", stuck, g)
		}
		if g, ok := got[stuck+" on node-b"]; ok {
			t.Errorf("node b audited a move it refused as taken: %q", g)
		}
		var drains entries
		r = do(t, "GET", a.url+"/v1/audit?capability=node_drain&limit=100", "", "", auth(admin)...)
		if r.status != 200 || json.Unmarshal([]byte(r.body), &drains) != nil || len(drains.Entries) != 1 {
			t.Fatalf("the operator's audit of drains: %d %s", r.status, r.body)
		}
		if e := drains.Entries[0]; e.Outcome != "unavailable" || !strings.Contains(e.Args, `node="node-a"`) || !strings.Contains(e.Args, "failed=1") ||
			!strings.Contains(e.Args, `drain="`+drain+`"`) {
			t.Fatalf("the drain's audit entry: %+v", e)
		}
		for _, body := range []string{r.body, movesBody} {
			if strings.Contains(body, "/var/") || strings.Contains(body, "/tmp/") || strings.Contains(body, os.TempDir()) {
				t.Fatalf("a host path in the audit of a drain: %s", body)
			}
		}
		// Its metadata came along.
		r = do(t, "GET", a.url+"/v1/sessions/"+onA[0], "", "", auth(acme)...)
		if r.status != 200 || !strings.Contains(r.body, `"team":"t0"`) {
			t.Fatalf("the session's metadata after the move: %d %s", r.status, r.body)
		}
	})

	t.Run("a drained node places nothing new", func(t *testing.T) {
		for i := range 3 {
			if o := owner(create(a, fmt.Sprintf(`{"name":"after%d"}`, i))); o != "node-b" {
				t.Fatalf("a session made after the drain landed on %s", o)
			}
		}
	})

	// A second drain ends with nothing left: none of the sessions moved
	// comes up again. (A node makes its local tenant's "default" session
	// anew when a status call asks for it: the second drain moves that
	// one, which is all it may list.)
	t.Run("a second drain finds nothing left", func(t *testing.T) {
		// The session that could not move can once its deep tree is gone.
		exec(t, b, stuck, "rm -rf d")
		r := do(t, "POST", a.url+DrainPath, "", "", auth(admin)...)
		if r.status != 200 || !strings.Contains(r.body, `"done":true`) || strings.Contains(r.body, `"ok":false`) {
			t.Fatalf("second drain: %d %s", r.status, r.body)
		}
		for _, id := range append(onA, victim) {
			if strings.Contains(r.body, id) {
				t.Fatalf("the second drain moved %s again: %s", id, r.body)
			}
		}
		if o := owner(stuck); o != "node-b" || !strings.Contains(r.body, stuck) {
			t.Fatalf("the second drain did not move %s (owner %s): %s", stuck, o, r.body)
		}
		if got := exec(t, a, stuck, "cat stays.txt"); got != "stays\n" {
			t.Fatalf("the file of the session moved by the second drain: %q", got)
		}
		for _, l := range strings.Split(strings.TrimSpace(r.body), "\n") {
			if strings.Contains(l, `"session"`) && !strings.Contains(l, `"name":"default"`) && !strings.Contains(l, stuck) {
				t.Fatalf("the second drain found a session other than a new default one: %s", l)
			}
		}
		if r := do(t, "POST", a.url+DrainPath, "", "", auth(acme)...); r.status != http.StatusForbidden {
			t.Fatalf("a tenant's token drained a node: %d %s", r.status, r.body)
		}
	})
}

// forwardKey reads the cluster's forwarding key from its Secret.
func forwardKey(t *testing.T, dyn dynamic.Interface) []byte {
	t.Helper()
	u, err := dyn.Resource(cluster.SecretsGVR).Namespace("default").Get(context.Background(), cluster.ForwardKeySecret, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	enc, _, _ := unstructured.NestedString(u.Object, "data", "key")
	key, err := base64.StdEncoding.DecodeString(enc)
	if err != nil {
		t.Fatal(err)
	}
	return key
}

// nodeDrain runs quro node drain against node n with the operator's
// token admin and returns what it printed and its error.
func nodeDrain(t *testing.T, n *node, admin string) (out, errOut *bytes.Buffer, err error) {
	t.Helper()
	adminFile := filepath.Join(t.TempDir(), "admin")
	if err := os.WriteFile(adminFile, []byte(admin), 0o600); err != nil {
		t.Fatal(err)
	}
	out, errOut = &bytes.Buffer{}, &bytes.Buffer{}
	root := newRoot(strings.NewReader(""), out, errOut)
	root.SetArgs([]string{"node", "drain", "--server", n.url, "--token-file", adminFile})
	return out, errOut, root.ExecuteContext(context.Background())
}

// sessionExec runs cmd in session id through node via with token tok
// and returns its output; it must exit 0.
func sessionExec(t *testing.T, via *node, tok, id, cmd string) string {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"command": cmd})
	r := do(t, "POST", via.url+"/v1/sessions/"+id+"/exec", "application/json", string(body), "Authorization", "Bearer "+tok)
	var res struct {
		Output   string `json:"output"`
		ExitCode int    `json:"exit_code"`
	}
	if r.status != 200 || json.Unmarshal([]byte(r.body), &res) != nil || res.ExitCode != 0 {
		t.Fatalf("exec %q in %s through %s: %d %s", cmd, id, via.name, r.status, r.body)
	}
	return res.Output
}

// ownedRecord makes session id's record (tenant acme, named name),
// owned by node, for the test's length: a session a node of the test's
// (nodePort) may move.
func ownedRecord(t *testing.T, dyn dynamic.Interface, id, node, name string) {
	t.Helper()
	records := dyn.Resource(cluster.SessionsGVR).Namespace("default")
	if _, err := records.Create(context.Background(), &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": cluster.Group + "/" + cluster.Version, "kind": "Session", "metadata": map[string]any{"name": id},
		"spec": map[string]any{"node": node, "tenant": "acme", "name": name, "network": "none",
			"created": time.Now().UTC().Format(time.RFC3339)}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { records.Delete(context.Background(), id, metav1.DeleteOptions{}) })
}

// putMove sends body as session id's move to the node port at addr
// through c (nodePort's), signed sig ("": unsigned), with hdr's headers.
func putMove(t *testing.T, c *http.Client, addr, id, sig string, body io.Reader, hdr ...string) httpResult {
	t.Helper()
	return moveRoute(t, c, "PUT", addr, id, sig, body, hdr...)
}

// moveRoute sends method to node addr's move route for session id: PUT
// a move, POST a drain's admission probe.
func moveRoute(t *testing.T, c *http.Client, method, addr, id, sig string, body io.Reader, hdr ...string) httpResult {
	t.Helper()
	req, _ := http.NewRequest(method, "https://"+addr+cluster.MovePath+id, body)
	if sig != "" {
		req.Header.Set(cluster.MoveHeader, sig)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	rb, _ := io.ReadAll(resp.Body)
	return httpResult{resp.StatusCode, string(rb), resp.Header.Get("Content-Type")}
}

// nodePort is the node port's address of node to, from its Lease, and a
// client of it as node from: a key pair of the test's whose pin a Lease
// of from publishes (renewed an hour ago: no session is placed there),
// as a node of the cluster that turned hostile would hold. The client
// checks to's certificate against to's pin.
func nodePort(t *testing.T, dyn dynamic.Interface, to, from string) (string, *http.Client) {
	t.Helper()
	ctx := context.Background()
	leases := dyn.Resource(cluster.LeasesGVR).Namespace("default")
	l, err := leases.Get(ctx, cluster.LeasePrefix+to, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	addr, pin := l.GetAnnotations()[cluster.AnnotAddress], l.GetAnnotations()[cluster.AnnotPin]
	if addr == "" || pin == "" {
		t.Fatalf("%s's Lease names no node port: %v", to, l.GetAnnotations())
	}
	id, err := cluster.NewNodeTLS(from)
	if err != nil {
		t.Fatal(err)
	}
	lease := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
		"metadata": map[string]any{"name": cluster.LeasePrefix + from, "namespace": "default",
			"labels":      map[string]any{cluster.LabelComponent: cluster.ComponentNode, cluster.LabelNode: from},
			"annotations": map[string]any{cluster.AnnotAddress: "127.0.0.1:1", cluster.AnnotPin: id.Pin()}},
		"spec": map[string]any{"holderIdentity": from, "leaseDurationSeconds": int64(15),
			"renewTime": metav1.NewMicroTime(time.Now().Add(-time.Hour)).Format(metav1.RFC3339Micro)},
	}}
	if _, err := leases.Create(ctx, lease, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { leases.Delete(context.Background(), cluster.LeasePrefix+from, metav1.DeleteOptions{}) })
	conf := &tls.Config{
		Certificates: []tls.Certificate{id.Certificate()},
		// Checked against to's pin (VerifyConnection), not a CA.
		InsecureSkipVerify: true,
		VerifyConnection: func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 || cluster.Pin(cs.PeerCertificates[0].Raw) != pin {
				return fmt.Errorf("%s's node port presented a certificate its Lease does not pin", to)
			}
			return nil
		},
	}
	c := &http.Client{Transport: &http.Transport{TLSClientConfig: conf}}
	t.Cleanup(c.CloseIdleConnections)
	return addr, c
}
