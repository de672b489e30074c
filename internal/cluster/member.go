package cluster

import (
	"bufio"
	"cmp"
	"context"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
)

// LocalSession is a session this node holds, as its records need it.
type LocalSession struct {
	ID, Tenant, Name, Network, Rootfs string
	Created                           time.Time
}

// Member keeps this node's part of the cluster's state true: a record
// (owner: this node) for each session it holds, none for a session it no
// longer holds, and its Lease with its headroom. A node that restarts
// finds its sessions in its data directory and its records in the API
// server, with alive=false until a call revives them.
type Member struct {
	C           *Cluster
	List        func(ctx context.Context) ([]LocalSession, error)
	MaxSessions int // this node's session cap (0: none), published as headroom
	// SessionReserve is the memory this node reserves per session in
	// its published headroom (0: DefaultSessionReserve).
	SessionReserve int64
	// MovedAway, when set, releases a session this node holds whose
	// record the API server gives to another node: a move (quro node
	// drain) switched its owner, and this node stopped before it let its
	// copy go. Without it such a session is left alone.
	MovedAway func(ctx context.Context, id string) error

	mu  sync.Mutex // one write of the records at a time
	lmu sync.Mutex // one renewal of the Lease at a time
	// due is signalled when records were created without their status
	// (SyncRecords): Run writes it at once, after the answer.
	due      chan struct{}
	dueOnce  sync.Once
	amu      sync.Mutex
	alive    map[string]bool // sessions a call used since this node started
	held     map[string]bool // sessions a move holds: Sync leaves their records alone (Hold)
	draining bool            // published in the Lease: no new session here
}

// Hold makes Sync leave session id's record alone while a move of it in
// or out of this node runs; the move's end calls the function returned.
func (m *Member) Hold(id string) (unhold func()) {
	m.amu.Lock()
	defer m.amu.Unlock()
	if m.held == nil {
		m.held = map[string]bool{}
	}
	m.held[id] = true
	return func() {
		m.amu.Lock()
		defer m.amu.Unlock()
		delete(m.held, id)
	}
}

func (m *Member) isHeld(id string) bool {
	m.amu.Lock()
	defer m.amu.Unlock()
	return m.held[id]
}

// SetDraining publishes that this node takes no new session (its Lease
// says so at the next Sync, which the caller runs).
func (m *Member) SetDraining(on bool) {
	m.amu.Lock()
	defer m.amu.Unlock()
	m.draining = on
	m.C.draining.Store(on)
}

// Draining reports whether this node is being drained.
func (m *Member) Draining() bool {
	m.amu.Lock()
	defer m.amu.Unlock()
	return m.draining
}

// Used marks a session alive: a call reached it on this node. The record
// says so at the next Sync.
func (m *Member) Used(id string) {
	m.amu.Lock()
	defer m.amu.Unlock()
	if m.alive == nil {
		m.alive = map[string]bool{}
	}
	m.alive[id] = true
}

func (m *Member) isAlive(id string) bool {
	m.amu.Lock()
	defer m.amu.Unlock()
	return m.alive[id]
}

// Sync writes what differs between this node's sessions and their
// records, then renews the Lease.
func (m *Member) Sync(ctx context.Context) error {
	n, err := m.syncRecords(ctx, false)
	if err != nil && n < 0 {
		return err
	}
	if herr := m.heartbeat(ctx, n); err == nil {
		err = herr
	}
	return err
}

// SyncRecords is what a create or destroy waits for before it answers
// (Router.Changed): what another node needs to route a call, each new
// session's record naming this node, and no record of a session this
// node no longer holds. A new record's status (alive, phase: nothing
// routes by it) is a write of its own, made by Run at once after the
// answer, and so is an older record's whose status alone is behind (a
// session a call used: Run's next Sync); the Lease's count waits for the
// next Sync (another node counts this node's sessions by their records
// as well, Nodes).
func (m *Member) SyncRecords(ctx context.Context) error {
	_, err := m.syncRecords(ctx, true)
	return err
}

// statusDue wakes Run to write the status of records SyncRecords made.
func (m *Member) statusDue() chan struct{} {
	m.dueOnce.Do(func() { m.due = make(chan struct{}, 1) })
	return m.due
}

