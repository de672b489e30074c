// Package store is Quro's embedded database: one SQLite file (pure Go,
// modernc.org/sqlite) holding sessions (with their tenant, uid, network,
// rootfs, env and cwd), retired session uids, bearer tokens (only a hash of
// each secret), the audit log, snapshots and settings (the default session,
// tenants' limits). Schema migrations in migrations/*.sql are applied in
// order on open, each in one transaction, tracked by PRAGMA user_version.
//
// A Store is safe for concurrent use, also by several quro processes on the
// same file (WAL journal, busy timeout).
package store

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	_ "modernc.org/sqlite" // registers the "sqlite" driver

	"github.com/quro-dev/quro/internal/flock"
)

//go:embed migrations/*.sql
var migrationFS embed.FS

// ErrNotFound is returned when a row does not exist.
var ErrNotFound = errors.New("not found")

// ErrExists is returned when a unique name is taken.
var ErrExists = errors.New("already exists")

// Store is the embedded database.
type Store struct {
	db    *sql.DB
	cache *cache // nil when the generation file could not be mapped: every read goes to SQLite

	conns  atomic.Int64 // SQLite connections opened
	stmts  atomic.Int64 // statements and transactions run, audit batches aside
	audits atomic.Int64 // audit batches written

	stmtMu   sync.Mutex
	prepared map[string]*sql.Stmt // prepared once: the queries of every run_code

	// writer is held by this process's one writer at a time (write):
	// concurrent writers queue here and are woken in turn, instead of
	// each meeting SQLite's lock and sleeping in its busy handler, whose
	// growing sleeps made a burst of 100 creates wait seconds for a
	// lock held for a millisecond. Other processes' writers still meet
	// the busy handler.
	writer chan struct{}
}

