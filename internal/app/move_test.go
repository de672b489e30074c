package app

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"io"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/quro-dev/quro/internal/capability"
	"github.com/quro-dev/quro/internal/controller"
	"github.com/quro-dev/quro/internal/egress"
	"github.com/quro-dev/quro/internal/session"
)

// TestMoveBetweenApps moves a session from one server's data directory to
// another's the way a drain does (quiesce, export, import, release):
// files, links, modes and variables arrive, calls wait meanwhile, the
// first call after says the processes were lost and the old copy is gone.
func TestMoveBetweenApps(t *testing.T) {
	t.Parallel()
	from, to := newApp(t, nil), newApp(t, nil)
	ctx := context.Background()
	info := mustCall(t, from, "create_session", CreateSessionInput{Name: "mover", Env: map[string]string{"KEPT": "yes"},
		Metadata: map[string]string{"team": "x"}}).(*SessionInfo)
	id := info.ID
	exec := func(a *App, cmd string) (string, error) {
		t.Helper()
		r, err := call(t, a, "terminal_exec", TerminalExecInput{Session: id, Command: cmd})
		if err != nil {
			return "", err
		}
		return r.Text, nil
	}
	if _, err := exec(from, "mkdir -p a/b && echo deep > a/b/f.txt && ln -s a/b l && chmod 700 a && cd a"); err != nil {
		t.Fatal(err)
	}
	m := from.Mover()
	if err := m.Quiesce(ctx, id); err != nil {
		t.Fatal(err)
	}
	if _, err := exec(from, "echo nope"); !errors.Is(err, session.ErrMoving) && capabilityCode(err) != capability.Unavailable {
		t.Fatalf("a call while quiesced: %v", err)
	}
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(m.Export(ctx, id, pw)) }()
	name, files, size, err := to.Mover().Import(ctx, id, "", "mover", pr)
	if err != nil || name != "mover" || files != 1 || size != 5 {
		t.Fatalf("import: %q %d files %d bytes, %v", name, files, size, err)
	}
	if err := m.Release(ctx, id); err != nil {
		t.Fatal(err)
	}
	if _, err := from.Sessions.ByIDAnyTenant(ctx, id); !errors.Is(err, session.ErrNotFound) {
		t.Fatalf("the old copy after release: %v", err)
	}
	out, err := exec(to, `pwd; cd /home/user && cat a/b/f.txt; readlink l; stat -c %a a; echo "$KEPT"`)
	if err != nil {
		t.Fatal(err)
	}
	first, rest, _ := strings.Cut(out, "\n")
	if first != MoveNote {
		t.Fatalf("the first call after the move does not start with the note: %q", out)
	}
	if !strings.HasPrefix(rest, "/home/user/a\ndeep\na/b\n700\nyes\n") {
		t.Fatalf("after the move: %q", rest)
	}
	if out, _ := exec(to, "true"); strings.Contains(out, MoveNote) {
		t.Fatalf("the note came twice: %q", out)
	}
	got := mustCall(t, to, "get_session_status", SessionRef{Session: id}).(*SessionInfo)
	if got.Metadata["team"] != "x" {
		t.Fatalf("metadata after the move: %v", got.Metadata)
	}
}

func capabilityCode(err error) capability.Code {
	var ce *capability.Error
	if errors.As(err, &ce) {
		return ce.Code
	}
	return ""
}

