package store

import (
	"maps"
	"slices"
	"sync"
	"time"
)

// The Store serves the rows every call reads — its token, its session by
// id and by name, settings such as the tenant's default session and
// ceilings — from memory, so that a warm call reads no SQLite. The cache
// is dropped whenever the generation (gen.go) moved: every change to those
// tables, by this process or any other on the same file, bumps it after
// its commit.
//
// The races, and why each is safe:
//
//   - A reader loads the generation BEFORE it looks at the cache or queries
//     SQLite, and tags what it puts in the cache with the epoch it saw; the
//     put is dropped when the cache was emptied since. So a row read before
//     a writer's commit can land in the cache only in an epoch that began
//     before the writer's bump, and the first reader that loads the bumped
//     generation empties that epoch. Whoever starts a request after a
//     revoke (or destroy, rename, setting change) has returned therefore
//     sees it: the writer bumped before returning.
//   - A reader that loaded an older generation than the cache has already
//     seen (it was overtaken) uses the current epoch: its query runs after
//     it took the lock, so after whoever saw the newer generation, so after
//     that commit.
//   - A writer that dies between its commit and its bump, or a change made
//     with something other than quro (the sqlite3 shell): the generation
//     does not move, so the cache is also emptied every cacheMaxAge
//     whatever the generation says. That bounds the staleness in those
//     cases (and only those) to cacheMaxAge.
//   - A request that runs concurrently with a revoke may still be let in
//     (it started before the revoke finished); no request that starts after
//     it is.
//
// last_used_at changes (TouchSession, TouchToken) do not bump the
// generation: nothing authenticates or resolves by them. A touch in this
// process updates its cached row; other processes' caches see the new time
// within cacheMaxAge.

// cacheMaxAge bounds how long the cache is used without rereading SQLite
// (see above). A variable for the tests that must tell the generation's
// work from this bound's.
var cacheMaxAge = time.Second

// cacheMaxRows empties the cache when it holds this many rows of one kind,
// so that it stays bounded whatever is looked up.
const cacheMaxRows = 10000

type nameKey struct{ tenant, name string }

type settingVal struct {
	v     string
	found bool
}

type cache struct {
	gen *generation

	mu       sync.Mutex
	seen     uint64 // the newest generation seen
	epoch    uint64 // incremented each time the contents are dropped
	until    time.Time
	sessions map[string]*Session
	names    map[nameKey]string // → session id
	tokens   map[string]*Token
	settings map[string]settingVal
}

// enter locks the cache (the caller unlocks c.mu) after emptying it when
// the generation moved or the contents are too old, and returns the epoch
// to tag rows read from SQLite with (put only keeps them if no emptying
// happened in between).
func (c *cache) enter() uint64 {
	g := c.gen.load() // first: before the cache is read or SQLite queried
	now := time.Now()
	c.mu.Lock()
	if g > c.seen || !now.Before(c.until) || c.sessions == nil {
		c.seen = max(c.seen, g)
		c.epoch++
		c.until = now.Add(cacheMaxAge)
		c.sessions = map[string]*Session{}
		c.names = map[nameKey]string{}
		c.tokens = map[string]*Token{}
		c.settings = map[string]settingVal{}
	}
	return c.epoch
}

func cloneSession(s *Session) *Session {
	c := *s
	c.Env = maps.Clone(s.Env)
	c.Metadata = maps.Clone(s.Metadata)
	return &c
}

func cloneToken(t *Token) *Token {
	c := *t
	c.Scopes = slices.Clone(t.Scopes)
	return &c
}

func (c *cache) sessionByID(id string) (*Session, uint64) {
	e := c.enter()
	defer c.mu.Unlock()
	if s := c.sessions[id]; s != nil {
		return cloneSession(s), e
	}
	return nil, e
}

func (c *cache) sessionByName(tenant, name string) (*Session, uint64) {
	e := c.enter()
	defer c.mu.Unlock()
	if s := c.sessions[c.names[nameKey{tenant, name}]]; s != nil {
		return cloneSession(s), e
	}
	return nil, e
}

func (c *cache) putSession(e uint64, s *Session) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.epoch != e || len(c.sessions) >= cacheMaxRows {
		return
	}
	c.sessions[s.ID] = cloneSession(s)
	c.names[nameKey{s.Tenant, s.Name}] = s.ID
}

// touched records a session's new last use in the cached row.
func (c *cache) touched(id string, at time.Time) {
	c.mu.Lock()
	if s := c.sessions[id]; s != nil {
		s.LastUsedAt = at
	}
	c.mu.Unlock()
}

func (c *cache) token(id string) (*Token, uint64) {
	e := c.enter()
	defer c.mu.Unlock()
	if t := c.tokens[id]; t != nil {
		return cloneToken(t), e
	}
	return nil, e
}

func (c *cache) putToken(e uint64, t *Token) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.epoch == e && len(c.tokens) < cacheMaxRows {
		c.tokens[t.ID] = cloneToken(t)
	}
}

func (c *cache) setting(key string) (settingVal, bool, uint64) {
	e := c.enter()
	defer c.mu.Unlock()
	v, ok := c.settings[key]
	return v, ok, e
}

func (c *cache) putSetting(e uint64, key string, v settingVal) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.epoch == e && len(c.settings) < cacheMaxRows {
		c.settings[key] = v
	}
}
