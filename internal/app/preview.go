package app

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/quro-dev/quro/internal/capability"
	"github.com/quro-dev/quro/internal/controller"
	"github.com/quro-dev/quro/internal/sandbox"
)

// Preview URLs: a port a session's code listens on (on the box's own
// 127.0.0.1), reached from outside through the server's proxy at
// /v1/sessions/{id}/ports/{port}/ (internal/api/rest/preview.go). A
// request there carries a bearer token of the session's tenant, or a
// signed URL get_preview_url handed out: an HMAC-SHA256, under a secret
// of the server's kept in the data directory (PreviewKeyFile, 0600), of
// the session, the port, the expiry and the id of the token that asked.
// The URL holds neither the secret nor a token; it is good until its
// expiry, while the session exists and while that token is live
// (revoking the token revokes its URLs).

// PreviewKeyFile is the preview URLs' secret, in the data directory.
const PreviewKeyFile = "preview.key"

// PreviewParam is the signed URL's query parameter (and its cookie's
// name).
const PreviewParam = "quro_preview"

const (
	previewDefault = time.Hour
	previewMax     = 7 * 24 * time.Hour
)

// PreviewURLInput is get_preview_url's input.
type PreviewURLInput struct {
	Session  string `json:"session,omitempty" jsonschema:"session id or name; the default session when omitted"`
	Port     int    `json:"port" jsonschema:"the TCP port the session's code listens on, on 127.0.0.1 in its box"`
	ExpiresS int    `json:"expires_s,omitempty" jsonschema:"seconds the signed URL is good for (default 3600, at most 604800)"`
	// Public, when given, makes the port public (reached on its host
	// form with no token) or private again.
	Public *bool `json:"public,omitempty" jsonschema:"true: anyone may open the port's host_url with no token or signature, until public false or the session's end (the operator must allow it: quro serve --preview-public, with --preview-domain); false: the port needs a token or a signature again; omitted: unchanged"`
}

// PreviewURL is get_preview_url's output.
type PreviewURL struct {
	Session   string    `json:"session"`
	Port      int       `json:"port"`
	Path      string    `json:"path" jsonschema:"the proxy's path on this server: send your bearer token with it"`
	SignedURL string    `json:"signed_url" jsonschema:"the path with a signature: opens in a browser without a token, until expires_at, while your token is live"`
	ExpiresAt time.Time `json:"expires_at"`
	// The host form, with a preview domain configured: the port's own
	// origin (PORT-ID.DOMAIN), the page's paths as the box serves them.
	HostURL       string `json:"host_url,omitempty" jsonschema:"with the server's preview domain: the port's own origin (PORT-ID.DOMAIN); send your bearer token with it"`
	SignedHostURL string `json:"signed_host_url,omitempty" jsonschema:"host_url with the same signature: opens in a browser, on an origin of its own (prefer it to signed_url)"`
	// Public says whether anyone reaches host_url with no credential.
	Public bool `json:"public" jsonschema:"whether host_url answers anyone, with no token or signature"`
}

// Text gives every form.
func (p *PreviewURL) Text() string {
	t := fmt.Sprintf("%s (with your bearer token)\n%s (signed; good until %s while the token that asked is live)",
		p.Path, p.SignedURL, p.ExpiresAt.UTC().Format(time.RFC3339))
	if p.HostURL != "" {
		t += fmt.Sprintf("\n%s (its own origin, with your bearer token)\n%s (its own origin, signed)", p.HostURL, p.SignedHostURL)
	}
	if p.Public {
		t += fmt.Sprintf("\nport %d is public: %s answers anyone, with no token (public false makes it private again)", p.Port, p.HostURL)
	}
	return t
}

// previewKey is the preview URLs' secret, read (or made) the first time.
type previewKey struct {
	mu  sync.Mutex
	key []byte
}

func (a *App) previewSecret() ([]byte, error) {
	a.preview.mu.Lock()
	defer a.preview.mu.Unlock()
	if a.preview.key == nil {
		k, err := KeyFile(filepath.Join(a.DataDir, PreviewKeyFile), "the preview URLs signed with it die")
		if err != nil {
			return nil, fmt.Errorf("preview URLs' secret: %w", err)
		}
		a.preview.key = k
	}
	return a.preview.key, nil
}