// TestMoveOfAWorkspaceABoxMade: a session's code makes, in one command,
// what a workspace may hold — three sparse files of 1 GiB each (the box's
// largest file; no disk on its own node), one 64 MiB file under 40
// names (64 MiB there), a virtualenv's link to the system's python, a
// fifo, a name with a newline — and the session moves: within its 2 GiB
// quota on the node it goes to, at the cost of its data, with its names
// and links as they were. (Before, the stream sent each sparse file as
// zeros and each name as a copy, so the move was refused for the quota —
// or, with none, wrote them all to the other node's disk — and the link
// out was refused: such a session could not be drained.)
func TestMoveOfAWorkspaceABoxMade(t *testing.T) {
	t.Parallel()
	from, to := newApp(t, nil), newApp(t, nil)
	ctx := context.Background()
	id := mustCall(t, from, "create_session", CreateSessionInput{Name: "hostile"}).(*SessionInfo).ID
	exec := func(a *App, cmd string) string {
		t.Helper()
		r, err := call(t, a, "terminal_exec", TerminalExecInput{Session: id, Command: cmd, TimeoutMS: 110_000})
		if err != nil {
			t.Fatal(err)
		}
		return r.Text
	}
	const made = "made"
	if out := exec(from, `for i in 1 2 3; do truncate -s 1073741820 s$i && printf end >> s$i || exit; done
head -c 67108864 /dev/zero > one && mkdir names && for i in $(seq 40); do ln one names/$i || exit; done
mkdir -p .venv/bin && ln -s /usr/bin/python3 .venv/bin/python && mkfifo pipe && printf nl > "$(printf 'new\nline')" &&
md5sum one > one.md5 && echo `+made); !strings.Contains(out, made) {
		t.Fatalf("making the workspace: %q", out)
	}
	m := from.Mover()
	if err := m.Quiesce(ctx, id); err != nil {
		t.Fatal(err)
	}
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(m.Export(ctx, id, pw)) }()
	_, files, size, err := to.Mover().Import(ctx, id, "", "hostile", pr)
	pr.CloseWithError(errors.New("the import ended"))
	if err != nil {
		t.Fatalf("import: %v", err)
	}
	if files != 6 || size > 65<<20 {
		t.Fatalf("import made %d files of %d bytes", files, size)
	}
	if err := m.Release(ctx, id); err != nil {
		t.Fatal(err)
	}
	out := exec(to, `stat -c '%s %h' s1 s2 s3 one; tail -c 3 s3; echo; md5sum -c --quiet one.md5 && echo same
readlink .venv/bin/python; cat "$(printf 'new\nline')"; echo; ls pipe 2>&1 | wc -l; du -s --block-size=1M . | cut -f1`)
	lines := strings.Split(strings.TrimSuffix(strings.TrimSpace(out), "\n[exit 0]"), "\n")
	want := []string{MoveNote, "1073741823 1", "1073741823 1", "1073741823 1", "67108864 41", "end", "same", "/usr/bin/python3", "nl", "1"}
	if len(lines) != len(want)+1 || !slices.Equal(lines[:len(want)], want) {
		t.Fatalf("after the move:\n%s\nwant:\n%s\n(then the MiB used)", out, strings.Join(want, "\n"))
	}
	if used, err := strconv.Atoi(lines[len(want)]); err != nil || used > 72 {
		t.Fatalf("the moved workspace uses %s MiB of disk", lines[len(want)])
	}
}

// TestMoveThatFailsLeavesTheSessionUsable: a move the receiver refuses
// after this node quiesced the session (its box and shell ended) leaves
// it usable here — a shell and a Python run start again — with its
// files, and its next call (only that one) says its processes were
// stopped.
func TestMoveThatFailsLeavesTheSessionUsable(t *testing.T) {
	t.Parallel()
	from, to := newApp(t, nil), newApp(t, nil)
	ctx := context.Background()
	id := mustCall(t, from, "create_session", CreateSessionInput{Name: "stays"}).(*SessionInfo).ID
	exec := func(cmd string) string {
		t.Helper()
		r, err := call(t, from, "terminal_exec", TerminalExecInput{Session: id, Command: cmd})
		if err != nil {
			t.Fatalf("%s: %v", cmd, err)
		}
		return r.Text
	}
	exec("echo kept > f.txt && export GONE=1")
	m := from.Mover()
	if err := m.Quiesce(ctx, id); err != nil {
		t.Fatal(err)
	}
	// The receiver refuses the stream: settings of another session.
	bad := strings.NewReader(`{"id":"0123456789abcdef0123456789abcdef","tenant":""}` + "\n")
	if _, _, _, err := to.Mover().Import(ctx, id, "", "stays", bad); capabilityCode(err) != capability.InvalidArgument {
		t.Fatalf("the receiver took a stream of another session: %v", err)
	}
	m.Unquiesce(id)
	out := exec(`cat f.txt; echo "GONE=$GONE"`)
	first, rest, _ := strings.Cut(out, "\n")
	if first != MoveFailedNote || !strings.HasPrefix(rest, "kept\nGONE=\n") {
		t.Fatalf("the first call after a failed move: %q", out)
	}
	if out := exec("echo again"); strings.Contains(out, "note:") || !strings.Contains(out, "again") {
		t.Fatalf("the second call after a failed move: %q", out)
	}
	r, err := call(t, from, "run_code", RunCodeInput{Session: id, Lang: "python", Code: "print(6*7)"})
	if err != nil || !strings.Contains(r.Text, "42") {
		t.Fatalf("a Python run after a failed move: %v %v", r, err)
	}
}

