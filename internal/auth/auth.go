// Package auth issues and checks Quro's bearer tokens. A token names its
// tenant and scopes; only a SHA-256 of its secret part is stored, so the
// database alone cannot be used to call the service.
//
// A token reads quro_<id>_<secret>: the id is public (lists, the audit log,
// revocation) and the secret is 256 random bits, which is why one round of
// SHA-256 is enough to store it (no password-style stretching is needed for
// a secret nobody chose).
package auth

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/quro-dev/quro/internal/api/httpauth"
	"github.com/quro-dev/quro/internal/capability"
	"github.com/quro-dev/quro/internal/controller"
	"github.com/quro-dev/quro/internal/session"
	"github.com/quro-dev/quro/internal/store"
)

// Scopes are the scopes a token may hold, narrowest first (install is
// beside exec: neither covers the other; admin covers both).
var Scopes = []capability.Scope{capability.ScopeRead, capability.ScopeExec, capability.ScopeInstall, capability.ScopeAdmin}

// ErrNotFound means no live token has that id.
var ErrNotFound = errors.New("no such live token")

const prefix = "quro_"

// Tokens issues, lists, revokes and verifies tokens. Safe for concurrent
// use.
type Tokens struct {
	st *store.Store

	mu       sync.Mutex
	touched  map[string]time.Time // last recorded use, to write at most once a minute
	touching int                  // last-use writes under way
	idle     *sync.Cond           // on mu: signalled when touching falls to 0
}

// New returns the tokens kept in st.
func New(st *store.Store) *Tokens {
	t := &Tokens{st: st, touched: map[string]time.Time{}}
	t.idle = sync.NewCond(&t.mu)
	return t
}

// Info describes a token without its secret.
type Info struct {
	ID         string    `json:"id"`
	Tenant     string    `json:"tenant"`
	Scopes     []string  `json:"scopes"`
	Label      string    `json:"label,omitempty"`
	Tools      string    `json:"tools,omitempty" jsonschema:"the MCP tool profile its clients are listed when they name none; empty: the server's default"`
	CreatedAt  time.Time `json:"created_at"`
	LastUsedAt time.Time `json:"last_used_at,omitzero"`
	RevokedAt  time.Time `json:"revoked_at,omitzero"`
}

// Issued is a new token: Token is shown once and never stored.
type Issued struct {
	Info
	Token string `json:"token"`
	// E2BKey is the same token in the form E2B's SDKs accept as an API
	// key (E2BForm).
	E2BKey string `json:"e2b_key,omitempty"`
}

// ParseScopes parses "read,exec" into scopes, refusing unknown names.
func ParseScopes(list string) ([]string, error) {
	var out []string
	for _, f := range strings.Split(list, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		if !slices.Contains(Scopes, capability.Scope(f)) {
			return nil, fmt.Errorf("unknown scope %q: use read, exec, install or admin", f)
		}
		if !slices.Contains(out, f) {
			out = append(out, f)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no scope given: use read, exec, install or admin (comma-separated)")
	}
	return out, nil
}

// Widest returns what scopes amount to: admin when held (it covers all);
// else exec and install, each when held, as a set ("exec,install"); else
// read. exec and install each cover read.
func Widest(scopes []string) capability.Scope {
	if slices.Contains(scopes, string(capability.ScopeAdmin)) {
		return capability.ScopeAdmin
	}
	var set []string
	for _, s := range []capability.Scope{capability.ScopeExec, capability.ScopeInstall} {
		if slices.Contains(scopes, string(s)) {
			set = append(set, string(s))
		}
	}
	if len(set) == 0 && slices.Contains(scopes, string(capability.ScopeRead)) {
		return capability.ScopeRead
	}
	return capability.Scope(strings.Join(set, ","))
}

// Create issues a token for tenant with scopes.
func (t *Tokens) Create(ctx context.Context, tenant string, scopes []string, label string) (*Issued, error) {
	return t.CreateWithTools(ctx, tenant, scopes, label, "")
}

// CreateWithTools issues a token for tenant with scopes whose MCP clients
// are listed the tool profile tools when they name none ("": the
// server's default). The caller checks that the profile exists.
func (t *Tokens) CreateWithTools(ctx context.Context, tenant string, scopes []string, label, tools string) (*Issued, error) {
	if !session.ValidTenant(tenant) {
		return nil, fmt.Errorf("bad tenant name %q: use 1-64 letters, digits, '.', '_' or '-'", tenant)
	}
	if _, err := ParseScopes(strings.Join(scopes, ",")); err != nil {
		return nil, err
	}
	var idb [6]byte
	var secret [32]byte
	if _, err := rand.Read(idb[:]); err != nil {
		return nil, err
	}
	if _, err := rand.Read(secret[:]); err != nil {
		return nil, err
	}
	sec := base64.RawURLEncoding.EncodeToString(secret[:])
	row := &store.Token{ID: hex.EncodeToString(idb[:]), Hash: hash(sec), Tenant: tenant, Scopes: scopes,
		Label: label, Tools: tools, CreatedAt: time.Now()}
	if err := t.st.CreateToken(ctx, row); err != nil {
		return nil, err
	}
	tok := prefix + row.ID + "_" + sec
	e2b, err := E2BForm(tok)
	if err != nil {
		return nil, err
	}
	return &Issued{Info: info(row), Token: tok, E2BKey: e2b}, nil
}

// List returns every token, revoked ones included, without secrets.
func (t *Tokens) List(ctx context.Context) ([]Info, error) {
	// A use recorded before the list shows in it. (A counter under mu, not
	// a WaitGroup: requests start writes while a list waits, and a
	// WaitGroup's Add from zero during a Wait panics.)
	t.mu.Lock()
	for t.touching > 0 {
		t.idle.Wait()
	}
	t.mu.Unlock()
	rows, err := t.st.Tokens(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]Info, len(rows))
	for i, r := range rows {
		out[i] = info(r)
	}
	return out, nil
}

