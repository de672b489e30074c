package terminal

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/quro-dev/quro/internal/session"
)

// A person may take over a session's shell (the web UI's Take over): from
// then until they hand it back, only calls made under their hold
// (WithHolder) run commands or type input in it; every other call — the
// agent's, from any access path — is refused with a HeldError. A person's
// command is a command like any other: it goes to the shell through the
// memfd frame with a fresh nonce, and its completion comes only from the
// record on descriptor 3, so what a person types can no more end an
// agent's command than a command's output can.

// ErrHeld means a person holds the session's shell.
var ErrHeld = errors.New("a person holds this session")

// HeldError is the answer of a call refused because a person holds the
// session's shell. It matches ErrHeld.
type HeldError struct {
	Session string        // the session's name
	For     time.Duration // how long they have held it
}

func (e *HeldError) Error() string {
	return fmt.Sprintf("%s: they took over session %s's shell in the web UI %s ago, and this call ran nothing. "+
		"Call again after they hand it back (they see your calls live), or run this with run_code or start_process, which the hold does not stop",
		ErrHeld, e.Session, round(e.For))
}

// Unwrap makes a HeldError match ErrHeld.
func (e *HeldError) Unwrap() error { return ErrHeld }

type holderKey struct{}

// WithHolder returns ctx for calls made under the hold key names (the
// server's own random key of one take-over, never a value a caller sent).
func WithHolder(ctx context.Context, key string) context.Context {
	return context.WithValue(ctx, holderKey{}, key)
}

// HolderFrom returns the hold key ctx carries, or "".
func HolderFrom(ctx context.Context) string {
	k, _ := ctx.Value(holderKey{}).(string)
	return k
}

type hold struct {
	key   string
	since time.Time
}

// Take gives s's shell to the hold key names (non-empty). Taking a shell
// held under another key fails with a HeldError; under the same key it
// changes nothing. A command running when it is taken runs on; calls
// already waiting in line for the shell run in turn.
func (m *Manager) Take(s *session.Session, key string) error {
	if key == "" {
		return fmt.Errorf("%w: an empty hold key", ErrInvalid)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed || m.ended.Has(s.ID) {
		return fmt.Errorf("%w: session %s was destroyed", ErrClosed, s.Name)
	}
	if h, ok := m.holds[s.ID]; ok && h.key != key {
		return &HeldError{Session: s.Name, For: time.Since(h.since)}
	}
	if _, ok := m.holds[s.ID]; !ok {
		m.holds[s.ID] = hold{key: key, since: time.Now()}
	}
	return nil
}

// HandBack ends the hold key has on s's shell; it reports whether key
// held it.
func (m *Manager) HandBack(s *session.Session, key string) bool {
	return m.handBack(s.ID, key)
}

func (m *Manager) handBack(id, key string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if h, ok := m.holds[id]; ok && h.key == key {
		delete(m.holds, id)
		return true
	}
	return false
}

// Held reports whether a person holds s's shell.
func (m *Manager) Held(s *session.Session) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	_, ok := m.holds[s.ID]
	return ok
}

// CheckHold refuses, with a HeldError, a call under ctx on s's shell
// while someone other than ctx's holder holds it.
func (m *Manager) CheckHold(ctx context.Context, s *session.Session) error {
	m.mu.Lock()
	h, ok := m.holds[s.ID]
	m.mu.Unlock()
	if !ok || h.key == HolderFrom(ctx) {
		return nil
	}
	return &HeldError{Session: s.Name, For: time.Since(h.since)}
}
