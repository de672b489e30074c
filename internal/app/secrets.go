package app

import (
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/quro-dev/quro/internal/capability"
	"github.com/quro-dev/quro/internal/controller"
	"github.com/quro-dev/quro/internal/egress"
	"github.com/quro-dev/quro/internal/sandbox"
	"github.com/quro-dev/quro/internal/store"
)

// Bounds of a session's secrets.
const (
	MaxSecretsPerSession = 32
	MaxSecretHosts       = 16
	MaxSecretValue       = 16 << 10
)

// CABundleInBox is where a box with secrets finds the trust store it is
// pointed at: the system's roots and the egress's CA.
const CABundleInBox = "/run/quro/ca-bundle.pem"

// caEnv are the variables that point a box's programs at CABundleInBox.
var caEnv = []string{"SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "NODE_EXTRA_CA_CERTS", "PIP_CERT", "CURL_CA_BUNDLE", "GIT_SSL_CAINFO"}

// SetSecretInput is set_session_secret's input.
type SetSecretInput struct {
	Session string   `json:"session,omitempty" jsonschema:"session id or name; the default session when omitted"`
	Name    string   `json:"name" jsonschema:"the variable the session's processes see (OPENAI_API_KEY); it holds a placeholder, never the value"`
	Value   string   `json:"value,omitempty" jsonschema:"the secret; empty removes the secret of that name"`
	Hosts   []string `json:"hosts,omitempty" jsonschema:"where the value is sent in place of the placeholder: domains (api.openai.com) or wildcards (*.example.com)"`
}

// SecretInfo is what is shown of a secret: never its value.
type SecretInfo struct {
	Name        string   `json:"name"`
	Hosts       []string `json:"hosts"`
	Placeholder string   `json:"placeholder" jsonschema:"what the session's processes see in the variable"`
}

// SecretsOutput is set_session_secret's output: the session's secrets.
type SecretsOutput struct {
	Session string       `json:"session"`
	Secrets []SecretInfo `json:"secrets"`
	Note    string       `json:"note,omitempty"`
}

// Text is one line per secret.
func (o *SecretsOutput) Text() string {
	var b strings.Builder
	if len(o.Secrets) == 0 {
		b.WriteString("the session has no secrets")
	}
	for i, s := range o.Secrets {
		if i > 0 {
			b.WriteString("\n")
		}
		fmt.Fprintf(&b, "%s=%s sent to %s", s.Name, s.Placeholder, strings.Join(s.Hosts, ", "))
	}
	if o.Note != "" {
		b.WriteString("\n" + o.Note)
	}
	return b.String()
}

// sessionSecrets are the sessions' secrets: sealed in the store with the
// data directory's key, open in memory for the egress (read from the
// store the first time, kept until the session ends).
type sessionSecrets struct {
	store *store.Store
	aead  cipher.AEAD

	// setMu makes each set's write and reload one step: two sets of a
	// session at once (removing X, adding Y) could otherwise leave the
	// cache with the earlier reload, a removed secret still sent.
	setMu sync.Mutex
	mu    sync.Mutex
	byID  map[string][]egress.Secret
}

// openSecrets is the secrets of the sessions under dir, sealed with
// dir/secrets.key (made, 0600, the first time).
func openSecrets(dir string, st *store.Store) (*sessionSecrets, error) {
	path := filepath.Join(dir, "secrets.key")
	key, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		key = make([]byte, 32)
		if _, err := rand.Read(key); err != nil {
			return nil, err
		}
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if err != nil {
			return nil, fmt.Errorf("secrets key: %w", err)
		}
		_, err = f.Write(key)
		if err = errors.Join(err, f.Sync(), f.Close()); err != nil {
			return nil, fmt.Errorf("secrets key: %w", err)
		}
	} else if err != nil {
		return nil, fmt.Errorf("secrets key: %w", err)
	}
	if len(key) != 32 {
		return nil, fmt.Errorf("secrets key %s: want 32 bytes, not %d (a session's secrets cannot be read without the key it was sealed with)", "$QURO_DATA/secrets.key", len(key))
	}
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, err
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		return nil, err
	}
	return &sessionSecrets{store: st, aead: aead, byID: map[string][]egress.Secret{}}, nil
}

// seal is value sealed for the session's secret name sent to hosts: the
// session, the name and the hosts are authenticated with it, so a sealed
// value moved to another row does not open, nor one whose hosts were
// changed in the store (whoever can write quro.db but not read
// secrets.key cannot have the value sent to a host of theirs).
func (s *sessionSecrets) seal(session, name, value string, hosts []string) []byte {
	nonce := make([]byte, s.aead.NonceSize())
	if _, err := rand.Read(nonce); err != nil {
		panic(err) // crypto/rand does not fail on Linux
	}
	return s.aead.Seal(nonce, nonce, []byte(value), sealedFor(session, name, hosts))
}