// Revoke revokes the live token id; it stops working at once.
func (t *Tokens) Revoke(ctx context.Context, id string) error {
	// A whole token given by mistake still names its id.
	bare := TokenID(id)
	err := t.st.RevokeToken(ctx, bare, time.Now())
	if errors.Is(err, store.ErrNotFound) {
		return fmt.Errorf("%w: %q (quro token list shows them)", ErrNotFound, id)
	}
	return err
}

// Verify checks token and returns its caller (Path left for the access
// path to set). Failures are *capability.Error coded Unauthenticated.
func (t *Tokens) Verify(ctx context.Context, token string) (controller.Caller, error) {
	if token == "" {
		return controller.Caller{}, capability.Errorf(capability.Unauthenticated,
			"no token: send Authorization: Bearer <token> (the admin token is in the data directory's admin.token; quro token create makes more)")
	}
	if strings.HasPrefix(token, e2bPrefix) {
		q, err := fromE2B(token)
		if err != nil {
			return controller.Caller{}, capability.Errorf(capability.Unauthenticated, "%v", err)
		}
		token = q
	}
	id, sec, ok := strings.Cut(strings.TrimPrefix(token, prefix), "_")
	if !strings.HasPrefix(token, prefix) || !ok || id == "" || sec == "" {
		return controller.Caller{}, capability.Errorf(capability.Unauthenticated, "malformed token: Quro tokens look like quro_<id>_<secret>")
	}
	// From the store's cache on a warm server: no SQLite, and a revoke
	// by any process sharing the data directory is seen by the next call.
	row, err := t.st.TokenByID(ctx, id)
	if errors.Is(err, store.ErrNotFound) {
		return controller.Caller{}, capability.Errorf(capability.Unauthenticated, "unknown token")
	}
	if err != nil {
		return controller.Caller{}, err
	}
	if subtle.ConstantTimeCompare([]byte(row.Hash), []byte(hash(sec))) != 1 {
		return controller.Caller{}, capability.Errorf(capability.Unauthenticated, "unknown token")
	}
	if !row.RevokedAt.IsZero() {
		return controller.Caller{}, capability.Errorf(capability.Unauthenticated, "token %s was revoked at %s", row.ID, row.RevokedAt.UTC().Format(time.RFC3339))
	}
	t.touch(ctx, row.ID)
	return controller.Caller{Tenant: row.Tenant, Scope: Widest(row.Scopes), TokenID: row.ID, Tools: row.Tools}, nil
}

// Live returns the caller of the token with id while it is live, for a
// credential derived from the token rather than holding its secret (E2B's
// sandbox access tokens): an unknown or revoked id is an Unauthenticated
// error. From the store's cache on a warm server, as Verify: a revoke by
// any process sharing the data directory is seen by the next call.
func (t *Tokens) Live(ctx context.Context, id string) (controller.Caller, error) {
	row, err := t.st.TokenByID(ctx, id)
	if errors.Is(err, store.ErrNotFound) {
		return controller.Caller{}, capability.Errorf(capability.Unauthenticated, "unknown token")
	}
	if err != nil {
		return controller.Caller{}, err
	}
	if !row.RevokedAt.IsZero() {
		return controller.Caller{}, capability.Errorf(capability.Unauthenticated, "token %s was revoked at %s", row.ID, row.RevokedAt.UTC().Format(time.RFC3339))
	}
	return controller.Caller{Tenant: row.Tenant, Scope: Widest(row.Scopes), TokenID: row.ID, Tools: row.Tools}, nil
}

