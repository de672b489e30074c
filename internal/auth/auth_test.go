package auth

import (
	"context"
	"errors"
	"fmt"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/quro-dev/quro/internal/capability"
	"github.com/quro-dev/quro/internal/store"
)

func newTokens(t *testing.T) (*Tokens, *store.Store) {
	t.Helper()
	st, err := store.Open(context.Background(), filepath.Join(t.TempDir(), "quro.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return New(st), st
}

func wantUnauthenticated(t *testing.T, err error, msg string) {
	t.Helper()
	var ce *capability.Error
	if !errors.As(err, &ce) || ce.Code != capability.Unauthenticated || !strings.Contains(ce.Message, msg) {
		t.Fatalf("want unauthenticated %q, got %v", msg, err)
	}
}

func TestCreateVerifyRevoke(t *testing.T) {
	ctx := context.Background()
	tk, st := newTokens(t)
	iss, err := tk.Create(ctx, "acme", []string{"read", "exec"}, "ci")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(iss.Token, "quro_"+iss.ID+"_") || len(iss.Token) < 50 {
		t.Fatalf("token %q", iss.Token)
	}
	c, err := tk.Verify(ctx, iss.Token)
	if err != nil || c.Tenant != "acme" || c.Scope != capability.ScopeExec || c.TokenID != iss.ID {
		t.Fatalf("%+v %v", c, err)
	}
	// The database holds no secret: only the hash of the part after the id.
	row, _ := st.TokenByID(ctx, iss.ID)
	if strings.Contains(iss.Token, row.Hash) || strings.Contains(row.Hash, iss.Token[len("quro_"+iss.ID+"_"):]) {
		t.Fatal("the secret is stored")
	}
	// A changed secret, a wrong id, garbage, nothing.
	_, err = tk.Verify(ctx, iss.Token[:len(iss.Token)-1]+"x")
	wantUnauthenticated(t, err, "unknown token")
	_, err = tk.Verify(ctx, "quro_ffffffffffff_"+iss.Token[len("quro_"+iss.ID+"_"):])
	wantUnauthenticated(t, err, "unknown token")
	_, err = tk.Verify(ctx, "Bearer nonsense")
	wantUnauthenticated(t, err, "malformed")
	_, err = tk.Verify(ctx, "")
	wantUnauthenticated(t, err, "no token")

	if err := tk.Revoke(ctx, iss.ID); err != nil {
		t.Fatal(err)
	}
	_, err = tk.Verify(ctx, iss.Token)
	wantUnauthenticated(t, err, "revoked")
	if err := tk.Revoke(ctx, iss.ID); !errors.Is(err, ErrNotFound) {
		t.Fatalf("second revoke: %v", err)
	}
	list, _ := tk.List(ctx)
	if len(list) != 1 || list[0].RevokedAt.IsZero() || list[0].LastUsedAt.IsZero() {
		t.Fatalf("%+v", list)
	}
}

func TestRevokeByWholeToken(t *testing.T) {
	ctx := context.Background()
	tk, _ := newTokens(t)
	iss, _ := tk.Create(ctx, "", []string{"admin"}, "")
	if err := tk.Revoke(ctx, iss.Token); err != nil {
		t.Fatal(err)
	}
	_, err := tk.Verify(ctx, iss.Token)
	wantUnauthenticated(t, err, "revoked")
}

func TestScopes(t *testing.T) {
	for in, want := range map[string]capability.Scope{"read": "read", "read,exec": "exec", "exec": "exec", " admin , read": "admin",
		"read,exec,install": "exec,install", "install,exec": "exec,install", "install": "install", "install,admin": "admin"} {
		s, err := ParseScopes(in)
		if err != nil || Widest(s) != want {
			t.Errorf("%q: %v %v", in, Widest(s), err)
		}
	}
	for _, bad := range []string{"", ",", "root", "read,write"} {
		if _, err := ParseScopes(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
	tk, _ := newTokens(t)
	if _, err := tk.Create(context.Background(), "a b", []string{"read"}, ""); err == nil {
		t.Error("bad tenant name accepted")
	}
	if _, err := tk.Create(context.Background(), "a", []string{"sudo"}, ""); err == nil {
		t.Error("bad scope accepted")
	}
}

func TestEnsureAdminOnce(t *testing.T) {
	ctx := context.Background()
	tk, _ := newTokens(t)
	file := filepath.Join(t.TempDir(), "admin.token")
	tok, err := tk.EnsureAdmin(ctx, file)
	if err != nil || tok == "" {
		t.Fatalf("%q %v", tok, err)
	}
	fi, err := os.Stat(file)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("token file %v %v", fi.Mode(), err)
	}
	b, _ := os.ReadFile(file)
	if strings.TrimSpace(string(b)) != tok {
		t.Fatal("file does not hold the token")
	}
	c, err := tk.Verify(ctx, tok)
	if err != nil || c.Scope != capability.ScopeAdmin || c.Tenant != "" {
		t.Fatalf("%+v %v", c, err)
	}
	again, err := tk.EnsureAdmin(ctx, file)
	if err != nil || again != "" {
		t.Fatalf("second start made a token: %q %v", again, err)
	}
	// With every token revoked, the next start issues a new admin token.
	tk.Revoke(ctx, c.TokenID)
	if tok2, _ := tk.EnsureAdmin(ctx, file); tok2 == "" || tok2 == tok {
		t.Fatal("no new admin token after revocation")
	}
}

func TestHTTPReadsBearer(t *testing.T) {
	tk, _ := newTokens(t)
	iss, _ := tk.Create(context.Background(), "x", []string{"read"}, "")
	r := httptest.NewRequest("GET", "/", nil)
	r.Header.Set("Authorization", "bearer "+iss.Token)
	c, err := tk.HTTP()(r)
	if err != nil || c.Tenant != "x" || c.Scope != capability.ScopeRead {
		t.Fatalf("%+v %v", c, err)
	}
	r.Header.Set("Authorization", "Basic "+iss.Token)
	_, err = tk.HTTP()(r)
	wantUnauthenticated(t, err, "no token")
}

// TestRevokeByAnotherStoreRefusedAtOnce: the server's Tokens (warm, its
// token cached) and a second Store on the same file, as `quro token
// revoke` opens it: the request after the revoke is refused.
func TestRevokeByAnotherStoreRefusedAtOnce(t *testing.T) {
	ctx := context.Background()
	file := filepath.Join(t.TempDir(), "quro.db")
	st1, err := store.Open(ctx, file)
	if err != nil {
		t.Fatal(err)
	}
	defer st1.Close()
	server := New(st1)
	iss, err := server.Create(ctx, "acme", []string{"exec"}, "")
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if _, err := server.Verify(ctx, iss.Token); err != nil {
			t.Fatal(err)
		}
	}
	st2, err := store.Open(ctx, file)
	if err != nil {
		t.Fatal(err)
	}
	defer st2.Close()
	if err := New(st2).Revoke(ctx, iss.ID); err != nil {
		t.Fatal(err)
	}
	_, err = server.Verify(ctx, iss.Token)
	wantUnauthenticated(t, err, "was revoked")
}

// TestRevokeByAnotherProcessRefusedAtOnce: the same with a real second
// process (this test binary re-executed) revoking through Tokens.Revoke.
func TestRevokeByAnotherProcessRefusedAtOnce(t *testing.T) {
	ctx := context.Background()
	file := filepath.Join(t.TempDir(), "quro.db")
	st, err := store.Open(ctx, file)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	server := New(st)
	iss, err := server.Create(ctx, "acme", []string{"exec"}, "")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := server.Verify(ctx, iss.Token); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "QURO_AUTH_TEST_REVOKE="+file, "QURO_AUTH_TEST_REVOKE_ID="+iss.ID)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("revoking process: %v: %s", err, out)
	}
	_, err = server.Verify(ctx, iss.Token)
	wantUnauthenticated(t, err, "was revoked")
}

