package cluster

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/util/retry"

	"github.com/quro-dev/quro/internal/api/rest"
	"github.com/quro-dev/quro/internal/capability"
	"github.com/quro-dev/quro/internal/controller"
)

// Draining a node (quro node drain, the pod's preStop hook): the node
// stops taking new sessions (its Lease says draining, so Place skips it),
// then moves each session it owns, one at a time, to the first live node
// in placement's order (Rank: the most headroom first) that admits it:
//
//  0. ask the node whether it would admit the session (POST MovePath,
//     signed as a move is; the receiver checks the tenant's and its own
//     ceilings, Local.Admit): a node that refuses for room (429) or
//     cannot take it now (503) is passed over for the next, and the
//     session is not paused for a node that would refuse it;
//  1. quiesce it here: no call enters (503 with Retry-After through any
//     node), the calls in it are canceled and its box ends;
//  2. stream its settings and workspace (a tar) to the target's
//     MovePath, signed with the cluster's forwarding key for this
//     session, this node, the target, this moment and a nonce
//     (MoveSignature: good at the target only, and once); the target
//     checks the stream as hostile and adopts the session under its ID;
//  3. the target switches the record's owner to itself (SwitchOwner:
//     resourceVersion-checked, and only from the node that sent it), and
//     so does this node after the answer (a no-op when done);
//  4. this node lets its copy go through the session's one teardown.
//
// An import refused for room after all (the probe is advice: the
// receiver's room changed in between) passes on to the next node too,
// the session still quiesced. A session no node has room for stays here,
// usable, and the drain counts it apart (Result.NoRoom); a move that
// fails otherwise leaves it here as well, and is reported. Every step can be run again: a second drain, or one after
// a crash, finds the sessions still recorded as this node's and moves
// them; a copy left on either side by a crash is released by Member.Sync
// on the side the record does not name.

// MovePath is the route a node receives a session on; MoveHeader carries
// its signature.
const (
	MovePath   = "/cluster/v1/move/"
	MoveHeader = "Quro-Move"
	// DrainHeader names the drain a move belongs to (NewDrainID), for
	// the receiver's audit entry; a node of an earlier version sends
	// none.
	DrainHeader = "Quro-Drain"
	// MoveSkew is how far a move's signed time may be from the
	// receiver's clock.
	MoveSkew = 2 * time.Minute
	// ProbeHeader is on every answer a node gives to a drain's
	// admission probe (POST MovePath), a refusal's too: a 404 or 405
	// without it is a node's of an earlier version, which has no probe,
	// only when that node's Lease does not say it has one (AnnotProbe).
	ProbeHeader = "Quro-Move-Probe"
)

// MoveSignature is the MoveHeader of node from moving session id to
// node to at t: "FROM UNIXTIME NONCE SIGNATURE", an HMAC of the sender,
// the receiver, the session, the time and a fresh random nonce with the
// cluster's key. Bound to the receiver, a header captured on the pod
// network works at no other node; single-use (the receiver remembers its
// nonce for as long as its time is accepted, MoveReplays), it works
// there only once.
func MoveSignature(key []byte, from, to, id string, t time.Time) string {
	ts := strconv.FormatInt(t.Unix(), 10)
	var n [moveNonceSize]byte
	_, _ = rand.Read(n[:]) // crypto/rand.Read does not fail (it panics where it cannot)
	nonce := base64.RawURLEncoding.EncodeToString(n[:])
	return from + " " + ts + " " + nonce + " " + base64.RawURLEncoding.EncodeToString(moveMAC(key, from, to, id, ts, nonce))
}

const moveNonceSize = 16

func moveMAC(key []byte, from, to, id, ts, nonce string) []byte {
	m := hmac.New(sha256.New, key)
	m.Write([]byte("quro-move-v2\x00" + from + "\x00" + to + "\x00" + id + "\x00" + ts + "\x00" + nonce))
	return m.Sum(nil)
}

// NewDrainID is a fresh drain's id: 16 lowercase hex digits, random.
// Every audit entry of the drain names it, on the drained node (the
// drain's, each move's) and on the receivers (each adoption's).
func NewDrainID() string {
	var b [8]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read does not fail (it panics where it cannot)
	return hex.EncodeToString(b[:])
}