// TestImportChecksSettingsAsACreate sends hostile settings documents
// through a move's receiving side: each setting a create refuses is
// refused here too (the host's network past the server's ceiling, egress
// rules that do not parse or belong to no internet policy, a variable
// the loader obeys, metadata past its bounds, a lifetime past the
// longest, an unknown end action, a rootfs name with a path in it), and
// nothing of the session is left.
func TestImportChecksSettingsAsACreate(t *testing.T) {
	t.Parallel()
	// The receiver has the default ceiling (internet), as a server
	// started without --network-max.
	to, err := New(context.Background(), t.TempDir(), &Options{Python: testPython})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { to.Close() })
	ctx := context.Background()
	const id = "0123456789abcdef0123456789abcdef"
	far := time.Now().Add(MaxSessionTimeout + 48*time.Hour).UTC().Format(time.RFC3339)
	const ph = egress.PlaceholderPrefix + "0123456789abcdef0123456789abcdef"
	for _, tc := range []struct {
		name, settings string
		code           capability.Code
		want           string
	}{
		{"the host's network", `"network":"host"`, capability.PermissionDenied, `at most "internet"`},
		{"rules under none", `"network":"none","network_rules":{"allow":["pypi.org"]}`, capability.InvalidArgument, "rules of network internet"},
		{"a rule that does not parse", `"network":"internet","network_rules":{"deny":["http://x y"]}`, capability.InvalidArgument, "network rules"},
		{"a policy that is none", `"network":"everything"`, capability.InvalidArgument, "use none, internet or host"},
		{"the loader's variable", `"network":"none","env":{"LD_PRELOAD":"/home/user/x.so"}`, capability.InvalidArgument, "LD_PRELOAD"},
		{"a variable name with a dash", `"network":"none","env":{"A-B":"x"}`, capability.InvalidArgument, "not allowed"},
		{"metadata past its bounds", `"network":"none","metadata":{"` + strings.Repeat("k", 300) + `":"v"}`, capability.InvalidArgument, "metadata"},
		{"a lifetime past the longest", `"network":"none","expires_at":"` + far + `"`, capability.InvalidArgument, "days from now"},
		{"an unknown end action", `"network":"none","on_expiry":"explode"`, capability.InvalidArgument, "explode"},
		{"a rootfs path", `"network":"none","rootfs":"../../etc"`, capability.InvalidArgument, "rootfs"},
		{"a secret's placeholder of another form", `"network":"none","secrets":[{"name":"TOK","value":"` + b64("s3cr3t-value") + `","hosts":["api.example.com"],"placeholder":"$(reboot)"}]`, capability.InvalidArgument, "placeholder"},
		{"a secret's placeholder twice", `"network":"none","secrets":[{"name":"A","value":"` + b64("s3cr3t-value") + `","hosts":["api.example.com"],"placeholder":"` + ph + `"},{"name":"B","value":"` + b64("s3cr3t-value") + `","hosts":["api.example.com"],"placeholder":"` + ph + `"}]`, capability.InvalidArgument, "placeholder"},
		{"a secret's value with a line break", `"network":"none","secrets":[{"name":"TOK","value":"` + b64("s3cr3t-value\r\nX-Evil: 1") + `","hosts":["api.example.com"],"placeholder":"` + ph + `"}]`, capability.InvalidArgument, "CR or LF"},
		{"a secret sent nowhere", `"network":"none","secrets":[{"name":"TOK","value":"` + b64("s3cr3t-value") + `","hosts":[],"placeholder":"` + ph + `"}]`, capability.InvalidArgument, "hosts"},
		{"a secret named as the loader", `"network":"none","secrets":[{"name":"LD_PRELOAD","value":"` + b64("s3cr3t-value") + `","hosts":["api.example.com"],"placeholder":"` + ph + `"}]`, capability.InvalidArgument, "LD_PRELOAD"},
		{"a public port that is none", `"network":"none","public_previews":{"open":[70000]}`, capability.InvalidArgument, "not a TCP port"},
	} {
		body := `{"id":"` + id + `","name":"h","tenant":"",` + tc.settings + "}\n"
		_, _, _, err := to.Mover().Import(ctx, id, "", "h", strings.NewReader(body))
		if capabilityCode(err) != tc.code || err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %s %q", tc.name, err, tc.code, tc.want)
		}
		if err != nil && strings.Contains(err.Error(), "s3cr3t") {
			t.Errorf("%s: the error shows a secret's value: %v", tc.name, err)
		}
		if _, err := to.Sessions.ByIDAnyTenant(ctx, id); !errors.Is(err, session.ErrNotFound) {
			t.Fatalf("%s: the refused session is here: %v", tc.name, err)
		}
	}
	// Settings a create takes pass, in the form a create stores: a
	// legacy policy read as internet, its rules kept.
	body := `{"id":"` + id + `","name":"h","tenant":"","network":"full","network_rules":{"allow":["pypi.org"]},"env":{"K":"v"}}` + "\n"
	if _, _, _, err := to.Mover().Import(ctx, id, "", "h", io.MultiReader(strings.NewReader(body), emptyTar())); err != nil {
		t.Fatalf("good settings: %v", err)
	}
	s, err := to.Sessions.ByIDAnyTenant(ctx, id)
	if err != nil || s.Network != "internet" || s.NetRules == nil || !slices.Equal(s.NetRules.Allow, []string{"pypi.org"}) || s.Env["K"] != "v" {
		t.Fatalf("the adopted session: %+v %v", s, err)
	}
}