// write waits for this process's turn to write (or ctx's end) and
// returns its release.
func (s *Store) write(ctx context.Context) (release func(), err error) {
	select {
	case s.writer <- struct{}{}:
		return func() { <-s.writer }, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// Stats counts the Store's work since it was opened.
type Stats struct {
	ConnsOpened  int64 // SQLite connections opened (each applies the pragmas and parses the schema)
	Statements   int64 // statements and transactions run on SQLite, audit batches aside
	AuditBatches int64 // audit batches written (one transaction each, off the request path)
}

// Stats returns the counts so far.
func (s *Store) Stats() Stats {
	return Stats{ConnsOpened: s.conns.Load(), Statements: s.stmts.Load(), AuditBatches: s.audits.Load()}
}

// bump tells every process sharing the file that sessions, tokens or
// settings changed (see cache.go): called after the change is committed,
// whatever the outcome (an extra bump only costs a cache refill).
func (s *Store) bump() {
	if s.cache != nil {
		s.cache.gen.bump()
	}
}

func (s *Store) exec(ctx context.Context, q string, args ...any) (sql.Result, error) {
	s.stmts.Add(1)
	release, err := s.write(ctx)
	if err != nil {
		return nil, err
	}
	defer release()
	return s.db.ExecContext(ctx, q, args...)
}

func (s *Store) query(ctx context.Context, q string, args ...any) (*sql.Rows, error) {
	s.stmts.Add(1)
	return s.db.QueryContext(ctx, q, args...)
}

func (s *Store) queryRow(ctx context.Context, q string, args ...any) *sql.Row {
	s.stmts.Add(1)
	return s.db.QueryRowContext(ctx, q, args...)
}

// connector opens SQLite connections through the registered driver,
// counting them.
type connector struct {
	drv driver.Driver
	dsn string
	n   *atomic.Int64
}

func (c connector) Connect(context.Context) (driver.Conn, error) {
	c.n.Add(1)
	return c.drv.Open(c.dsn)
}

func (c connector) Driver() driver.Driver { return c.drv }

// MaxIdleConns is how many SQLite connections the pool keeps open between
// uses. database/sql's default of 2 made a busy server open (pragmas and
// schema parse included) a new connection every few requests; connections
// are never retired for age or idleness either.
const MaxIdleConns = 16

// stmt returns q prepared (once per Store; database/sql re-prepares it on
// each connection as needed). Preparing costs SQLite a parse that is most
// of a small query's time.
func (s *Store) stmt(ctx context.Context, q string) (*sql.Stmt, error) {
	s.stmts.Add(1) // each caller runs it once
	return s.prepare(ctx, q)
}

// prepare is stmt without the count.
func (s *Store) prepare(ctx context.Context, q string) (*sql.Stmt, error) {
	s.stmtMu.Lock()
	defer s.stmtMu.Unlock()
	if st := s.prepared[q]; st != nil {
		return st, nil
	}
	st, err := s.db.PrepareContext(ctx, q)
	if err != nil {
		return nil, err
	}
	if s.prepared == nil {
		s.prepared = map[string]*sql.Stmt{}
	}
	s.prepared[q] = st
	return st, nil
}

// Open opens (creating if needed) the database at file and migrates it.
//
// The database and its -wal and -shm files are private to the server
// (0600): they hold token hashes, the audit log and every session's
// variables. SQLite gives the -wal and -shm files the mode of the database
// file, which is made (or corrected to) 0600 before SQLite opens it.
func Open(ctx context.Context, file string) (*Store, error) {
	if err := privateFiles(file); err != nil {
		return nil, fmt.Errorf("store: %w", err)
	}
	dsn := "file:" + file + "?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)&_pragma=foreign_keys(1)&_pragma=synchronous(NORMAL)&_txlock=immediate"
	// The pragmas are in the DSN: applied once, when a connection opens.
	reg, err := sql.Open("sqlite", dsn)
	if err != nil {
		return nil, fmt.Errorf("store: open %s: %w", file, err)
	}
	drv := reg.Driver()
	reg.Close()
	s := &Store{writer: make(chan struct{}, 1)}
	db := sql.OpenDB(connector{drv: drv, dsn: dsn, n: &s.conns})
	db.SetMaxIdleConns(MaxIdleConns)
	db.SetConnMaxIdleTime(0)
	db.SetConnMaxLifetime(0)
	s.db = db
	if gen, err := openGeneration(file + "-gen"); err == nil {
		s.cache = &cache{gen: gen}
	} else {
		// Correct without it, only slower: every read queries SQLite.
		fmt.Fprintf(os.Stderr, "store: %s: no cache: %v\n", file, err)
	}
	// Opening is serialised across processes: switching a new file to WAL
	// and migrating it can meet SQLITE_BUSY without the busy handler being
	// asked when two quro processes (or goroutines) open it at once.
	unlock, err := flock.Lock(file+".lock", nil)
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("store: %w", err)
	}
	defer unlock()
	if err := db.PingContext(ctx); err != nil {
		db.Close()
		return nil, fmt.Errorf("store: open %s: %w", file, err)
	}
	migrated, err := s.migrate(ctx)
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("store: %s: %w", file, err)
	}
	if migrated {
		s.bump() // a migration may have changed rows other processes cached
	}
	return s, nil
}

// privateFiles creates file if needed and makes it and its SQLite
// companions owner-only.
func privateFiles(file string) error {
	f, err := os.OpenFile(file, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return err
	}
	f.Close()
	for _, p := range []string{file, file + "-wal", file + "-shm", file + "-journal", file + "-gen"} {
		if err := os.Chmod(p, 0o600); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}
	return nil
}

// Close closes the database.
func (s *Store) Close() error {
	s.stmtMu.Lock()
	for _, st := range s.prepared {
		st.Close()
	}
	s.prepared = nil
	s.stmtMu.Unlock()
	return s.db.Close()
}