// ValidDrainID reports whether s has NewDrainID's form.
func ValidDrainID(s string) bool {
	if len(s) != 16 {
		return false
	}
	for _, c := range []byte(s) {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

// MoveClaim is what a verified MoveHeader says.
type MoveClaim struct {
	From  string    // the node that sent it
	At    time.Time // when it was signed
	Nonce string
}

// VerifyMove checks a MoveHeader received by node to for session id at
// now. It does not say whether the header was used before: that is
// MoveReplays' part.
func VerifyMove(key []byte, header, to, id string, now time.Time) (MoveClaim, error) {
	if len(key) == 0 {
		return MoveClaim{}, errors.New("this node has no forwarding key")
	}
	f := strings.Fields(header)
	if len(f) != 4 {
		return MoveClaim{}, fmt.Errorf("%s is not FROM TIME NONCE SIGNATURE (a node of an older version signs without the receiver and a nonce: upgrade it)", MoveHeader)
	}
	sec, err := strconv.ParseInt(f[1], 10, 64)
	if err != nil {
		return MoveClaim{}, fmt.Errorf("%s's time: %v", MoveHeader, err)
	}
	at := time.Unix(sec, 0)
	if d := now.Sub(at); d > MoveSkew || d < -MoveSkew {
		return MoveClaim{}, fmt.Errorf("%s was signed %s from now", MoveHeader, d.Round(time.Second))
	}
	if n, err := base64.RawURLEncoding.DecodeString(f[2]); err != nil || len(n) != moveNonceSize {
		return MoveClaim{}, fmt.Errorf("%s's nonce is not %d bytes in base64url", MoveHeader, moveNonceSize)
	}
	got, err := base64.RawURLEncoding.DecodeString(f[3])
	if err != nil || !hmac.Equal(got, moveMAC(key, f[0], to, id, f[1], f[2])) {
		return MoveClaim{}, fmt.Errorf("%s is not signed with the cluster's key for this session and this node", MoveHeader)
	}
	return MoveClaim{From: f[0], At: at, Nonce: f[2]}, nil
}

// MoveReplays are the nonces of the moves a node took, each remembered
// until its signed time is no longer accepted (MoveSkew): a header is
// used once.
type MoveReplays struct {
	mu   sync.Mutex
	seen map[string]time.Time // nonce -> the end of its acceptance
}

// Use records c's nonce; false when it was used already (a replay).
func (r *MoveReplays) Use(c MoveClaim, now time.Time) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for n, until := range r.seen {
		if now.After(until) {
			delete(r.seen, n)
		}
	}
	if _, ok := r.seen[c.Nonce]; ok {
		return false
	}
	if r.seen == nil {
		r.seen = map[string]time.Time{}
	}
	// Kept a second past the end of the window VerifyMove accepts.
	r.seen[c.Nonce] = c.At.Add(MoveSkew + time.Second)
	return true
}

// Get reads session id's record from the API server (nil, nil when it
// has none).
func (c *Cluster) Get(ctx context.Context, id string) (*Session, error) {
	if !validObjectName(id) {
		return nil, nil
	}
	u, err := c.dyn.Resource(SessionsGVR).Namespace(c.opts.Namespace).Get(ctx, id, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return sessionFrom(u)
}

// ErrNotOwner means a record's owner is neither the node a move is from
// nor the one it goes to.
var ErrNotOwner = errors.New("the session's record names another owner")

// SwitchOwner gives session id's record to node to, when from owns it
// (done already when to does): the record's spec and labels, then its
// status (alive=false: its processes did not move), each write checked
// by the resourceVersion read, retried from a fresh read on a conflict.
func (c *Cluster) SwitchOwner(ctx context.Context, id, from, to string) error {
	return c.updateRecord(ctx, id, func(res dynamic.ResourceInterface, cur *unstructured.Unstructured, s *Session) error {
		switch s.Spec.Node {
		case to:
			if s.Status.Node == to {
				return nil
			}
		case from:
			s.Spec.Node = to
			s.Labels = recordLabels(s.Spec)
			u, err := s.toUnstructured()
			if err != nil {
				return err
			}
			if cur, err = res.Update(ctx, u, metav1.UpdateOptions{}); err != nil {
				return err // a conflict: retried from a fresh read
			}
		default:
			return notOwner(id, s, from)
		}
		return c.writeStatus(ctx, cur, SessionStatus{Alive: false, Node: to, Phase: PhaseReady})
	})
}

// SetPhase writes session id's status phase, when node owns it.
func (c *Cluster) SetPhase(ctx context.Context, id, node, phase string) error {
	return c.updateRecord(ctx, id, func(_ dynamic.ResourceInterface, cur *unstructured.Unstructured, s *Session) error {
		if s.Spec.Node != node {
			return notOwner(id, s, node)
		}
		st := s.Status
		st.Phase = phase
		return c.writeStatus(ctx, cur, st)
	})
}

// updateRecord reads session id's record afresh and hands it to write,
// again from a fresh read when a write of it meets a conflict (the
// resourceVersion read is what each write is checked against).
func (c *Cluster) updateRecord(ctx context.Context, id string, write func(res dynamic.ResourceInterface, cur *unstructured.Unstructured, s *Session) error) error {
	res := c.dyn.Resource(SessionsGVR).Namespace(c.opts.Namespace)
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cur, err := res.Get(ctx, id, metav1.GetOptions{})
		if err != nil {
			return err
		}
		s, err := sessionFrom(cur)
		if err != nil {
			return err
		}
		return write(res, cur, s)
	})
}