// b64 is s in standard base64 (a []byte in JSON).
func b64(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) }

// TestMoveCarriesSecretsAndPublicPreviews: a session's secrets (values,
// hosts and placeholders, which its files may hold) and its public
// preview ports move with it through the move stream: the receiver seals
// them with its own key, its egress has the value, its box the same
// placeholder, and the ports answer anyone there as they did; the
// sender keeps none of them; a move that fails leaves them as they were.
// A receiver whose operator serves no public previews makes the ports
// private (fail closed).
func TestMoveCarriesSecretsAndPublicPreviews(t *testing.T) {
	t.Parallel()
	open := func(public bool) *App {
		a, err := New(context.Background(), t.TempDir(), &Options{Python: testPython,
			Network: NetworkOptions{PreviewDomain: "http://preview.test", PreviewPublic: public}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { a.Close() })
		return a
	}
	from, to, private := open(true), open(true), open(false)
	ctx := context.Background()
	info := mustCall(t, from, "create_session", CreateSessionInput{Name: "keys", PublicPreviews: true,
		Secrets: []SecretInput{{Name: "API_TOKEN", Value: "s3cr3t-value", Hosts: []string{"api.example.com", "*.example.org"}}}}).(*SessionInfo)
	id := info.ID
	from.setPublic(id, 8081, false) // every port public but this one
	before := from.secrets.of(id)
	if len(before) != 1 {
		t.Fatalf("the session's secrets before the move: %+v", before)
	}
	move := func(to *App) {
		t.Helper()
		m := from.Mover()
		if err := m.Quiesce(ctx, id); err != nil {
			t.Fatal(err)
		}
		pr, pw := io.Pipe()
		go func() { pw.CloseWithError(m.Export(ctx, id, pw)) }()
		if _, _, _, err := to.Mover().Import(ctx, id, "", "keys", pr); err != nil {
			t.Fatalf("import: %v", err)
		}
	}
	// A move that fails (quiesced, then usable here again) keeps them.
	if err := from.Mover().Quiesce(ctx, id); err != nil {
		t.Fatal(err)
	}
	from.Mover().Unquiesce(id)
	if !from.isPublic(id, 3000) || from.isPublic(id, 8081) || len(from.secrets.of(id)) != 1 {
		t.Fatalf("after a move that failed: public 3000 %v 8081 %v, secrets %+v", from.isPublic(id, 3000), from.isPublic(id, 8081), from.secrets.of(id))
	}
	move(to)
	got := to.secrets.of(id)
	if len(got) != 1 || got[0].Name != "API_TOKEN" || got[0].Value != "s3cr3t-value" || got[0].Placeholder != before[0].Placeholder ||
		len(got[0].Hosts) != 2 || got[0].Hosts[0].String() != before[0].Hosts[0].String() || got[0].Hosts[1].String() != before[0].Hosts[1].String() {
		t.Fatalf("the secrets after the move: %+v, before %+v", got, before)
	}
	r, err := call(t, to, "terminal_exec", TerminalExecInput{Session: id, Command: `echo "$API_TOKEN"`})
	if err != nil || !strings.Contains(r.Text, before[0].Placeholder) || strings.Contains(r.Text, "s3cr3t") {
		t.Fatalf("the box's variable after the move: %v %q", err, r.Text)
	}
	if !to.isPublic(id, 3000) || to.isPublic(id, 8081) {
		t.Fatalf("public ports after the move: 3000 %v (want true), 8081 %v (want false)", to.isPublic(id, 3000), to.isPublic(id, 8081))
	}
	if err := from.Mover().Release(ctx, id); err != nil {
		t.Fatal(err)
	}
	if left, err := from.secrets.load(ctx, id); err != nil || len(left) != 0 || from.isPublic(id, 3000) {
		t.Fatalf("the sender after the release: secrets %+v %v, public %v", left, err, from.isPublic(id, 3000))
	}

	// On: from the receiver to one that serves no public previews.
	from, to = to, private
	move(to)
	if to.isPublic(id, 3000) {
		t.Fatal("a node that serves no public previews made a moved session's port public")
	}
	if got := to.secrets.of(id); len(got) != 1 || got[0].Value != "s3cr3t-value" {
		t.Fatalf("the secrets after the second move: %+v", got)
	}
}

// emptyTar is a tar archive of nothing.
func emptyTar() io.Reader {
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	_ = tw.Close()
	return &b
}

// TestImportIsAdmittedAgainstTheReceiversCeilings drains into a full
// server: a receiver at its server ceiling (and, another, at the tenant's
// ceiling) refuses the move with the ceiling named (resource_exhausted,
// 429), before it reads the workspace, and keeps nothing of it; the
// sender, unquiesced, keeps the session with its files. With room made,
// the same move is taken.
func TestImportIsAdmittedAgainstTheReceiversCeilings(t *testing.T) {
	t.Parallel()
	newFull := func(l Limits) *App {
		a, err := New(context.Background(), t.TempDir(), &Options{Python: testPython, Network: hostAllowed, Limits: l})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { a.Close() })
		return a
	}
	from := newApp(t, nil)
	ctx := context.Background()
	id := mustCall(t, from, "create_session", CreateSessionInput{Name: "mover"}).(*SessionInfo).ID
	if r, err := call(t, from, "terminal_exec", TerminalExecInput{Session: id, Command: "echo kept > f.txt"}); err != nil {
		t.Fatal(r, err)
	}
	m := from.Mover()
	move := func(to *App) error {
		t.Helper()
		if err := m.Quiesce(ctx, id); err != nil {
			t.Fatal(err)
		}
		pr, pw := io.Pipe()
		exported := make(chan struct{})
		go func() { pw.CloseWithError(m.Export(ctx, id, pw)); close(exported) }()
		_, _, _, err := to.Mover().Import(ctx, id, "", "mover", pr)
		pr.CloseWithError(errors.New("the receiver is done"))
		<-exported
		return err
	}
	for _, c := range []struct {
		name, scope string
		limits      Limits
	}{
		// Ceilings of 2: the receiver holds at least one session of its own.
		{"server", "the server (all tenants together) is at its session ceiling of 2", Limits{Sessions: 2}},
		{"tenant", "the tenant is at its session ceiling of 2", Limits{SessionsPerTenant: 2, Tenant: TenantLimits{Sessions: 2}}},
	} {
		t.Run(c.name, func(t *testing.T) {
			// Filled with sessions until a create is refused at the ceiling.
			to := newFull(c.limits)
			var held string
			for i := 0; ; i++ {
				r, err := call(t, to, "create_session", CreateSessionInput{Name: "held" + strconv.Itoa(i)})
				if errors.Is(err, session.ErrLimit) {
					break
				}
				if err != nil || i == 2 {
					t.Fatalf("filling the receiver: %v (%d made)", err, i)
				}
				held = r.Output.(*SessionInfo).ID
			}
			err := move(to)
			if !errors.Is(err, session.ErrLimit) || controller.Classify(err).Code != capability.ResourceExhausted || !strings.Contains(err.Error(), c.scope) {
				t.Fatalf("a move into a full receiver: %v", err)
			}
			if _, err := to.Sessions.ByIDAnyTenant(ctx, id); !errors.Is(err, session.ErrNotFound) {
				t.Fatalf("the refused move left its session at the receiver: %v", err)
			}
			m.Unquiesce(id)
			r, err := call(t, from, "terminal_exec", TerminalExecInput{Session: id, Command: "cat f.txt"})
			if err != nil || !strings.Contains(r.Text, "kept") {
				t.Fatalf("the sender's session after the refused move: %v %v", r, err)
			}
			// Room made: the move is taken.
			if held == "" {
				t.Fatal("the ceiling was met before a create: nothing to destroy")
			}
			if _, err := call(t, to, "destroy_session", SessionRef{Session: held}); err != nil {
				t.Fatal(err)
			}
			if err := move(to); err != nil {
				t.Fatalf("the move with room at the receiver: %v", err)
			}
			if _, err := to.Sessions.ByIDAnyTenant(ctx, id); err != nil {
				t.Fatalf("the moved session at the receiver: %v", err)
			}
			// Back to the sender's own state for the next case.
			if err := to.Mover().Release(ctx, id); err != nil {
				t.Fatal(err)
			}
			m.Unquiesce(id)
		})
	}
}