// migrate applies every embedded migration newer than the file's
// user_version, each in its own transaction together with the version bump,
// and reports whether it applied any. (Each quro command opens the store:
// one that migrated nothing must not empty a running server's cache.)
func (s *Store) migrate(ctx context.Context) (migrated bool, err error) {
	names, err := fs.Glob(migrationFS, "migrations/*.sql")
	if err != nil {
		return false, err
	}
	sort.Strings(names)
	for _, name := range names {
		num, _, _ := strings.Cut(path.Base(name), "_")
		version, err := strconv.Atoi(num)
		if err != nil {
			return migrated, fmt.Errorf("migration %s: bad name", name)
		}
		body, err := migrationFS.ReadFile(name)
		if err != nil {
			return migrated, err
		}
		applied, err := s.applyMigration(ctx, version, string(body))
		if err != nil {
			return migrated, fmt.Errorf("migration %s: %w", name, err)
		}
		migrated = migrated || applied
	}
	return migrated, nil
}

func (s *Store) applyMigration(ctx context.Context, version int, body string) (applied bool, err error) {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return false, err
	}
	defer tx.Rollback()
	var current int
	if err := tx.QueryRowContext(ctx, "PRAGMA user_version").Scan(&current); err != nil {
		return false, err
	}
	if current >= version {
		return false, nil
	}
	if current != version-1 {
		return false, fmt.Errorf("database is at schema %d, cannot apply %d", current, version)
	}
	if _, err := tx.ExecContext(ctx, body); err != nil {
		return false, err
	}
	if _, err := tx.ExecContext(ctx, fmt.Sprintf("PRAGMA user_version = %d", version)); err != nil {
		return false, err
	}
	return true, tx.Commit()
}

// SchemaVersion reports the applied schema version.
func (s *Store) SchemaVersion(ctx context.Context) (int, error) {
	var v int
	err := s.queryRow(ctx, "PRAGMA user_version").Scan(&v)
	return v, err
}

// Session is a session row.
type Session struct {
	ID         string
	Name       string
	Tenant     string
	CreatedAt  time.Time
	LastUsedAt time.Time
	Cwd        string
	Env        map[string]string
	Network    string
	Rootfs     string
	// UID is the session's host uid, unique among sessions and retired
	// uids (see AllocUID); 0 only for a schema-2 row not yet given one.
	UID int
	// Metadata is the caller's labels of the session (nil: none).
	Metadata map[string]string
	// ExpiresAt ends the session's lifetime (zero: it has none).
	ExpiresAt time.Time
	// OnExpiry is what happens then: "" (destroy) or "pause".
	OnExpiry string
	// Paused: the session was paused and not resumed or used since.
	Paused bool
	// NetRules are the session's egress rules, as the session package
	// encodes them ("" for none).
	NetRules string
}

const sessionCols = "id, name, tenant, created_at, last_used_at, cwd, env, network, rootfs, coalesce(uid, 0), metadata, expires_at, on_expiry, paused, net_rules"

// unixMilli is t in unix milliseconds, 0 for the zero time.
func unixMilli(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixMilli()
}

// fromMilli is the inverse of unixMilli.
func fromMilli(ms int64) time.Time {
	if ms == 0 {
		return time.Time{}
	}
	return time.UnixMilli(ms)
}

// jsonObject encodes m as a JSON object ({} for nil).
func jsonObject(m map[string]string) (string, error) {
	if m == nil {
		return "{}", nil
	}
	b, err := json.Marshal(m)
	return string(b), err
}