func notOwner(id string, s *Session, node string) error {
	return fmt.Errorf("%w: session %s is %s's, not %s's", ErrNotOwner, id, s.Spec.Node, node)
}

// Local is what a drain asks of this node's sessions (the App).
type Local interface {
	// Quiesce stops session id for its move: no call enters, none runs.
	Quiesce(ctx context.Context, id string) error
	// Unquiesce makes it usable here again (its move failed).
	Unquiesce(id string)
	// Export writes its move stream (settings, then the workspace).
	Export(ctx context.Context, id string, w io.Writer) error
	// Release lets this node's copy go (the session's one teardown).
	Release(ctx context.Context, id string) error
	// Import adopts session id, of tenant and named name as its record
	// says, from a move stream another node sent, checked as hostile and
	// admitted against every ceiling a new session is; it returns the
	// name it got (another session here may hold its own) and the files
	// and bytes made.
	Import(ctx context.Context, id, tenant, name string, r io.Reader) (got string, files int, size int64, err error)
	// Size is how many bytes the files of session id hold (what the
	// receiver's admission probe is told).
	Size(ctx context.Context, id string) (int64, error)
	// Admit reports whether this node would take a moved session of
	// tenant whose files hold size bytes: every ceiling Import admits it
	// against. Advice for the sender, asked before it quiesces the
	// session; Import checks again.
	Admit(ctx context.Context, tenant string, size int64) error
}

// Adoption is a session this node took from another one's drain.
type Adoption struct {
	Session string // its id
	Tenant  string
	Name    string // its name here
	From    string // the node that sent it
	Drain   string // the sender's drain (NewDrainID), "" when it named none
	Files   int
	Bytes   int64
}

// Drainer moves a node's sessions to the other nodes.
type Drainer struct {
	C      *Cluster
	Member *Member
	Local  Local
	Key    []byte       // the cluster's forwarding key
	Client *http.Client // to the other nodes (nil: one without a total timeout, over TLS's transport)
	// TLS, when set, is this node's identity on the node port (NodeTLS):
	// a move is sent to the receiver's node port, whose certificate its
	// Lease pins, and taken from the node port alone.
	TLS *NodeTLS
	// Adopted, when set, is told of each session this node took from
	// another's drain, once its record names this node (the audit entry
	// of the receiving side).
	Adopted func(context.Context, Adoption)

	mu      sync.Mutex
	moves   map[string]time.Time // quiesced or moved away, and when (Quiesced)
	run     sync.Mutex           // one drain at a time
	replays MoveReplays          // the move headers this node took

	clientOnce sync.Once
	defClient  *http.Client // client's
}