// publicPorts are the ports anyone may reach on their host form with no
// credential, per session: what get_preview_url's public and
// create_session's public_previews (E2B's allowPublicTraffic) asked for.
// They are kept in memory alone: a restart makes every port private again
// (fail closed; the creator asks again), and a session's entry goes with
// the session (Life.OnEnd, registered when the entry is made).
type publicPorts struct {
	mu   sync.Mutex
	byID map[string]*publicSet
}

type publicSet struct {
	all    bool         // every port (E2B's allowPublicTraffic)
	open   map[int]bool // ports made public one by one
	closed map[int]bool // ports made private again while all
}

func (p *publicSet) has(port int) bool { return p.open[port] || p.all && !p.closed[port] }

// setPublic makes port of session id public or private; port 0 means
// every port (and forgets the one-by-one choices).
func (a *App) setPublic(id string, port int, public bool) {
	a.public.mu.Lock()
	ps := a.public.byID[id]
	fresh := ps == nil
	if fresh {
		if !public {
			a.public.mu.Unlock()
			return
		}
		ps = &publicSet{open: map[int]bool{}, closed: map[int]bool{}}
		if a.public.byID == nil {
			a.public.byID = map[string]*publicSet{}
		}
		a.public.byID[id] = ps
	}
	switch {
	case port == 0:
		ps.all = public
		clear(ps.open)
		clear(ps.closed)
	case public:
		ps.open[port] = true
		delete(ps.closed, port)
	default:
		delete(ps.open, port)
		if ps.all {
			ps.closed[port] = true
		}
	}
	a.public.mu.Unlock()
	if fresh {
		// A session already ended runs this at once: nothing is left.
		a.lives.OnEnd(id, func() {
			a.public.mu.Lock()
			defer a.public.mu.Unlock()
			if a.public.byID[id] == ps {
				delete(a.public.byID, id)
			}
		})
	}
}

// publicOf is session id's public ports as a move carries them (nil:
// none).
func (a *App) publicOf(id string) *movedPublic {
	a.public.mu.Lock()
	defer a.public.mu.Unlock()
	ps := a.public.byID[id]
	if ps == nil || !ps.all && len(ps.open) == 0 {
		return nil
	}
	p := &movedPublic{All: ps.all}
	for port := range ps.open {
		p.Open = append(p.Open, port)
	}
	for port := range ps.closed {
		p.Closed = append(p.Closed, port)
	}
	slices.Sort(p.Open)
	slices.Sort(p.Closed)
	return p
}

// isPublic reports whether port of session id is public.
func (a *App) isPublic(id string, port int) bool {
	a.public.mu.Lock()
	defer a.public.mu.Unlock()
	ps := a.public.byID[id]
	return ps != nil && ps.has(port)
}

// checkPublic refuses to make a port public unless the operator allows
// public previews (quro serve --preview-public) and the caller is no
// session's code.
func (a *App) checkPublic(ctx context.Context) error {
	if c, ok := controller.CallerFrom(ctx); ok && c.Session != "" {
		return capability.Errorf(capability.PermissionDenied, "code in a session cannot make its ports public: the session's creator can, with its token")
	}
	if !a.network.PreviewPublic {
		return capability.Errorf(capability.PermissionDenied,
			"this server serves no public previews: its operator allows them with quro serve --preview-public (and --preview-domain); send a token or a signed URL instead")
	}
	return nil
}

// KeyFile reads the secret key in file (32 bytes or more), making it (32
// random bytes, mode 0600) first if there is none; dies says what dies
// with the key, for the error about a damaged one.
func KeyFile(file, dies string) ([]byte, error) {
	b, err := os.ReadFile(file)
	if err == nil {
		if len(b) < 32 {
			return nil, fmt.Errorf("%s: %d bytes, want 32 or more (remove it to make a new one; %s)", file, len(b), dies)
		}
		return b, nil
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	b = make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return nil, err
	}
	// Written beside it, then linked into place: a process that reads the
	// file never sees it half written, and of two first uses one link
	// wins and the other reads the winner's.
	tmp, err := os.CreateTemp(filepath.Dir(file), "."+filepath.Base(file)+".*")
	if err != nil {
		return nil, err
	}
	defer os.Remove(tmp.Name())
	if err := tmp.Chmod(0o600); err != nil {
		tmp.Close()
		return nil, err
	}
	if _, err := tmp.Write(b); err != nil {
		tmp.Close()
		return nil, err
	}
	if err := tmp.Close(); err != nil {
		return nil, err
	}
	if err := os.Link(tmp.Name(), file); errors.Is(err, fs.ErrExist) {
		return KeyFile(file, dies)
	} else if err != nil {
		return nil, err
	}
	return b, nil
}