// LiveIDs are the ids of tenant's live tokens whose scopes cover scope
// (one query of the store).
func (t *Tokens) LiveIDs(ctx context.Context, tenant string, scope capability.Scope) ([]string, error) {
	rows, err := t.st.Tokens(ctx)
	if err != nil {
		return nil, err
	}
	var ids []string
	for _, r := range rows {
		if r.Tenant == tenant && r.RevokedAt.IsZero() && Widest(r.Scopes).Covers(scope) {
			ids = append(ids, r.ID)
		}
	}
	return ids, nil
}

// HTTP returns the httpauth.Func that verifies a request's bearer token.
func (t *Tokens) HTTP() httpauth.Func {
	return func(r *http.Request) (controller.Caller, error) {
		return t.Verify(r.Context(), httpauth.Bearer(r))
	}
}

// EnsureAdmin makes sure someone can administer the service: when no live
// token exists it issues an admin token for the local tenant and writes it
// to file (mode 0600). It returns the new token, or "" when tokens exist.
func (t *Tokens) EnsureAdmin(ctx context.Context, file string) (string, error) {
	n, err := t.st.CountLiveTokens(ctx)
	if err != nil || n > 0 {
		return "", err
	}
	iss, err := t.Create(ctx, "", []string{"admin"}, "first admin token")
	if err != nil {
		return "", err
	}
	if err := writeSecret(file, iss.Token+"\n"); err != nil {
		// A token whose secret no one holds must not stay valid.
		if rerr := t.Revoke(ctx, iss.ID); rerr != nil {
			err = errors.Join(err, fmt.Errorf("revoking the unsaved token %s: %w", iss.ID, rerr))
		}
		return "", err
	}
	return iss.Token, nil
}

func writeSecret(file, content string) error {
	tmp, err := os.CreateTemp(filepath.Dir(file), ".token-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if err := tmp.Chmod(0o600); err != nil {
		tmp.Close()
		return err
	}
	if _, err := tmp.WriteString(content); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), file)
}

func (t *Tokens) touch(ctx context.Context, id string) {
	now := time.Now()
	t.mu.Lock()
	last := t.touched[id]
	fresh := now.Sub(last) < time.Minute
	if !fresh {
		t.touched[id] = now
		t.touching++
	}
	t.mu.Unlock()
	if !fresh {
		// Off the request path: last-used is a hint, at most one write a
		// minute per token, and the call it times goes on without it.
		go func() {
			_ = t.st.TouchToken(context.WithoutCancel(ctx), id, now)
			t.mu.Lock()
			if t.touching--; t.touching == 0 {
				t.idle.Broadcast()
			}
			t.mu.Unlock()
		}()
	}
}

func hash(secret string) string {
	h := sha256.Sum256([]byte(secret))
	return hex.EncodeToString(h[:])
}

func info(r *store.Token) Info {
	return Info{ID: r.ID, Tenant: r.Tenant, Scopes: r.Scopes, Label: r.Label, Tools: r.Tools,
		CreatedAt: r.CreatedAt, LastUsedAt: r.LastUsedAt, RevokedAt: r.RevokedAt}
}

// Import adds a token whose secret was made elsewhere (the cluster's
// tokens file, which every node of a Quro cluster reads from one
// Kubernetes Secret, so that a token works on every node). Only its hash
// is kept, as for a token Create made. A token already present with the
// same secret, tenant and scopes is left as it is; one whose ID is taken
// by another secret or tenant is refused.
func (t *Tokens) Import(ctx context.Context, token, tenant string, scopes []string, label string) error {
	id, sec, ok := strings.Cut(strings.TrimPrefix(token, prefix), "_")
	if !strings.HasPrefix(token, prefix) || !ok || len(id) != 12 || !isLowerHex(id) || len(sec) < 32 {
		return errors.New("malformed token: Quro tokens look like quro_<12 hex digits>_<secret of 32 or more characters>")
	}
	if !session.ValidTenant(tenant) {
		return fmt.Errorf("bad tenant name %q: use 1-64 letters, digits, '.', '_' or '-'", tenant)
	}
	if _, err := ParseScopes(strings.Join(scopes, ",")); err != nil {
		return err
	}
	row, err := t.st.TokenByID(ctx, id)
	switch {
	case err == nil:
		if subtle.ConstantTimeCompare([]byte(row.Hash), []byte(hash(sec))) != 1 || row.Tenant != tenant ||
			strings.Join(row.Scopes, ",") != strings.Join(scopes, ",") {
			return fmt.Errorf("token %s exists already with another secret, tenant or scopes", id)
		}
		return nil
	case !errors.Is(err, store.ErrNotFound):
		return err
	}
	return t.st.CreateToken(ctx, &store.Token{ID: id, Hash: hash(sec), Tenant: tenant, Scopes: scopes,
		Label: label, CreatedAt: time.Now()})
}