// MovedGrace is how long a session moved away answers 503 here: the
// other nodes' tables show its new owner within it.
const MovedGrace = 2 * time.Minute

// client is Client, else one over TLS's transport (or plain HTTP's).
func (d *Drainer) client() *http.Client {
	d.clientOnce.Do(func() {
		switch {
		case d.Client != nil:
			d.defClient = d.Client
		case d.TLS != nil:
			d.defClient = &http.Client{Transport: d.TLS.Transport()}
		default:
			d.defClient = http.DefaultClient
		}
	})
	return d.defClient
}

// Quiesced reports whether calls for session id must wait (503 with
// Retry-After): it is being moved from this node, or was a moment ago.
func (d *Drainer) Quiesced(id string) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	t, ok := d.moves[id]
	return ok && (t.IsZero() || time.Since(t) < MovedGrace)
}

func (d *Drainer) mark(id string, moved bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.moves == nil {
		d.moves = map[string]time.Time{}
	}
	if moved {
		d.moves[id] = time.Now()
	} else {
		d.moves[id] = time.Time{}
	}
}

func (d *Drainer) unmark(id string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	delete(d.moves, id)
}

// moveAnswer is the answer of a move's receiver.
type moveAnswer struct {
	Session string `json:"session"`
	Node    string `json:"node"`
	Name    string `json:"name"` // the session's name there
	Files   int    `json:"files"`
	Bytes   int64  `json:"bytes"`
}

// Move is one session's move as a drain reports it.
type Move struct {
	Drain   string `json:"drain,omitempty"` // the drain's id (NewDrainID)
	Session string `json:"session"`
	Name    string `json:"name,omitempty"`
	Tenant  string `json:"tenant,omitempty"`
	To      string `json:"to,omitempty"`
	NewName string `json:"new_name,omitempty"` // the name it got there, when another session held its own
	OK      bool   `json:"ok"`
	// NoRoom: it stays because no node had room for it (each refused it,
	// or none but this one is live and not full); Error says what each
	// said.
	NoRoom bool `json:"no_room,omitempty"`
	// Paused: a node said yes and the session was paused for the move,
	// which then failed: it stays here, its processes stopped.
	Paused bool   `json:"paused,omitempty"`
	Error  string `json:"error,omitempty"`
	// PassedOver are the refusals for room of the nodes asked before
	// the one it went to, in placement's order: why a moved session is
	// not on the node with the most headroom.
	PassedOver []string `json:"passed_over,omitempty"`
}

// Result is what a drain did: how many sessions moved, how many stay for
// want of room on any node, how many stay because their move failed.
type Result struct {
	Moved  int `json:"moved"`
	NoRoom int `json:"no_room"`
	Failed int `json:"failed"`
}

// DrainPasses is how many passes a drain makes over a node's sessions:
// the first moves those it had, each later one those made meanwhile. A
// session still made after the last is left and reported (Failed).
const DrainPasses = 4

// Stayed is how many sessions stay on the drained node.
func (r Result) Stayed() int { return r.NoRoom + r.Failed }

