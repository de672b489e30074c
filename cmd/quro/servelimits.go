package main

import (
	"context"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/quro-dev/quro/internal/api/httpauth"
	"github.com/quro-dev/quro/internal/api/ws"
	"github.com/quro-dev/quro/internal/connlimit"
	"github.com/quro-dev/quro/internal/metrics"
)

// raiseFileLimit raises the soft open-file limit to the hard one (Go does
// it too at start; this makes it explicit and logged) and returns the soft
// limit in force.
func raiseFileLimit(log *slog.Logger) uint64 {
	var lim unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &lim); err != nil {
		log.Warn("reading the open-file limit", "err", err)
		return 1024
	}
	if lim.Cur < lim.Max {
		old := lim.Cur
		lim.Cur = lim.Max
		if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &lim); err != nil {
			log.Warn("raising the open-file limit", "from", old, "to", lim.Max, "err", err)
			lim.Cur = old
		}
	}
	log.Info("open-file limit", "soft", lim.Cur, "hard", lim.Max)
	return lim.Cur
}

// caps are the connection caps of the listeners.
type caps struct {
	max, perIP int // the TCP listener's
	insession  int // the in-session socket's total
}

// fdsKept are the descriptors kept out of the listeners' reach: SQLite,
// sandboxes' pipes and pidfds, PTYs, log files.
const fdsKept = 512

// connCaps fits the caps to the open-file limit: the TCP listener gets at
// most half of what is not kept, the in-session socket a quarter (of which
// each tenant's sessions hold a quarter: insession.NewServer); one address
// gets at most half of the TCP listener's.
func connCaps(fdLimit uint64, maxConns, perIP int) caps {
	budget := 64
	if fdLimit > fdsKept+128 {
		budget = int(min(fdLimit-fdsKept, 1<<30))
	}
	var c caps
	c.max = max(16, min(maxConns, budget/2))
	c.perIP = max(1, min(perIP, c.max/2))
	c.insession = max(16, budget/4)
	return c
}

// longRequest: the requests that last as long as their client wants and
// get no read or write deadline — WebSocket upgrades
// (/v1/sessions/{id}/pty, /v1/stream/...) and MCP's event stream (GET
// /mcp). Their handlers ping the client instead (--stream-idle-timeout)
// and count them against the token's cap (--max-streams-per-token).
func longRequest(r *http.Request) bool {
	if strings.EqualFold(r.Header.Get("Upgrade"), "websocket") {
		return true
	}
	return r.Method == http.MethodGet && r.URL.Path == "/mcp"
}

// authenticated tells connlimit which requests authenticate (their
// connection is then evicted for a newer one only while idle between
// requests, and only when no unauthenticated one is left): those with a valid
// token, in the Authorization header or, for a browser's WebSocket, in a
// quro.bearer.<token> subprotocol; every request under --no-auth. A request
// without a token costs no lookup.
func authenticated(auth httpauth.Func, noAuth bool) func(*http.Request) bool {
	if noAuth {
		return func(*http.Request) bool { return true }
	}
	return func(r *http.Request) bool {
		if httpauth.Bearer(r) == "" {
			tok := ""
			for _, v := range r.Header.Values("Sec-WebSocket-Protocol") {
				for p := range strings.SplitSeq(v, ",") {
					if t, ok := strings.CutPrefix(strings.TrimSpace(p), ws.BearerPrefix); ok {
						tok = t
					}
				}
			}
			if tok == "" {
				return false
			}
			r = r.Clone(r.Context())
			r.Header.Set("Authorization", "Bearer "+tok)
		}
		_, err := auth(r)
		return err == nil
	}
}

func watchConns(m *metrics.Metrics, l *connlimit.Listener) {
	max := l.Options().Max
	m.WatchConnections(l.Options().Name, func() metrics.ConnStats {
		s := l.Stats()
		return metrics.ConnStats{Open: s.Open, Pending: s.Pending, Max: max, RefusedTotal: s.RefusedTotal, RefusedPeer: s.RefusedPeer, Evicted: s.Evicted}
	})
}

// watchFDs warns when the process's open descriptors pass 80% of the limit
// (once per crossing), every interval until ctx ends.
func watchFDs(ctx context.Context, log *slog.Logger, limit uint64, every time.Duration) {
	if every <= 0 {
		every = 15 * time.Second
	}
	t := time.NewTicker(every)
	defer t.Stop()
	high := false
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		ents, err := os.ReadDir("/proc/self/fd")
		if err != nil {
			return
		}
		n := uint64(len(ents))
		switch {
		case !high && n >= limit*8/10:
			high = true
			log.Warn("open file descriptors near the limit", "open", n, "limit", limit)
		case high && n < limit*7/10:
			high = false
			log.Info("open file descriptors back under 70% of the limit", "open", n, "limit", limit)
		}
	}
}