func scanSession(row interface{ Scan(...any) error }) (*Session, error) {
	var (
		s             Session
		created, used int64
		env, meta     string
		expires       int64
	)
	if err := row.Scan(&s.ID, &s.Name, &s.Tenant, &created, &used, &s.Cwd, &env, &s.Network, &s.Rootfs, &s.UID,
		&meta, &expires, &s.OnExpiry, &s.Paused, &s.NetRules); err != nil {
		if errors.Is(err, sql.ErrNoRows) {
			return nil, ErrNotFound
		}
		return nil, err
	}
	s.CreatedAt = time.UnixMilli(created)
	s.LastUsedAt = time.UnixMilli(used)
	if err := json.Unmarshal([]byte(env), &s.Env); err != nil {
		return nil, fmt.Errorf("session %s: bad env: %w", s.ID, err)
	}
	if err := json.Unmarshal([]byte(meta), &s.Metadata); err != nil {
		return nil, fmt.Errorf("session %s: bad metadata: %w", s.ID, err)
	}
	if len(s.Metadata) == 0 {
		s.Metadata = nil
	}
	s.ExpiresAt = fromMilli(expires)
	return &s, nil
}

// CreateSession inserts a session and allocates its uid, in one
// transaction: sess.UID is set to a uid no other session has and no
// destroyed session still holds (see AllocUID). A taken name gives
// ErrExists.
func (s *Store) CreateSession(ctx context.Context, sess *Session) error {
	return s.CreateSessionWithin(ctx, sess, nil)
}

// CreateSessionWithin is CreateSession under caps, checked in the same
// transaction as the insert (a *CapError when one is met).
func (s *Store) CreateSessionWithin(ctx context.Context, sess *Session, caps *Caps) error {
	env, err := json.Marshal(sess.Env)
	if err != nil {
		return err
	}
	if sess.Env == nil {
		env = []byte("{}")
	}
	meta, err := jsonObject(sess.Metadata)
	if err != nil {
		return err
	}
	// A uid taken between the check and the insert cannot happen inside the
	// (immediate) transaction, but the UNIQUE constraint is the last word:
	// on a uid conflict the allocation is tried again.
	defer s.bump() // a cached name lookup that missed must now find it
	for range 3 {
		err = s.inTx(ctx, func(tx *sql.Tx) error {
			if err := checkCaps(ctx, tx, sess.Tenant, caps); err != nil {
				return err
			}
			uid, err := allocUID(ctx, tx)
			if err != nil {
				return err
			}
			_, err = tx.ExecContext(ctx, "INSERT INTO sessions (id, name, tenant, created_at, last_used_at, cwd, env, network, rootfs, uid, metadata, expires_at, on_expiry, net_rules) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
				sess.ID, sess.Name, sess.Tenant, sess.CreatedAt.UnixMilli(), sess.LastUsedAt.UnixMilli(),
				sess.Cwd, string(env), sess.Network, sess.Rootfs, uid, meta, unixMilli(sess.ExpiresAt), sess.OnExpiry, sess.NetRules)
			if err == nil {
				sess.UID = uid
			}
			return err
		})
		if err == nil || !strings.Contains(err.Error(), "UNIQUE constraint failed: sessions.uid") {
			break
		}
	}
	if err != nil && strings.Contains(err.Error(), "UNIQUE constraint failed: sessions.tenant") {
		return fmt.Errorf("session %q: %w", sess.Name, ErrExists)
	}
	return err
}

// inTx runs f in a transaction, committed when f returns nil.
func (s *Store) inTx(ctx context.Context, f func(*sql.Tx) error) error {
	s.stmts.Add(1)
	release, err := s.write(ctx)
	if err != nil {
		return err
	}
	defer release()
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if err := f(tx); err != nil {
		return err
	}
	return tx.Commit()
}

// SessionByID returns the session with id.
// From memory when cached (see cache.go).
func (s *Store) SessionByID(ctx context.Context, id string) (*Session, error) {
	var epoch uint64
	if s.cache != nil {
		var hit *Session
		if hit, epoch = s.cache.sessionByID(id); hit != nil {
			return hit, nil
		}
	}
	st, err := s.stmt(ctx, "SELECT "+sessionCols+" FROM sessions WHERE id = ?")
	if err != nil {
		return nil, err
	}
	row, err := scanSession(st.QueryRowContext(ctx, id))
	if err == nil && s.cache != nil {
		s.cache.putSession(epoch, row)
	}
	return row, err
}