// Drain marks this node draining and moves every session it owns,
// telling report of each move as it ends, and returns what it did. drain
// is its id (NewDrainID), which each receiver is told.
func (d *Drainer) Drain(ctx context.Context, drain string, report func(Move)) (res Result, err error) {
	d.run.Lock()
	defer d.run.Unlock()
	d.Member.SetDraining(true)
	if err := d.Member.Sync(ctx); err != nil {
		return res, fmt.Errorf("cluster: publishing that this node drains: %w", err)
	}
	// Passes (at most DrainPasses) until one finds no session this drain
	// has not tried: a session made here while it ran (a tenant's
	// default, which a draining node still makes for a call that names
	// none; a create another node placed here before its table showed
	// this node draining) is moved as well, not left on a node about to
	// go.
	tried := map[string]bool{}
	for pass := 0; ; pass++ {
		if pass > 0 {
			// The records of the sessions made here meanwhile (a
			// create writes its own before it answers; this catches
			// one whose write failed).
			if err := d.Member.SyncRecords(ctx); err != nil && ctx.Err() == nil {
				d.C.log.Warn("cluster: drain: writing this node's records", "err", err)
			}
		}
		todo, err := d.pending(ctx, tried)
		if err != nil {
			return res, err
		}
		if len(todo) == 0 {
			return res, nil
		}
		if pass == DrainPasses {
			// Sessions are still being made here (a caller that makes
			// its default again each time the last one moved): they
			// stay, each reported, rather than keep the drain going
			// for as long as a tenant likes.
			for _, s := range todo {
				report(Move{Drain: drain, Session: s.Name, Name: s.Spec.Name, Tenant: s.Spec.Tenant,
					Error: fmt.Sprintf("made on this node while it drained, after %d passes of the drain: not moved (drain it again)", DrainPasses)})
				res.Failed++
			}
			return res, nil
		}
		for _, s := range todo {
			if ctx.Err() != nil {
				return res, ctx.Err()
			}
			tried[s.Name] = true
			m := Move{Drain: drain, Session: s.Name, Name: s.Spec.Name, Tenant: s.Spec.Tenant}
			err := d.moveOne(ctx, s, drain, &m)
			var nr *NoRoomError
			switch {
			case err == nil:
				m.OK = true
				res.Moved++
			case errors.As(err, &nr):
				m.NoRoom, m.Error = true, err.Error()
				res.NoRoom++
			default:
				m.Error = err.Error()
				res.Failed++
			}
			report(m)
		}
	}
}

// pending are the sessions of this node that the drain has not tried:
// the records naming it in the informer's table, and each session it
// holds (Member.List) whose record the table does not show yet (made a
// moment ago), read from the API server and taken when it names this
// node.
func (d *Drainer) pending(ctx context.Context, tried map[string]bool) ([]*Session, error) {
	self := d.C.Self()
	var todo []*Session
	seen := map[string]bool{}
	for _, s := range d.C.Owned(self) {
		seen[s.Name] = true
		if !tried[s.Name] {
			todo = append(todo, s)
		}
	}
	if d.Member.List == nil {
		return todo, nil
	}
	local, err := d.Member.List(ctx)
	if err != nil {
		return nil, fmt.Errorf("cluster: listing this node's sessions: %w", err)
	}
	for _, ls := range local {
		if seen[ls.ID] || tried[ls.ID] {
			continue
		}
		rec, err := d.C.Get(ctx, ls.ID)
		if err != nil {
			return nil, fmt.Errorf("cluster: reading session %s's record: %w", ls.ID, err)
		}
		if rec != nil && rec.Spec.Node == self {
			todo = append(todo, rec)
		}
	}
	return todo, nil
}

// NoRoomError means no node admitted a session: each refusal, in the
// order the nodes were asked (none: no other node is live and not full).
type NoRoomError struct {
	Refusals []string
}

func (e *NoRoomError) Error() string {
	if len(e.Refusals) == 0 {
		return "every other node is full, draining or down"
	}
	return "each node asked refused it: " + strings.Join(e.Refusals, "; ")
}

// Unwrap makes errors.Is(err, ErrNoNode) true.
func (e *NoRoomError) Unwrap() error { return ErrNoNode }

// refusal is a receiver's answer other than yes.
type refusal struct {
	node   string
	status int
	msg    string
}

func (e *refusal) Error() string {
	return fmt.Sprintf("%s refused it (%d): %s", e.node, e.status, e.msg)
}

// roomRefused reports whether err is a refusal that another node may not
// give: no room there (429), or not now (503: draining too, or its API
// server unreachable).
func roomRefused(err error) bool {
	var r *refusal
	return errors.As(err, &r) && (r.status == http.StatusTooManyRequests || r.status == http.StatusServiceUnavailable)
}

// targets are the nodes a session may go to, in placement's order: the
// live nodes, not this one, that are not full.
func (d *Drainer) targets() []*Node {
	var nodes []Node
	for _, n := range d.C.Nodes() {
		if n.Name != d.C.Self() {
			nodes = append(nodes, n)
		}
	}
	return Rank(nodes, time.Now())
}