// previewPort refuses what no preview may reach.
func previewPort(port int) error {
	if port < 1 || port > 65535 {
		return capability.Errorf(capability.InvalidArgument, "port %d: want 1 to 65535", port)
	}
	if port == sandbox.EgressPort || port == sandbox.DNSPort {
		return capability.Errorf(capability.InvalidArgument, "port %d is the server's own in the box (egress, DNS)", port)
	}
	return nil
}

// PreviewPath is the proxy's path of session id's port.
func PreviewPath(id string, port int) string {
	return "/v1/sessions/" + id + "/ports/" + strconv.Itoa(port) + "/"
}

// PreviewHostName is the host form's name of session id's port under
// host (a preview domain, its port kept): PORT-ID.DOMAIN.
func PreviewHostName(host, id string, port int) string {
	return strconv.Itoa(port) + "-" + id + "." + host
}

// previewMAC is the signature's MAC over the session, the port, the
// expiry and the token id.
func previewMAC(key []byte, id string, port int, exp int64, tokenID string) []byte {
	m := hmac.New(sha256.New, key)
	fmt.Fprintf(m, "quro-preview\x00%s\x00%d\x00%d\x00%s", id, port, exp, tokenID)
	return m.Sum(nil)
}

// signPreview is the signature of session id's port until exp for the
// token tokenID: EXPIRY.TOKENID.MAC.
func (a *App) signPreview(id string, port int, exp time.Time, tokenID string) (string, error) {
	key, err := a.previewSecret()
	if err != nil {
		return "", err
	}
	u := exp.Unix()
	return strconv.FormatInt(u, 10) + "." + tokenID + "." +
		base64.RawURLEncoding.EncodeToString(previewMAC(key, id, port, u, tokenID)), nil
}

func (a *App) registerPreview(reg *capability.Registry) {
	reg.Register(capability.New("get_preview_url",
		"The URL of a port a session's code listens on (127.0.0.1 in its box), reached through this server: path (send your bearer token) "+
			"and signed_url (opens in a browser, until expires_at and while your token is live; revoke the token to revoke it); "+
			"with the server's preview domain also host_url and signed_host_url, the same on an origin of the port's own (PORT-ID.DOMAIN). "+
			"public true makes the port's host_url answer anyone with no token, until public false or the session's end (if the operator allows it); "+
			"code in a session cannot make a port public. Not for a session with network host.",
		capability.ScopeExec, a.getPreviewURL).InSession(capability.UseRead))
}

func (a *App) getPreviewURL(ctx context.Context, in PreviewURLInput) (*PreviewURL, error) {
	s, err := entered(ctx)
	if err != nil {
		return nil, err
	}
	c, _ := controller.CallerFrom(ctx)
	if c.Session != "" && c.Session != s.ID {
		return nil, capability.Errorf(capability.PermissionDenied, "code in a session may ask for its own session's preview URLs only")
	}
	if err := previewPort(in.Port); err != nil {
		return nil, err
	}
	if s.Network == sandbox.NetworkHost {
		return nil, capability.Errorf(capability.InvalidArgument,
			"session %s has network host: its ports are the host's, which the server does not proxy (use none or internet)", s.Name)
	}
	d := previewDefault
	if in.ExpiresS < 0 || time.Duration(in.ExpiresS)*time.Second > previewMax {
		return nil, capability.Errorf(capability.InvalidArgument, "expires_s must be between 1 and %d", int(previewMax/time.Second))
	}
	if in.ExpiresS > 0 {
		d = time.Duration(in.ExpiresS) * time.Second
	}
	exp := time.Now().Add(d).Truncate(time.Second)
	sig, err := a.signPreview(s.ID, in.Port, exp, c.TokenID)
	if err != nil {
		return nil, err
	}
	path := PreviewPath(s.ID, in.Port)
	out := &PreviewURL{Session: s.ID, Port: in.Port, Path: path, SignedURL: path + "?" + PreviewParam + "=" + sig, ExpiresAt: exp}
	scheme, host, _ := ParsePreviewDomain(a.network.PreviewDomain)
	if host != "" {
		out.HostURL = scheme + "://" + PreviewHostName(host, s.ID, in.Port) + "/"
		out.SignedHostURL = out.HostURL + "?" + PreviewParam + "=" + sig
	}
	if in.Public != nil {
		if *in.Public {
			if err := a.checkPublic(ctx); err != nil {
				return nil, err
			}
			// A public page never runs on the server's own origin,
			// where its scripts could call the API with the browser's
			// credentials: the host form alone serves it.
			if host == "" {
				return nil, capability.Errorf(capability.PermissionDenied,
					"a public preview is served on its own host name only, never on this server's path form: the operator sets quro serve --preview-domain")
			}
		}
		a.setPublic(s.ID, in.Port, *in.Public)
	}
	out.Public = host != "" && a.isPublic(s.ID, in.Port)
	return out, nil
}