func TestMain(m *testing.M) {
	if file := os.Getenv("QURO_AUTH_TEST_REVOKE"); file != "" {
		st, err := store.Open(context.Background(), file)
		if err == nil {
			err = New(st).Revoke(context.Background(), os.Getenv("QURO_AUTH_TEST_REVOKE_ID"))
			st.Close()
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "revoking process:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// TestListWhileUsesAreRecorded: lists wait for the last-use writes under
// way while requests start new ones. (With a WaitGroup, an Add from zero
// during a Wait panicked and took the server down.)
func TestListWhileUsesAreRecorded(t *testing.T) {
	ctx := context.Background()
	tk, _ := newTokens(t)
	var secrets []string
	for i := range 400 {
		iss, err := tk.Create(ctx, "acme", []string{"read"}, fmt.Sprint(i))
		if err != nil {
			t.Fatal(err)
		}
		secrets = append(secrets, iss.Token)
	}
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			for i := w; i < len(secrets); i += 4 { // each token's first use starts a write
				if _, err := tk.Verify(ctx, secrets[i]); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	stop := make(chan struct{})
	var lists sync.WaitGroup
	for range 4 {
		lists.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				if _, err := tk.List(ctx); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	close(stop)
	lists.Wait()
	list, err := tk.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, in := range list {
		if in.LastUsedAt.IsZero() {
			t.Fatalf("token %s used before the list, listed as never used", in.ID)
		}
	}
}

// TestImport: a token made on one node works on another that imports it;
// a taken ID with another secret or tenant, and malformed tokens, are
// refused and change nothing.
func TestImport(t *testing.T) {
	ctx := context.Background()
	made, _ := newTokens(t)
	iss, err := made.Create(ctx, "acme", []string{"exec"}, "ci")
	if err != nil {
		t.Fatal(err)
	}
	other, _ := newTokens(t)
	if err := other.Import(ctx, iss.Token, "acme", []string{"exec"}, "imported"); err != nil {
		t.Fatal(err)
	}
	if err := other.Import(ctx, iss.Token, "acme", []string{"exec"}, "again"); err != nil {
		t.Fatalf("the same token again: %v", err)
	}
	c, err := other.Verify(ctx, iss.Token)
	if err != nil || c.Tenant != "acme" || c.Scope != capability.ScopeExec {
		t.Fatalf("%+v %v", c, err)
	}
	// The same ID with another secret: refused, and the first still holds.
	forged := iss.Token[:len(iss.Token)-4] + "AAAA"
	if err := other.Import(ctx, forged, "acme", []string{"exec"}, ""); err == nil {
		t.Fatal("a second secret for a taken ID was imported")
	}
	if err := other.Import(ctx, iss.Token, "evil", []string{"admin"}, ""); err == nil {
		t.Fatal("a taken token was imported again for another tenant and scope")
	}
	if _, err := other.Verify(ctx, forged); err == nil {
		t.Fatal("the forged secret verifies")
	}
	for _, bad := range []string{"", "quro_x_y", "quro_0123456789ab_short", "nope_0123456789ab_" + strings.Repeat("a", 43)} {
		if err := other.Import(ctx, bad, "acme", []string{"exec"}, ""); err == nil {
			t.Fatalf("malformed %q imported", bad)
		}
	}
	if err := other.Import(ctx, "quro_0123456789ab_"+strings.Repeat("a", 43), "acme", []string{"root"}, ""); err == nil {
		t.Fatal("an unknown scope imported")
	}
}