// SessionByName returns tenant's session called name.
// From memory when cached (see cache.go).
func (s *Store) SessionByName(ctx context.Context, tenant, name string) (*Session, error) {
	var epoch uint64
	if s.cache != nil {
		var hit *Session
		if hit, epoch = s.cache.sessionByName(tenant, name); hit != nil {
			return hit, nil
		}
	}
	st, err := s.stmt(ctx, "SELECT "+sessionCols+" FROM sessions WHERE tenant = ? AND name = ?")
	if err != nil {
		return nil, err
	}
	row, err := scanSession(st.QueryRowContext(ctx, tenant, name))
	if err == nil && s.cache != nil {
		s.cache.putSession(epoch, row)
	}
	return row, err
}

// Sessions lists tenant's sessions, oldest first.
func (s *Store) Sessions(ctx context.Context, tenant string) ([]*Session, error) {
	return s.sessionRows(ctx, "SELECT "+sessionCols+" FROM sessions WHERE tenant = ? ORDER BY created_at, name", tenant)
}

// AllSessions lists every tenant's sessions, by tenant, each tenant's
// oldest first (the operator's view across tenants).
func (s *Store) AllSessions(ctx context.Context) ([]*Session, error) {
	return s.sessionRows(ctx, "SELECT "+sessionCols+" FROM sessions ORDER BY tenant, created_at, name")
}

// sessionRows runs a query of sessionCols and scans every row.
func (s *Store) sessionRows(ctx context.Context, query string, args ...any) ([]*Session, error) {
	rows, err := s.query(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []*Session
	for rows.Next() {
		sess, err := scanSession(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, sess)
	}
	return out, rows.Err()
}

// CountSessions returns the number of tenant's sessions.
func (s *Store) CountSessions(ctx context.Context, tenant string) (int, error) {
	var n int
	err := s.queryRow(ctx, "SELECT count(*) FROM sessions WHERE tenant = ?", tenant).Scan(&n)
	return n, err
}

// CountAllSessions returns the number of sessions of every tenant.
func (s *Store) CountAllSessions(ctx context.Context) (int, error) {
	var n int
	err := s.queryRow(ctx, "SELECT count(*) FROM sessions").Scan(&n)
	return n, err
}

// AllSessionIDs lists the ids of every tenant's sessions.
func (s *Store) AllSessionIDs(ctx context.Context) ([]string, error) {
	rows, err := s.query(ctx, "SELECT id FROM sessions")
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			return nil, err
		}
		out = append(out, id)
	}
	return out, rows.Err()
}

// SessionOwners maps the id of every session (of every tenant, spares
// too) to its tenant, in one query.
func (s *Store) SessionOwners(ctx context.Context) (map[string]string, error) {
	rows, err := s.query(ctx, "SELECT id, tenant FROM sessions")
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string]string{}
	for rows.Next() {
		var id, tenant string
		if err := rows.Scan(&id, &tenant); err != nil {
			return nil, err
		}
		out[id] = tenant
	}
	return out, rows.Err()
}

// TouchSession records a use of the session.
func (s *Store) TouchSession(ctx context.Context, id string, at time.Time) error {
	st, err := s.stmt(ctx, "UPDATE sessions SET last_used_at = ? WHERE id = ?")
	if err != nil {
		return err
	}
	release, err := s.write(ctx)
	if err != nil {
		return err
	}
	defer release()
	res, err := st.ExecContext(ctx, at.UnixMilli(), id)
	if err != nil {
		return err
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return ErrNotFound
	}
	if s.cache != nil {
		s.cache.touched(id, at) // no bump: nothing is found by its last use
	}
	return nil
}