// moveOne moves s to the first node of targets that admits it and
// writes into m the node it went to (To), its name there (NewName) and
// the nodes passed over for room (PassedOver); a *NoRoomError when none
// admitted it. m.Paused says a failed move paused the session (a node
// said yes, then the move failed).
func (d *Drainer) moveOne(ctx context.Context, s *Session, drain string, m *Move) (err error) {
	nodes := d.targets()
	if len(nodes) == 0 {
		return &NoRoomError{}
	}
	id := s.Name
	unhold := d.Member.Hold(id)
	defer unhold()
	size, err := d.Local.Size(ctx, id)
	if err != nil {
		return err
	}
	quiesced := false
	defer func() {
		m.Paused = quiesced && err != nil
		if quiesced && err != nil { // it stays here
			_ = d.C.SetPhase(context.WithoutCancel(ctx), id, d.C.Self(), PhaseReady)
			d.Local.Unquiesce(id)
			d.unmark(id)
		}
	}()
	var refused []string
	for _, n := range nodes {
		m.To = n.Name
		if err := d.probe(ctx, id, n, size); err != nil {
			if roomRefused(err) {
				refused = append(refused, err.Error())
				continue
			}
			return err
		}
		if !quiesced {
			d.mark(id, false)
			if err := d.Local.Quiesce(ctx, id); err != nil {
				d.unmark(id)
				return err
			}
			quiesced = true
			_ = d.C.SetPhase(ctx, id, d.C.Self(), PhaseDraining) // shown by kubectl get; the move does not depend on it
		}
		ans, err := d.send(ctx, id, n, drain)
		if err != nil {
			// The answer may be lost after the target took it: the
			// record tells.
			if cur, gerr := d.C.Get(context.WithoutCancel(ctx), id); gerr == nil && cur != nil && cur.Spec.Node == n.Name {
				err = nil
			}
		}
		if err == nil {
			err = d.C.SwitchOwner(ctx, id, d.C.Self(), n.Name)
		}
		if err != nil {
			if roomRefused(err) && ctx.Err() == nil {
				refused = append(refused, err.Error())
				continue
			}
			return err
		}
		d.mark(id, true)
		if err := d.Local.Release(context.WithoutCancel(ctx), id); err != nil {
			// Moved: the files are on the target and the record names
			// it; the copy here is released by the next Sync
			// (MovedAway).
			d.C.log.Warn("cluster: a moved session's copy here is not released yet", "session", id, "err", err)
		}
		if ans != nil && ans.Name != s.Spec.Name {
			m.NewName = ans.Name
		}
		m.PassedOver = refused
		return nil
	}
	m.To = ""
	return &NoRoomError{Refusals: refused}
}

// moveRequest is a request to node n's MovePath for session id, signed
// for it.
func (d *Drainer) moveRequest(ctx context.Context, method, id string, n *Node, body io.Reader) (*http.Request, error) {
	u := &url.URL{Scheme: d.TLS.scheme("http"), Host: n.Address, Path: MovePath + url.PathEscape(id)}
	req, err := http.NewRequestWithContext(toNode(ctx, n.Name), method, u.String(), body)
	if err != nil {
		return nil, err
	}
	req.Header.Set(MoveHeader, MoveSignature(d.Key, d.C.Self(), n.Name, id, time.Now()))
	return req, nil
}

// admitAsk is the body of an admission probe.
type admitAsk struct {
	Bytes int64 `json:"bytes"` // the session's files
}

