// Package audit keeps the audit log: one entry for every capability call
// through any access path, in the embedded store. Entries are written by
// one goroutine in batches, so a call never waits on the disk (up to a
// bound: see Log); a query first waits until every call before it is
// written, so a caller always finds its own earlier calls.
package audit

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"log/slog"
	"regexp"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/quro-dev/quro/internal/controller"
	"github.com/quro-dev/quro/internal/store"
)

// Options configure a Log. nil means defaults.
type Options struct {
	// Keep is how many entries are kept; older ones are deleted
	// (default 100000; negative keeps everything).
	Keep   int64
	Logger *slog.Logger
	// MaxPending bounds the entries waiting for the writer (default
	// DefaultMaxPending). With the batch being written, at most twice
	// this many entries are held in memory however slow the disk.
	MaxPending int
	// Wait is how long a call waits for room when MaxPending entries are
	// waiting (default DefaultWait). After it, its entry is dropped and
	// counted: the log then holds a gap entry with the count.
	Wait time.Duration
}

// DefaultMaxPending and DefaultWait are the defaults of Options.
const (
	DefaultMaxPending = 8192
	DefaultWait       = time.Second
)

// linger is how long the writer lets a burst of entries gather before it
// writes them in one transaction (a query's Flush does not wait for it).
const linger = 10 * time.Millisecond

// GapCapability and GapOutcome mark the entry that stands for entries
// lost when the writer fell behind (see Options.Wait).
const (
	GapCapability = "audit_gap"
	GapOutcome    = "lost"
)

// Log is the audit log. Close it to write what is pending.
//
// Entries go to one writer goroutine, so a call does not wait on the disk.
// When the disk is slow (or the database locked by another process) the
// entries waiting for it are bounded: at MaxPending a call waits for room
// (backpressure) up to Wait, then its entry is dropped, counted per tenant
// and logged, and the writer records a gap entry with the count in that
// tenant's log as soon as it can write again. Nothing is lost silently.
type Log struct {
	st      *store.Store
	keep    int64
	log     *slog.Logger
	max     int
	wait    time.Duration
	wake    chan struct{} // an entry is pending
	urgent  chan struct{} // a Flush or Close waits: no lingering
	done    chan struct{}
	lostAll atomic.Int64

	mu      sync.Mutex
	pending []store.AuditEntry
	flushed []chan struct{} // closed when everything before their request is written
	room    chan struct{}   // closed (and replaced) when the writer takes the pending entries
	lost    map[string]int  // per tenant, entries dropped since the last gap entry
	closed  bool
}

// New starts the audit log over st.
func New(st *store.Store, o *Options) *Log {
	var opts Options
	if o != nil {
		opts = *o
	}
	l := &Log{st: st, keep: opts.Keep, log: opts.Logger, max: opts.MaxPending, wait: opts.Wait,
		wake: make(chan struct{}, 1), urgent: make(chan struct{}, 1), done: make(chan struct{}),
		room: make(chan struct{}), lost: map[string]int{}}
	if l.keep == 0 {
		l.keep = 100000
	}
	if l.max <= 0 {
		l.max = DefaultMaxPending
	}
	if l.wait <= 0 {
		l.wait = DefaultWait
	}
	if l.log == nil {
		l.log = slog.New(slog.DiscardHandler)
	}
	go l.writer()
	return l
}

// Lost returns how many entries were dropped because the writer fell
// behind, since the Log started (each is also counted in a gap entry).
func (l *Log) Lost() int64 { return l.lostAll.Load() }

// Observe is the controller observer that records each call.
func (l *Log) Observe(_ context.Context, r *controller.Record) {
	e := store.AuditEntry{
		At: r.Start, Tenant: r.Caller.Tenant, TokenID: r.Caller.TokenID, Path: r.Caller.Path,
		Capability: bounded(r.Capability, 64), Args: Summarize(r.Args), Outcome: r.Outcome, Duration: r.Duration,
		Session: r.Session, Background: r.Background,
	}
	if r.Err != nil {
		e.Message = bounded(r.Err.Message, 512)
	}
	l.add(e)
}

