// Package streamcap counts the long-lived streams each token holds —
// WebSocket connections (the terminal, streamed runs), MCP event streams
// and the long requests of E2B's sandbox plane (envd's streams, /files,
// the interpreter's /execute) — and refuses the one past the cap. The routes that hold
// streams share one Limiter, so one count covers them all.
package streamcap

import (
	"context"
	"net/http"
	"sync"
	"time"

	"github.com/quro-dev/quro/internal/capability"
	"github.com/quro-dev/quro/internal/controller"
	"github.com/quro-dev/quro/internal/share"
)

// DefaultMax is the cap of quro serve's --max-streams-per-token.
const DefaultMax = 64

// Limiter caps the streams held per token (a caller's tenant and token
// id). A nil Limiter, or one with a cap of 0 or less, caps nothing.
// Callers without a token id (a server without authentication) are not
// counted.
type Limiter struct {
	max  int
	flag string // how the cap is set, for the refusal's message
	// tenants, when set (Tenants), is the server's streams with each
	// tenant's share, over all of the tenant's tokens.
	tenants     *share.Pool
	tenantsFlag string

	mu   sync.Mutex
	held map[key]int
}

type key struct{ tenant, token string }

// New returns a Limiter of max streams per token; flag names the setting
// that changes it ("--max-streams-per-token"), for the refusal.
func New(max int, flag string) *Limiter {
	return &Limiter{max: max, flag: flag, held: map[key]int{}}
}

// Tenants caps the streams of all tokens together at max, each tenant's
// at a quarter (at least one token's cap), so that a tenant with many
// tokens cannot hold every stream the server's connections allow; flag
// names the setting of max, for the refusal. Call it before the first
// Acquire. max ≤ 0: no cap.
func (l *Limiter) Tenants(max int, flag string) {
	if l == nil || max <= 0 {
		return
	}
	l.tenants = share.New("streams (WebSocket connections and MCP event streams)", max, share.Of(max, l.max))
	l.tenantsFlag = flag
}

// Max is the cap (0 or less: none).
func (l *Limiter) Max() int {
	if l == nil {
		return 0
	}
	return l.max
}

// Acquire holds a stream of caller until release is called (once). Past
// the cap it fails with ResourceExhausted, naming the cap.
func (l *Limiter) Acquire(caller controller.Caller) (release func(), err *capability.Error) {
	if l == nil || l.max <= 0 || caller.TokenID == "" {
		return func() {}, nil
	}
	k := key{caller.Tenant, caller.TokenID}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.held[k] >= l.max {
		how := ""
		if l.flag != "" {
			how = " (" + l.flag + ")"
		}
		return nil, capability.Errorf(capability.ResourceExhausted,
			"this token holds %d streams (WebSocket connections, MCP event streams, E2B process, watch, file and execute streams), the most one token may hold%s: close one first", l.held[k], how)
	}
	if err := l.tenants.Acquire(caller.Tenant); err != nil {
		how := ""
		if l.tenantsFlag != "" {
			how = " (" + l.tenantsFlag + "; a tenant's share is a quarter of it)"
		}
		return nil, capability.Errorf(capability.ResourceExhausted, "%v%s: close one first", err, how)
	}
	l.held[k]++
	var once sync.Once
	return func() {
		once.Do(func() {
			l.mu.Lock()
			defer l.mu.Unlock()
			if l.held[k]--; l.held[k] <= 0 {
				delete(l.held, k)
			}
			l.tenants.Release(caller.Tenant)
		})
	}, nil
}

// Held is the number of streams caller's token holds (for tests and
// metrics).
func (l *Limiter) Held(caller controller.Caller) int {
	if l == nil {
		return 0
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.held[key{caller.Tenant, caller.TokenID}]
}

// RetryAfter is the Retry-After a refusal carries, in seconds: a stream
// ends when its client closes it, not on a schedule.
const RetryAfter = "5"

// Refuse answers a refusal of Acquire: 429 with the error as JSON, written
// by write (the route's own error writer).
func Refuse(w http.ResponseWriter, e *capability.Error, write func(http.ResponseWriter, int, *capability.Error)) {
	w.Header().Set("Retry-After", RetryAfter)
	write(w, http.StatusTooManyRequests, e)
}

// KeepAlive pings a stream's peer with ping every quarter of idle until
// ctx ends or stop is called. The first ping not answered within idle
// (ping returns an error while ctx lives) calls gone with that error, and
// the pinging ends. stop ends it and waits for it.
func KeepAlive(ctx context.Context, idle time.Duration, ping func(context.Context) error, gone func(error)) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(max(idle/4, time.Millisecond))
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			pctx, pcancel := context.WithTimeout(ctx, idle)
			err := ping(pctx)
			pcancel()
			if err == nil {
				continue
			}
			if ctx.Err() == nil {
				gone(err)
			}
			return
		}
	}()
	return func() {
		cancel()
		<-done
	}
}