func (s *sessionSecrets) open(session, name string, hosts []string, sealed []byte) (string, error) {
	n := s.aead.NonceSize()
	if len(sealed) < n {
		return "", errors.New("sealed value too short")
	}
	v, err := s.aead.Open(nil, sealed[:n], sealed[n:], sealedFor(session, name, hosts))
	return string(v), err
}

// sealedFor is the data authenticated with a sealed value: none of its
// parts holds a NUL (ids, variable names and hosts are printable).
func sealedFor(session, name string, hosts []string) []byte {
	return []byte(session + "\x00" + name + "\x00" + strings.Join(hosts, "\x00"))
}

// of is session id's secrets (nil: none, or they cannot be read).
func (s *sessionSecrets) of(id string) []egress.Secret {
	s.mu.Lock()
	sec, ok := s.byID[id]
	s.mu.Unlock()
	if ok {
		return sec
	}
	sec, err := s.load(context.Background(), id)
	if err != nil {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if got, ok := s.byID[id]; ok {
		return got
	}
	s.byID[id] = sec
	return sec
}

func (s *sessionSecrets) load(ctx context.Context, id string) ([]egress.Secret, error) {
	rows, err := s.store.SessionSecrets(ctx, id)
	if err != nil {
		return nil, err
	}
	out := []egress.Secret{}
	for _, r := range rows {
		v, err := s.open(id, r.Name, r.Hosts, r.Sealed)
		if err != nil {
			return nil, fmt.Errorf("secret %s cannot be opened (the data directory's secrets.key changed?)", r.Name)
		}
		sec := egress.Secret{Name: r.Name, Placeholder: r.Placeholder, Value: v}
		for _, h := range r.Hosts {
			if rule, err := egress.ParseSecretHost(h); err == nil {
				sec.Hosts = append(sec.Hosts, rule)
			}
		}
		out = append(out, sec)
	}
	return out, nil
}

// set stores the session's secret name (value "": removes it) and makes
// it the egress's at once.
func (s *sessionSecrets) set(ctx context.Context, id, name, value string, hosts []string) error {
	return s.setAs(ctx, id, name, value, hosts, "")
}

// setAs is set with the placeholder given (a moved session's, which its
// files may hold; checkMovedSecrets checked its form), or a new random
// one when "".
func (s *sessionSecrets) setAs(ctx context.Context, id, name, value string, hosts []string, placeholder string) error {
	s.setMu.Lock()
	defer s.setMu.Unlock()
	if value == "" {
		if _, err := s.store.DeleteSessionSecret(ctx, id, name); err != nil {
			return err
		}
	} else {
		if placeholder == "" {
			ph := make([]byte, 16)
			if _, err := rand.Read(ph); err != nil {
				return err
			}
			placeholder = egress.PlaceholderPrefix + hex.EncodeToString(ph)
		}
		if err := s.store.SetSessionSecret(ctx, id, store.SessionSecret{Name: name, Placeholder: placeholder,
			Hosts: hosts, Sealed: s.seal(id, name, value, hosts), CreatedAt: time.Now()}); err != nil {
			return err
		}
	}
	sec, err := s.load(ctx, id)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.byID[id] = sec
	return nil
}

// infos is what may be shown of session id's secrets.
func (s *sessionSecrets) infos(id string) []SecretInfo {
	var out []SecretInfo
	for _, sec := range s.of(id) {
		in := SecretInfo{Name: sec.Name, Placeholder: sec.Placeholder, Hosts: []string{}}
		for _, r := range sec.Hosts {
			in.Hosts = append(in.Hosts, r.String())
		}
		out = append(out, in)
	}
	return out
}

// env is what a run of session id adds to its environment: each
// secret's placeholder, and the trust store that holds the egress's CA.
func (s *sessionSecrets) env(id string) map[string]string {
	secs := s.of(id)
	if len(secs) == 0 {
		return nil
	}
	env := map[string]string{}
	for _, v := range caEnv {
		env[v] = CABundleInBox
	}
	for _, sec := range secs {
		env[sec.Name] = sec.Placeholder
	}
	return env
}

func (s *sessionSecrets) forget(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.byID, id)
}

// checkSecret checks set_session_secret's input: its hosts parsed.
func checkSecret(in SetSecretInput) ([]string, error) {
	if err := sandbox.CheckEnvName(in.Name); err != nil {
		return nil, capability.Errorf(capability.InvalidArgument, "secret name: %v", err)
	}
	if slices.Contains(caEnv, in.Name) {
		return nil, capability.Errorf(capability.InvalidArgument, "secret name %s: the server sets that variable for a session with secrets; choose another name", in.Name)
	}
	if in.Value == "" {
		if len(in.Hosts) > 0 {
			return nil, capability.Errorf(capability.InvalidArgument, "hosts without a value: give the value, or leave both out to remove secret %s", in.Name)
		}
		return nil, nil
	}
	if len(in.Value) > MaxSecretValue {
		return nil, capability.Errorf(capability.InvalidArgument, "secret %s: the value is %d bytes, at most %d", in.Name, len(in.Value), MaxSecretValue)
	}
	if strings.ContainsAny(in.Value, "\x00\r\n") {
		return nil, capability.Errorf(capability.InvalidArgument, "secret %s: the value holds a NUL, CR or LF byte, which an HTTP header cannot carry", in.Name)
	}
	if len(in.Hosts) == 0 || len(in.Hosts) > MaxSecretHosts {
		return nil, capability.Errorf(capability.InvalidArgument, "secret %s: name between 1 and %d hosts it is sent to", in.Name, MaxSecretHosts)
	}
	var hosts []string
	for _, h := range in.Hosts {
		r, err := egress.ParseSecretHost(h)
		if err != nil {
			return nil, capability.Errorf(capability.InvalidArgument, "secret %s: %v", in.Name, err)
		}
		if !slices.Contains(hosts, r.String()) {
			hosts = append(hosts, r.String())
		}
	}
	return hosts, nil
}