// add queues e, waiting up to l.wait for room when l.max entries wait.
func (l *Log) add(e store.AuditEntry) {
	var (
		timer   *time.Timer
		expired bool
	)
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	l.mu.Lock()
	for !l.closed && len(l.pending) >= l.max {
		if expired {
			l.lost[e.Tenant]++
			l.mu.Unlock()
			if n := l.lostAll.Add(1); n == 1 || n%1000 == 0 {
				l.log.Error("audit log: entries lost, the writer is behind (disk slow or database locked)", "lost_total", n, "pending", l.max)
			}
			return
		}
		if timer == nil {
			timer = time.NewTimer(l.wait)
		}
		room := l.room
		l.mu.Unlock()
		select {
		case <-room:
		case <-timer.C:
			expired = true
		}
		l.mu.Lock()
	}
	if l.closed {
		l.mu.Unlock()
		return
	}
	l.pending = append(l.pending, e)
	l.mu.Unlock()
	poke(l.wake)
}

func poke(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// Flush waits until every entry recorded before it is in the store.
func (l *Log) Flush(ctx context.Context) error {
	ch := make(chan struct{})
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil
	}
	l.flushed = append(l.flushed, ch)
	l.mu.Unlock()
	poke(l.urgent)
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Close writes what is pending and stops the writer.
func (l *Log) Close() {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return
	}
	l.closed = true
	close(l.room) // callers waiting for room give up their wait
	l.room = make(chan struct{})
	l.mu.Unlock()
	poke(l.urgent)
	<-l.done
}

func (l *Log) writer() {
	defer close(l.done)
	for {
		select {
		case <-l.wake:
			// Let a burst gather into one transaction, unless someone waits.
			t := time.NewTimer(linger)
			select {
			case <-t.C:
			case <-l.urgent:
			}
			t.Stop()
		case <-l.urgent:
		}
		for {
			l.mu.Lock()
			batch, waiters, closed := l.pending, l.flushed, l.closed
			l.pending, l.flushed = nil, nil
			close(l.room) // room again for callers waiting at the cap
			l.room = make(chan struct{})
			for tenant, n := range l.lost {
				batch = append(batch, store.AuditEntry{At: time.Now(), Tenant: tenant, Path: "audit",
					Capability: GapCapability, Outcome: GapOutcome,
					Message: fmt.Sprintf("%d audit entries of this tenant were lost here: the audit writer fell behind (disk slow or database locked) and the calls could not wait longer", n)})
			}
			clear(l.lost)
			l.mu.Unlock()
			written := len(batch) == 0 || l.write(batch)
			for _, ch := range waiters {
				close(ch)
			}
			if closed {
				if !written {
					return // closing, and the store refuses: what is lost was logged
				}
				l.mu.Lock()
				rest := len(l.pending) + len(l.flushed) + len(l.lost)
				l.mu.Unlock()
				if rest == 0 {
					return
				}
				continue
			}
			if len(batch) == 0 && len(waiters) == 0 {
				break
			}
		}
	}
}

// write stores batch, trying again a few times when the store fails
// (SQLite gives up on a lock after its busy timeout); entries it cannot
// write are counted as lost, so that a gap entry records them.
func (l *Log) write(batch []store.AuditEntry) bool {
	var err error
	for attempt := range 3 {
		if attempt > 0 {
			time.Sleep(time.Duration(attempt) * 100 * time.Millisecond)
		}
		if err = l.st.AppendAudit(context.Background(), batch, l.keep); err == nil {
			return true
		}
	}
	l.log.Error("audit log: entries lost", "entries", len(batch), "err", err)
	l.mu.Lock()
	for _, e := range batch {
		if e.Capability != GapCapability {
			l.lost[e.Tenant]++
			l.lostAll.Add(1)
		} else {
			l.lost[e.Tenant] += gapCount(e.Message)
		}
	}
	l.mu.Unlock()
	return false
}

// gapCount reads the count back from a gap entry's message.
func gapCount(msg string) int {
	var n int
	_, _ = fmt.Sscanf(msg, "%d ", &n) // the message is ours: it starts with the count
	return n
}

