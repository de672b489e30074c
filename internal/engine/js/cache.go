package js

import (
	clist "container/list"
	"context"
	"crypto/sha256"
	"errors"
	"sync"
)

// transpileCache keeps esbuild's results by a SHA-256 of what decides them:
// the source, the file name (it is in the error messages) and the loader
// (TypeScript or JavaScript); every other option is fixed. The tenant is
// in the key too: a hit answers in a fraction of a miss's time (esbuild's
// round trip to its child), so a cache shared by tenants would tell one,
// by timing its own run, whether another had run the exact same source. An agent runs the
// same snippet, or requires the same module, again and again, and a
// transpile costs more than the rest of a small run. A source esbuild
// refuses is cached too, as its diagnostics, so a cached error reads the
// same every time. Both are immutable once made, so runs share them.
//
// The cache is an LRU bounded by bytes (Options.TranspileCache): the
// source, the output and the source map counted for each entry; an entry
// larger than an eighth of the cap is not kept.
type transpileCache struct {
	limit int64

	mu    sync.Mutex
	bytes int64
	lru   *clist.List // of *cacheEntry, most recent first
	byKey map[[sha256.Size]byte]*clist.Element
}

type cacheEntry struct {
	key  [sha256.Size]byte
	t    *transpiled
	err  *transpileError
	size int64
}

func newTranspileCache(limit int64) *transpileCache {
	return &transpileCache{limit: limit, lru: clist.New(), byKey: map[[sha256.Size]byte]*clist.Element{}}
}

func cacheKey(tenant, src, file string, ts bool) [sha256.Size]byte {
	h := sha256.New()
	if ts {
		h.Write([]byte{1})
	} else {
		h.Write([]byte{0})
	}
	// The tenant's and the file name's lengths first, so that no
	// (tenant, file, src) triple can be shifted into another.
	for _, s := range []string{tenant, file} {
		n := len(s)
		h.Write([]byte{byte(n >> 24), byte(n >> 16), byte(n >> 8), byte(n)})
		h.Write([]byte(s))
	}
	h.Write([]byte(src))
	var k [sha256.Size]byte
	h.Sum(k[:0])
	return k
}

// transpile is the package's transpile through the cache, for a run of
// tenant's.
func (c *transpileCache) transpile(ctx context.Context, tenant, src, file string, ts bool) (*transpiled, error) {
	if c.limit <= 0 {
		return transpile(ctx, src, file, ts)
	}
	key := cacheKey(tenant, src, file, ts)
	c.mu.Lock()
	if el, ok := c.byKey[key]; ok {
		c.lru.MoveToFront(el)
		e := el.Value.(*cacheEntry)
		c.mu.Unlock()
		if e.err != nil {
			return nil, e.err
		}
		return e.t, nil
	}
	c.mu.Unlock()

	t, err := transpile(ctx, src, file, ts)
	e := &cacheEntry{key: key, t: t}
	var te *transpileError
	switch {
	case err == nil:
		e.size = int64(len(src) + len(t.code) + t.sm.size())
	case errors.As(err, &te):
		e.err = te
		e.size = int64(len(src) + len(te.Error()))
	default:
		return nil, err // not esbuild's verdict on the source: not kept
	}
	c.add(e)
	return t, err
}

func (c *transpileCache) add(e *cacheEntry) {
	e.size += 256 // the entry, its list element and map slot
	if e.size > c.limit/8 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.byKey[e.key]; ok {
		return // another run made it meanwhile
	}
	c.byKey[e.key] = c.lru.PushFront(e)
	c.bytes += e.size
	for c.bytes > c.limit {
		last := c.lru.Back()
		old := last.Value.(*cacheEntry)
		c.lru.Remove(last)
		delete(c.byKey, old.key)
		c.bytes -= old.size
	}
}

// size is about how much memory m holds.
func (m *sourceMap) size() int {
	n := 24 * len(m.lines)
	for _, l := range m.lines {
		n += 24 * len(l)
	}
	return n
}