// PreviewByCaller lets c, authenticated by its token, reach session id's
// port: a token of the session's tenant (read scope or wider) outside any
// other session. Another tenant's session is not found.
func (a *App) PreviewByCaller(ctx context.Context, c controller.Caller, id string, port int) error {
	if err := previewPort(port); err != nil {
		return err
	}
	s, err := a.Sessions.ByIDAnyTenant(ctx, id)
	if err != nil || s.Tenant != c.Tenant || c.Session != "" && c.Session != s.ID {
		return capability.Errorf(capability.NotFound, "no session %s", id)
	}
	if !c.Scope.Covers(capability.ScopeRead) {
		return capability.Errorf(capability.PermissionDenied, "a preview needs scope read or exec")
	}
	return nil
}

// PreviewPublic reports whether session id's port answers anyone on its
// host form: its creator made it public (get_preview_url's public,
// create_session's public_previews) and the operator allows public
// previews. The path form never asks.
func (a *App) PreviewPublic(_ context.Context, id string, port int) bool {
	return a.network.PreviewPublic && previewPort(port) == nil && a.isPublic(id, port)
}

// PreviewBySignature checks sig, a signed URL's signature, for session
// id's port: unexpired, the MAC right, the session there and the token
// that asked live and its tenant's. Any failure is Unauthenticated.
func (a *App) PreviewBySignature(ctx context.Context, id string, port int, sig string) error {
	bad := func(why string) error {
		return capability.Errorf(capability.Unauthenticated, "preview signature: %s", why)
	}
	parts := strings.Split(sig, ".")
	if len(parts) != 3 {
		return bad("malformed")
	}
	exp, err := strconv.ParseInt(parts[0], 10, 64)
	if err != nil {
		return bad("malformed")
	}
	mac, err := base64.RawURLEncoding.DecodeString(parts[2])
	if err != nil {
		return bad("malformed")
	}
	key, err := a.previewSecret()
	if err != nil {
		return err
	}
	if !hmac.Equal(mac, previewMAC(key, id, port, exp, parts[1])) {
		return bad("not this server's for this session and port")
	}
	if time.Now().Unix() >= exp {
		return bad("expired at " + time.Unix(exp, 0).UTC().Format(time.RFC3339))
	}
	s, err := a.Sessions.ByIDAnyTenant(ctx, id)
	if err != nil {
		return bad("no session " + id)
	}
	if parts[1] != "" {
		c, err := a.tokens.Live(ctx, parts[1])
		if err != nil || c.Tenant != s.Tenant {
			return bad("the token that asked for it is no longer live")
		}
	}
	return nil
}

// DialPreview connects to port on 127.0.0.1 in session id's box.
func (a *App) DialPreview(ctx context.Context, id string, port int) (net.Conn, error) {
	// A paused session's box answers nothing, and a request to its port
	// is a use of the session: as any use, it resumes it (E2B's sandboxes
	// resume on an HTTP request to their ports likewise). The caller was
	// admitted to the port already (a token, a signature, or a public
	// port).
	if s, err := a.Sessions.ByIDAnyTenant(ctx, id); err == nil && s.Paused {
		if _, err := a.lives.Resume(ctx, s); err != nil {
			return nil, fmt.Errorf("session %s is paused and could not be resumed for its port %d: %w", id, port, err)
		}
	}
	return a.Sandbox.DialBox(ctx, id, port)
}