// syncRecords writes what differs between this node's sessions and their
// records and returns how many sessions it holds (-1: its list failed).
// With specOnly, a record it creates gets no status yet (statusDue).
func (m *Member) syncRecords(ctx context.Context, specOnly bool) (int, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	local, err := m.List(ctx)
	if err != nil {
		return -1, err
	}
	self := m.C.Self()
	held := make(map[string]bool, len(local))
	for _, ls := range local {
		held[ls.ID] = true
	}
	m.amu.Lock()
	for id := range m.alive {
		if !held[id] {
			delete(m.alive, id) // destroyed, or moved away
		}
	}
	m.amu.Unlock()
	var firstErr error
	for _, ls := range local {
		if m.isHeld(ls.ID) {
			continue // a move's: it writes the record
		}
		if away, err := m.movedAway(ctx, ls.ID); err != nil || away {
			if err != nil && firstErr == nil {
				firstErr = err
			}
			continue
		}
		want := &Session{Spec: SessionSpec{Node: self, Tenant: ls.Tenant, Name: ls.Name, Network: ls.Network,
			Rootfs: ls.Rootfs, Created: ls.Created.UTC().Format(time.RFC3339)},
			Status: SessionStatus{Alive: m.isAlive(ls.ID), Node: self, Phase: PhaseReady}}
		want.Name = ls.ID
		// What routes a call is the spec and its labels: a create's
		// answer (specOnly) does not wait for the status of sessions
		// that calls used since the last Sync (alive), one read and one
		// write each; Run writes them.
		if have, ok := m.C.cached(ls.ID); ok && have.Spec == want.Spec && labeled(have) && (specOnly || have.Status == want.Status) {
			continue
		}
		due, err := m.C.record(ctx, want, specOnly)
		if err != nil && firstErr == nil {
			firstErr = err
		}
		if due {
			select {
			case m.statusDue() <- struct{}{}:
			default: // due already
			}
		}
	}
	for _, s := range m.C.Owned(self) {
		if !held[s.Name] && !m.isHeld(s.Name) {
			if err := m.C.Forget(ctx, s.Name, self); err != nil && firstErr == nil {
				firstErr = err
			}
		}
	}
	return len(local), firstErr
}

// heartbeat renews this node's Lease with its headroom, holding sessions
// sessions. Apart from the records' lock: a create's SyncRecords does not
// wait for a renewal.
func (m *Member) heartbeat(ctx context.Context, sessions int) error {
	m.lmu.Lock()
	defer m.lmu.Unlock()
	avail, total := memInfo()
	return m.C.Heartbeat(ctx, Node{Sessions: sessions, MaxSessions: m.MaxSessions, MemAvail: avail, MemTotal: total,
		SessionReserve: cmp.Or(m.SessionReserve, DefaultSessionReserve), Draining: m.Draining(), Probe: true})
}

// movedAway reports whether the local session id now belongs to another
// node (a move switched its owner; the informer's table is confirmed by
// a read of the API server, since a stale table must never cost a
// session its files), and if so releases this node's copy (MovedAway).
func (m *Member) movedAway(ctx context.Context, id string) (bool, error) {
	have, ok := m.C.cached(id)
	if !ok || have.Spec.Node == "" || have.Spec.Node == m.C.Self() || m.MovedAway == nil {
		return false, nil
	}
	cur, err := m.C.Get(ctx, id)
	if err != nil || cur == nil || cur.Spec.Node == "" || cur.Spec.Node == m.C.Self() {
		return false, err
	}
	m.C.log.Info("cluster: a session of this node moved to another; its copy here is released", "session", id, "owner", cur.Spec.Node)
	return true, m.MovedAway(ctx, id)
}

// Run syncs every interval until ctx ends (at least three times per
// Lease duration, so that a live node never looks dead).
func (m *Member) Run(ctx context.Context, interval time.Duration) {
	if max := m.C.opts.LeaseTTL / 3; interval <= 0 || interval > max {
		interval = max
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		if err := m.Sync(ctx); err != nil && ctx.Err() == nil {
			m.C.log.Warn("cluster: sync with the API server failed", "err", err)
		}
		if !m.wait(ctx, t.C) {
			return
		}
	}
}

// wait waits for tick, writing new records' status whenever SyncRecords
// made some without (statusDue); false when ctx ended.
func (m *Member) wait(ctx context.Context, tick <-chan time.Time) bool {
	due := m.statusDue()
	for {
		select {
		case <-ctx.Done():
			return false
		case <-tick:
			return true
		case <-due:
			if _, err := m.syncRecords(ctx, false); err != nil && ctx.Err() == nil {
				m.C.log.Warn("cluster: writing new sessions' status failed", "err", err)
			}
		}
	}
}

// memInfo is the machine's MemAvailable and MemTotal in bytes (0, 0 when
// unknown).
func memInfo() (avail, total int64) {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0, 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		n, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		if err != nil {
			continue
		}
		switch k {
		case "MemAvailable":
			avail = n * 1024
		case "MemTotal":
			total = n * 1024
		}
	}
	return avail, total
}