// Entry is one audit entry as callers see it.
type Entry struct {
	Seq        int64     `json:"seq"`
	Time       time.Time `json:"time"`
	TokenID    string    `json:"token_id,omitempty"`
	Path       string    `json:"path" jsonschema:"access path: rest, mcp, ws or cli"`
	Capability string    `json:"capability"`
	Args       string    `json:"args" jsonschema:"a bounded summary of the arguments; secrets and contents are left out"`
	Outcome    string    `json:"outcome" jsonschema:"ok; timeout or canceled when the call's run was stopped before it finished; or the error code"`
	Message    string    `json:"message,omitempty" jsonschema:"the error message"`
	DurationMS float64   `json:"duration_ms"`
	Session    string    `json:"session,omitempty" jsonschema:"the id of the session the call acted on (entered or created)"`
	Background bool      `json:"background,omitempty" jsonschema:"a read the client made by itself (a page refreshing what it shows), not a person's or an agent's action"`
}

// Query selects entries.
type Query struct {
	Tenant     string
	TokenID    string // only this token's calls ("" for all of the tenant's)
	Capability string
	Since      time.Time
	Limit      int // default 50, at most 1000
	// Outcome: "" for any, "ok", "failed" (anything but ok) or one outcome.
	Outcome string
	Session string // only calls on this session id ("" for any)
	// Background includes the background reads (left out otherwise).
	Background bool
}

// MaxLimit is the most entries one query returns.
const MaxLimit = 1000

// Entries returns the latest entries matching q, oldest first.
func (l *Log) Entries(ctx context.Context, q Query) ([]Entry, error) {
	if err := l.Flush(ctx); err != nil {
		return nil, err
	}
	if q.Limit <= 0 {
		q.Limit = 50
	}
	q.Limit = min(q.Limit, MaxLimit)
	rows, err := l.st.Audit(ctx, store.AuditFilter{Tenant: q.Tenant, TokenID: q.TokenID, Capability: q.Capability, Since: q.Since, Limit: q.Limit,
		Outcome: q.Outcome, Session: q.Session, Background: q.Background})
	if err != nil {
		return nil, err
	}
	out := make([]Entry, len(rows))
	for i, r := range rows {
		out[i] = Entry{Seq: r.Seq, Time: r.At.UTC(), TokenID: r.TokenID, Path: r.Path, Capability: r.Capability,
			Args: r.Args, Outcome: r.Outcome, Message: r.Message, DurationMS: float64(r.Duration.Microseconds()) / 1000,
			Session: r.Session, Background: r.Background}
	}
	return out, nil
}

// secretKeys are argument names whose values are never recorded: what
// they hold is either a secret or the user's content.
var secretKeys = []string{"env", "content", "data", "token", "password", "secret", "key", "input", "args", "old_str", "new_str", "value"}

// tokenRe matches a bearer token, quro_<hex id>_<base64url secret>, in
// any string argument; the secret part is replaced.
var tokenRe = regexp.MustCompile(`(quro_[0-9a-fA-F]+_)[A-Za-z0-9_-]+`)

// e2bKeyRe matches the E2B spelling of a token, e2b_<12 hex id><hex
// secret> (internal/auth): the id is kept, the secret replaced.
var e2bKeyRe = regexp.MustCompile(`(e2b_[0-9a-fA-F]{12})[0-9a-fA-F]+`)

// accessTokenRe matches an E2B sandbox's access token, qa_<64 hex>, or
// qa_<64 hex>_<API key id> (internal/api/e2b): the hex is its secret, the
// key's id after it is kept.
var accessTokenRe = regexp.MustCompile(`qa_[0-9a-fA-F]{16,}`)

// codeKeys hold code or commands: recorded as their first line, bounded.
var codeKeys = []string{"code", "command"}

// RedactTokens replaces the secret of every Quro token, E2B key and
// access token in s, keeping a token's id: the audit log's summaries and
// the live events' inputs (events.Bus.Redact) pass through it.
func RedactTokens(s string) string {
	s = tokenRe.ReplaceAllString(s, "${1}<secret redacted>")
	s = e2bKeyRe.ReplaceAllString(s, "${1}<secret redacted>")
	return accessTokenRe.ReplaceAllString(s, "qa_<secret redacted>")
}