// DeleteSession removes the session row and, in the same transaction,
// reserves its uid in retired_uids: no new session gets the uid until
// ReleaseUID says every process and file of this one is gone. It returns
// the uid (0 for a row that had none).
func (s *Store) DeleteSession(ctx context.Context, id string) (uid int, err error) {
	defer s.bump()
	err = s.inTx(ctx, func(tx *sql.Tx) error {
		var u sql.NullInt64
		if err := tx.QueryRowContext(ctx, "SELECT uid FROM sessions WHERE id = ?", id).Scan(&u); err != nil {
			if errors.Is(err, sql.ErrNoRows) {
				return ErrNotFound
			}
			return err
		}
		if u.Valid {
			if _, err := tx.ExecContext(ctx, "INSERT OR REPLACE INTO retired_uids (uid, session_id, retired_at) VALUES (?, ?, ?)",
				u.Int64, id, time.Now().UnixMilli()); err != nil {
				return err
			}
			uid = int(u.Int64)
		}
		if _, err := tx.ExecContext(ctx, "DELETE FROM uid_handovers WHERE session_id = ?", id); err != nil {
			return err
		}
		_, err := tx.ExecContext(ctx, "DELETE FROM sessions WHERE id = ?", id)
		return err
	})
	return uid, err
}

// Setting returns a setting, or ErrNotFound.
// From memory when cached (see cache.go), an absent one too.
func (s *Store) Setting(ctx context.Context, key string) (string, error) {
	var epoch uint64
	if s.cache != nil {
		var (
			hit settingVal
			ok  bool
		)
		if hit, ok, epoch = s.cache.setting(key); ok {
			if !hit.found {
				return "", ErrNotFound
			}
			return hit.v, nil
		}
	}
	var v string
	st, err := s.stmt(ctx, "SELECT value FROM settings WHERE key = ?")
	if err != nil {
		return "", err
	}
	err = st.QueryRowContext(ctx, key).Scan(&v)
	if errors.Is(err, sql.ErrNoRows) {
		if s.cache != nil {
			s.cache.putSetting(epoch, key, settingVal{})
		}
		return "", ErrNotFound
	}
	if err == nil && s.cache != nil {
		s.cache.putSetting(epoch, key, settingVal{v: v, found: true})
	}
	return v, err
}

// SetSetting stores a setting.
func (s *Store) SetSetting(ctx context.Context, key, value string) error {
	defer s.bump()
	_, err := s.exec(ctx, "INSERT INTO settings (key, value) VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET value = excluded.value", key, value)
	return err
}

// SetSessionCwd records the session shell's working directory.
//
// A terminal reports its directory after every command, mostly unchanged:
// when the cached row (current, see cache.go) already has cwd, nothing is
// written, and the caches of every process stay warm.
func (s *Store) SetSessionCwd(ctx context.Context, id, cwd string) error {
	if s.cache != nil {
		if row, _ := s.cache.sessionByID(id); row != nil && row.Cwd == cwd {
			return nil
		}
	}
	return s.updateSession(ctx, "UPDATE sessions SET cwd = ? WHERE id = ?", cwd, id)
}

// SetSessionEnv replaces the session's variables.
func (s *Store) SetSessionEnv(ctx context.Context, id string, env map[string]string) error {
	if env == nil {
		env = map[string]string{}
	}
	b, err := json.Marshal(env)
	if err != nil {
		return err
	}
	return s.updateSession(ctx, "UPDATE sessions SET env = ? WHERE id = ?", string(b), id)
}

// SetSessionPolicy records the session's network policy and rootfs.
func (s *Store) SetSessionPolicy(ctx context.Context, id, network, rootfs string) error {
	return s.updateSession(ctx, "UPDATE sessions SET network = ?, rootfs = ? WHERE id = ?", network, rootfs, id)
}

func (s *Store) updateSession(ctx context.Context, q string, args ...any) error {
	defer s.bump()
	res, err := s.exec(ctx, q, args...)
	if err != nil {
		return err
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return ErrNotFound
	}
	return nil
}