// checkCreateSecrets checks create_session's secrets as set_session_secret
// checks one, each with a value, no name twice; their hosts parsed.
func checkCreateSecrets(in []SecretInput) ([]SecretInput, error) {
	if len(in) > MaxSecretsPerSession {
		return nil, capability.Errorf(capability.InvalidArgument, "%d secrets: a session has at most %d", len(in), MaxSecretsPerSession)
	}
	var out []SecretInput
	for _, sec := range in {
		if sec.Value == "" {
			return nil, capability.Errorf(capability.InvalidArgument, "secret %s has no value", sec.Name)
		}
		if slices.ContainsFunc(out, func(o SecretInput) bool { return o.Name == sec.Name }) {
			return nil, capability.Errorf(capability.InvalidArgument, "secret %s is given twice", sec.Name)
		}
		hosts, err := checkSecret(SetSecretInput{Name: sec.Name, Value: sec.Value, Hosts: sec.Hosts})
		if err != nil {
			return nil, err
		}
		out = append(out, SecretInput{Name: sec.Name, Value: sec.Value, Hosts: hosts})
	}
	return out, nil
}

func (a *App) registerSecrets(reg *capability.Registry) {
	reg.Register(capability.New("set_session_secret",
		"Give a session a secret it never sees: its processes started from now on see the variable name holding a placeholder, "+
			"and the server's egress writes the value in its place only in requests (headers, URL) to the hosts named; a request that carries "+
			"the placeholder anywhere else is refused. Needs network internet. An empty value removes the secret. The value is never shown again.",
		capability.ScopeExec, a.setSessionSecret).InSession(capability.UseHold))
}

func (a *App) setSessionSecret(ctx context.Context, in SetSecretInput) (*SecretsOutput, error) {
	// A session's own code may not choose where its secrets go.
	if c, ok := controller.CallerFrom(ctx); ok && c.Session != "" {
		return nil, capability.Errorf(capability.PermissionDenied, "code in a session cannot set a session's secrets")
	}
	hosts, err := checkSecret(in)
	if err != nil {
		return nil, err
	}
	s, err := entered(ctx)
	if err != nil {
		return nil, err
	}
	if in.Value != "" && !slices.ContainsFunc(a.secrets.of(s.ID), func(sec egress.Secret) bool { return sec.Name == in.Name }) &&
		len(a.secrets.of(s.ID)) >= MaxSecretsPerSession {
		return nil, capability.Errorf(capability.ResourceExhausted, "session %s has %d secrets, the most it may have: remove one first (an empty value)", s.Name, MaxSecretsPerSession)
	}
	if err := a.secrets.set(ctx, s.ID, in.Name, in.Value, hosts); err != nil {
		return nil, err
	}
	out := &SecretsOutput{Session: s.ID, Secrets: a.secrets.infos(s.ID)}
	if out.Secrets == nil {
		out.Secrets = []SecretInfo{}
	}
	notes := []string{"processes started from now on see the placeholder; running ones (the resident Python, the shell) keep their environment until restarted (reset_python, a new terminal)"}
	if s.Network != sandbox.NetworkInternet {
		notes = append(notes, fmt.Sprintf("the session's network is %q: the secret is sent only under internet (set_session_network)", s.Network))
	}
	out.Note = strings.Join(notes, "; ")
	return out, nil
}

// withSecretEnv adds to runEnv the variables of a run's session's secrets.
func withSecretEnv(runEnv func(*sandbox.Spec, string) sandbox.RunEnv, sessionOf func(dir string) (string, bool), sec *sessionSecrets) func(*sandbox.Spec, string) sandbox.RunEnv {
	return func(spec *sandbox.Spec, network string) sandbox.RunEnv {
		re := runEnv(spec, network)
		id := spec.Session
		if id == "" {
			id, _ = sessionOf(spec.Dir)
		}
		if id == "" {
			return re
		}
		if env := sec.env(id); env != nil {
			re.Env = maps.Clone(re.Env)
			if re.Env == nil {
				re.Env = map[string]string{}
			}
			maps.Copy(re.Env, env)
		}
		return re
	}
}