// probe asks node n whether it would admit session id, whose files hold
// size bytes. A node of an earlier version, which has no probe, is taken
// at its import's word: its 404 or 405, which comes without ProbeHeader,
// from a node whose Lease does not say it has the probe (Node.Probe).
// Any other answer but a yes is a refusal, a 404 with ProbeHeader or from
// a node whose Lease says it has the probe included (a route or a
// session it does not find): the session is not paused for a move that
// node would refuse.
func (d *Drainer) probe(ctx context.Context, id string, n *Node, size int64) error {
	b, _ := json.Marshal(admitAsk{Bytes: size})
	req, err := d.moveRequest(ctx, http.MethodPost, id, n, bytes.NewReader(b))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := d.client().Do(req)
	if err != nil {
		return fmt.Errorf("asking %s: %w", n.Name, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	answered := resp.Header.Get(ProbeHeader) != ""
	switch resp.StatusCode {
	case http.StatusOK, http.StatusNoContent:
		return nil
	case http.StatusNotFound, http.StatusMethodNotAllowed:
		if !answered && !n.Probe {
			return nil // a node of an earlier version: no probe
		}
		if !answered {
			return &refusal{node: n.Name, status: resp.StatusCode, msg: fmt.Sprintf("%s (without %s, from a node whose Lease says it answers the probe)",
				strings.TrimSpace(string(body)), ProbeHeader)}
		}
	}
	return &refusal{node: n.Name, status: resp.StatusCode, msg: strings.TrimSpace(string(body))}
}

// send streams session id to node n, for drain, and reads its answer.
func (d *Drainer) send(ctx context.Context, id string, n *Node, drain string) (*moveAnswer, error) {
	pr, pw := io.Pipe()
	go func() {
		pw.CloseWithError(d.Local.Export(ctx, id, pw))
	}()
	req, err := d.moveRequest(ctx, http.MethodPut, id, n, pr)
	if err != nil {
		pr.Close()
		return nil, err
	}
	if drain != "" {
		req.Header.Set(DrainHeader, drain)
	}
	req.Header.Set("Content-Type", "application/x-tar")
	resp, err := d.client().Do(req)
	pr.Close()
	if err != nil {
		return nil, fmt.Errorf("sending to %s: %w", n.Name, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode != http.StatusOK {
		return nil, &refusal{node: n.Name, status: resp.StatusCode, msg: strings.TrimSpace(string(body))}
	}
	ans := &moveAnswer{}
	if err := json.Unmarshal(body, ans); err != nil {
		return nil, fmt.Errorf("%s's answer: %v", n.Name, err)
	}
	return ans, nil
}

// ServeHTTP receives a session another node moves here (PUT
// MovePath{id}), or answers whether it would (POST MovePath{id}, the
// sender's admission probe: 204, or the refusal naming the ceiling). Both
// are taken only when MoveHeader is signed with the cluster's key for
// this session and this node, by the node the session's record names as
// its owner, sent by that node itself (with TLS: its pinned certificate,
// PeerNode; every node holds the key), not used before (MoveReplays),
// and only while this node is not draining. A move's stream itself is
// checked as hostile and admitted against this node's ceilings
// (Local.Import) whatever its probe was told. The record is then
// switched to this node, and the answer says what was made.
func (d *Drainer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method == http.MethodPost {
		w.Header().Set(ProbeHeader, "1") // this version's answer, whatever it is
	}
	id, ok := strings.CutPrefix(r.URL.Path, MovePath)
	if r.Method != http.MethodPut && r.Method != http.MethodPost || !ok || !validObjectName(id) {
		rest.WriteError(w, http.StatusNotFound, capability.Errorf(capability.NotFound, "no such route"))
		return
	}
	rec, from, ok := d.checkMove(w, r, id)
	if !ok {
		return
	}
	if r.Method == http.MethodPost {
		d.serveProbe(w, r, rec)
		return
	}
	// The drain's id goes into the tenant's audit log: its form only.
	drain := r.Header.Get(DrainHeader)
	if drain != "" && !ValidDrainID(drain) {
		rest.WriteError(w, http.StatusBadRequest, capability.Errorf(capability.InvalidArgument,
			"moving session %s here: %s is not a drain's id (16 lowercase hex digits)", id, DrainHeader))
		return
	}
	self := d.C.Self()
	unhold := d.Member.Hold(id)
	defer unhold()
	got, files, size, err := d.Local.Import(r.Context(), id, rec.Spec.Tenant, rec.Spec.Name, r.Body)
	if err != nil {
		ce := controller.Classify(err)
		d.C.log.Warn("cluster: a moved session was refused", "session", id, "from", from, "err", err)
		rest.WriteError(w, rest.Status(ce.Code), ce)
		return
	}
	if err := d.C.SwitchOwner(context.WithoutCancel(r.Context()), id, from, self); err != nil {
		_ = d.Local.Release(context.WithoutCancel(r.Context()), id) // the record is not ours: neither is the copy
		unavailable(w, "switching session "+id+"'s owner: "+err.Error())
		return
	}
	d.C.log.Info("cluster: a session moved here", "session", id, "from", from, "drain", drain, "files", files, "bytes", size)
	if d.Adopted != nil {
		d.Adopted(context.WithoutCancel(r.Context()), Adoption{Session: id, Tenant: rec.Spec.Tenant, Name: got, From: from,
			Drain: drain, Files: files, Bytes: size})
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(moveAnswer{Session: id, Node: self, Name: got, Files: files, Bytes: size})
}

// checkMove checks a move or probe of session id (ServeHTTP) and returns
// the session's record and the node that sends it; when !ok, the refusal
// is written.
func (d *Drainer) checkMove(w http.ResponseWriter, r *http.Request, id string) (rec *Session, from string, ok bool) {
	if d.TLS != nil && !fromNode(r) {
		rest.WriteError(w, http.StatusForbidden, capability.Errorf(capability.PermissionDenied,
			"moving session %s here: a move is taken from the cluster's nodes on the node port only", id))
		return nil, "", false
	}
	self := d.C.Self()
	now := time.Now()
	claim, err := VerifyMove(d.Key, r.Header.Get(MoveHeader), self, id, now)
	if err != nil {
		rest.WriteError(w, http.StatusForbidden, capability.Errorf(capability.PermissionDenied, "moving session %s here: %v", id, err))
		return nil, "", false
	}
	if d.TLS != nil && claim.From != PeerNode(r) {
		// Signed with the cluster's key, which every node holds: the
		// sender is the node whose certificate sent it, or no one.
		rest.WriteError(w, http.StatusForbidden, capability.Errorf(capability.PermissionDenied,
			"moving session %s here: the move names %s as its sender, and node %s sent it", id, claim.From, PeerNode(r)))
		return nil, "", false
	}
	if !d.replays.Use(claim, now) {
		rest.WriteError(w, http.StatusForbidden, capability.Errorf(capability.PermissionDenied,
			"moving session %s here: this %s was used already (a signature is good for one move; the sender signs each anew)", id, MoveHeader))
		return nil, "", false
	}
	from = claim.From
	if from == self {
		rest.WriteError(w, http.StatusConflict, capability.Errorf(capability.InvalidArgument, "a node does not move a session to itself"))
		return nil, "", false
	}
	if d.Member.Draining() {
		unavailable(w, "this node is being drained and takes no session")
		return nil, "", false
	}
	rec, err = d.C.Get(r.Context(), id)
	switch {
	case err != nil:
		unavailable(w, "reading session "+id+"'s record: "+err.Error())
		return nil, "", false
	case rec == nil || rec.Spec.Node != from:
		owner := "none"
		if rec != nil {
			owner = rec.Spec.Node
		}
		rest.WriteError(w, http.StatusForbidden, capability.Errorf(capability.PermissionDenied,
			"session %s is not %s's to move (its record names %s)", id, from, owner))
		return nil, "", false
	}
	return rec, from, true
}

// maxAdmitAsk bounds an admission probe's body.
const maxAdmitAsk = 4096

// serveProbe answers whether this node would admit the session of rec,
// of the size the sender says (its record's tenant, not the sender's
// word): 204, or the refusal naming the ceiling (429 for room). Nothing
// is held: the import admits it again.
func (d *Drainer) serveProbe(w http.ResponseWriter, r *http.Request, rec *Session) {
	var ask admitAsk
	if err := json.NewDecoder(io.LimitReader(r.Body, maxAdmitAsk)).Decode(&ask); err != nil || ask.Bytes < 0 {
		rest.WriteError(w, http.StatusBadRequest, capability.Errorf(capability.InvalidArgument,
			`asking to admit session %s: the body is not {"bytes": N} with N >= 0`, rec.Name))
		return
	}
	if err := d.Local.Admit(r.Context(), rec.Spec.Tenant, ask.Bytes); err != nil {
		ce := controller.Classify(err)
		rest.WriteError(w, rest.Status(ce.Code), ce)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}