// Summarize returns a bounded, secret-free summary of call arguments:
// scalar fields as they are (strings cut short), code and commands as their
// first line, environment variables by their names, and contents,
// environment values and anything that looks like a secret only as their
// size.
func Summarize(args json.RawMessage) string {
	if t := strings.TrimSpace(string(args)); t == "" || t == "null" {
		return ""
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(args, &m); err != nil {
		return fmt.Sprintf("(%d bytes, not a JSON object)", len(args))
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for _, k := range keys {
		if b.Len() > 0 {
			b.WriteString(" ")
		}
		b.WriteString(bounded(k, 32))
		b.WriteString("=")
		b.WriteString(summarizeValue(strings.ToLower(k), m[k], base64Encoded(m["encoding"])))
	}
	return bounded(b.String(), 1024)
}

// base64Encoded says whether a call's encoding argument is base64 (as
// write_file's), so that its content's size is that of the decoded bytes.
func base64Encoded(raw json.RawMessage) bool {
	var s string
	return raw != nil && json.Unmarshal(raw, &s) == nil && strings.EqualFold(s, "base64")
}

// size is the byte size of a value as the caller meant it: a string's
// decoded text (or, b64, the bytes its base64 stands for), not its JSON
// encoding with quotes and escapes; anything else its JSON.
func size(raw json.RawMessage, b64 bool) int {
	var s string
	if json.Unmarshal(raw, &s) != nil {
		return len(strings.TrimSpace(string(raw)))
	}
	if b64 {
		if b, err := base64.StdEncoding.DecodeString(s); err == nil {
			return len(b)
		}
	}
	return len(s)
}

func summarizeValue(key string, raw json.RawMessage, b64 bool) string {
	if key == "env" {
		// Environment variables: the names (what was set or unset matters
		// to whoever reads the log), never the values.
		var vars map[string]json.RawMessage
		if json.Unmarshal(raw, &vars) == nil && vars != nil {
			names := make([]string, 0, len(vars))
			n := 0
			for k, v := range vars {
				names = append(names, quote(bounded(k, 64)))
				if strings.TrimSpace(string(v)) != "null" { // null unsets
					n += size(v, false)
				}
			}
			sort.Strings(names)
			return fmt.Sprintf("names[%s] <values redacted, %d bytes>", strings.Join(names, ","), n)
		}
	}
	var argv []string
	isArgv := key == "args" && json.Unmarshal(raw, &argv) == nil && argv != nil
	if !isArgv {
		for _, s := range secretKeys {
			if strings.Contains(key, s) {
				return fmt.Sprintf("<%d bytes>", size(raw, b64 && key == "content"))
			}
		}
	}
	var s string
	if isArgv {
		// A process's arguments (start_process: E2B's commands.run sends
		// bash -l -c COMMAND) say what ran, as code and commands do: one
		// line, bounded, tokens redacted.
		s = strings.Join(argv, " ")
		key = "command"
	} else if err := json.Unmarshal(raw, &s); err != nil {
		// numbers, booleans, null: short and harmless; objects and arrays
		// only by size (a token inside one is never shown).
		if t := strings.TrimSpace(string(raw)); len(t) > 0 && (t[0] == '{' || t[0] == '[') {
			return fmt.Sprintf("<%d bytes>", len(raw))
		}
		return bounded(string(raw), 32)
	}
	// A whole bearer token pasted where its id was asked for (revoke_token),
	// or into code or a command: its id stays, its secret never does.
	s = RedactTokens(s)
	for _, c := range codeKeys {
		if key == c {
			first, _, more := strings.Cut(s, "\n")
			out := bounded(first, 80)
			if more || len(first) > 80 {
				out += fmt.Sprintf(" …(%d bytes)", len(s))
			}
			return quote(out)
		}
	}
	return quote(bounded(s, 120))
}

// quote makes s one double-quoted line: quotes, backslashes and control
// characters escaped, but <, > and & as written (json.Marshal's HTML
// escapes would show `a \u003e b` for `a > b`).
func quote(s string) string {
	var b strings.Builder
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(s) // a string into a strings.Builder: it cannot fail
	return strings.TrimSuffix(b.String(), "\n")
}

// bounded cuts s to at most n bytes on a rune boundary, marking the cut.
func bounded(s string, n int) string {
	if len(s) <= n {
		return s
	}
	cut := n
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}
