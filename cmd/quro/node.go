package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/quro-dev/quro/internal/api/httpauth"
	"github.com/quro-dev/quro/internal/api/rest"
	"github.com/quro-dev/quro/internal/app"
	"github.com/quro-dev/quro/internal/capability"
	"github.com/quro-dev/quro/internal/cluster"
	"github.com/quro-dev/quro/internal/controller"
)

// DrainPath is the running server's route of quro node drain (the
// operator's token only).
const DrainPath = "/cluster/v1/drain"

// drainLine is one line of DrainPath's answer: a session's move, or the
// summary at the end.
type drainLine struct {
	*cluster.Move
	ID    string `json:"id,omitempty"` // the summary's: the drain's id (cluster.NewDrainID)
	Done  bool   `json:"done,omitempty"`
	Moved int    `json:"moved,omitempty"`
	// Failed is how many sessions stay on the node: Unplaced of them for
	// want of room on any other node, the others because their move
	// failed.
	Failed   int    `json:"failed,omitempty"`
	Unplaced int    `json:"unplaced,omitempty"`
	Fatal    string `json:"fatal,omitempty"` // why the drain stopped
}

// drainHandler runs a drain of n and streams its moves, one JSON line
// each, then the summary.
func (n *clusterNode) drainHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/x-ndjson")
		w.WriteHeader(http.StatusOK)
		enc := json.NewEncoder(w)
		fl, _ := w.(http.Flusher)
		caller := operatorFrom(r.Context())
		caller.Path = "rest"
		start := time.Now()
		id := cluster.NewDrainID()
		res, err := n.drainer.Drain(r.Context(), id, func(m cluster.Move) {
			n.auditMove(r.Context(), caller, m)
			_ = enc.Encode(drainLine{Move: &m})
			if fl != nil {
				fl.Flush()
			}
		})
		end := drainLine{ID: id, Done: err == nil && res.Stayed() == 0, Moved: res.Moved, Failed: res.Stayed(), Unplaced: res.NoRoom}
		if err != nil {
			end.Fatal = err.Error()
		}
		_ = enc.Encode(end)
		n.auditDrain(r.Context(), caller, start, end)
	})
}

// auditMove records one move of a drain in the log of its session's
// tenant: the nodes it left and went to, the drain, and why it failed.
// The node it went to records its side (auditAdopted).
func (n *clusterNode) auditMove(ctx context.Context, caller controller.Caller, m cluster.Move) {
	if n.audit == nil {
		return
	}
	args, _ := json.Marshal(map[string]string{"from": n.c.Self(), "to": m.To, "drain": m.Drain, "name": m.Name, "new_name": m.NewName})
	rec := &controller.Record{Start: time.Now(), Caller: caller, Capability: app.AuditSessionMove, Args: args,
		Outcome: "ok", Session: m.Session}
	rec.Caller.Tenant = m.Tenant // the session's owner sees its move
	if !m.OK {
		rec.Outcome = string(capability.Unavailable)
		// The error's detail is the operator's (the drain's answer, the
		// node's log): the tenant's entry says what became of the session.
		// Paused: a node said yes, the session was paused for the move
		// and its processes stopped; else nothing of it was touched.
		stays := fmt.Sprintf("the session stays on %s with its files and processes, untouched", n.c.Self())
		if m.Paused {
			stays = fmt.Sprintf("the session stays on %s with its files, its processes were stopped", n.c.Self())
		}
		rec.Err = capability.Errorf(capability.Unavailable, "the move to %s failed; %s", m.To, stays)
		if m.NoRoom {
			rec.Outcome = string(capability.ResourceExhausted)
			rec.Err = capability.Errorf(capability.ResourceExhausted, "no other node had room for it; %s", stays)
		}
	}
	n.audit(ctx, rec)
}

// auditAdopted records, in the log of its session's tenant on this node,
// a session this node took from another node's drain: from which node,
// by which drain, what it is named here, the files and bytes that came.
// The drained node's entry goes with its volume; this one stays where
// the session now lives.
func (n *clusterNode) auditAdopted(ctx context.Context, a cluster.Adoption) {
	if n.audit == nil {
		return
	}
	args, _ := json.Marshal(map[string]any{"from": a.From, "to": n.c.Self(), "drain": a.Drain, "name": a.Name,
		"files": a.Files, "bytes": a.Bytes})
	n.audit(ctx, &controller.Record{Start: time.Now(), Caller: controller.Caller{Path: "cluster", Tenant: a.Tenant},
		Capability: app.AuditSessionMove, Args: args, Outcome: "ok", Session: a.Session})
}

// auditDrain records the drain itself in the operator's log.
func (n *clusterNode) auditDrain(ctx context.Context, caller controller.Caller, start time.Time, end drainLine) {
	if n.audit == nil {
		return
	}
	args, _ := json.Marshal(map[string]any{"node": n.c.Self(), "drain": end.ID, "moved": end.Moved, "failed": end.Failed, "unplaced": end.Unplaced})
	rec := &controller.Record{Start: start, Caller: caller, Capability: app.AuditNodeDrain, Args: args,
		Outcome: "ok", Duration: time.Since(start)}
	switch {
	case end.Fatal != "":
		rec.Outcome = string(capability.Unavailable)
		rec.Err = capability.Errorf(capability.Unavailable, "%s", end.Fatal)
	case end.Failed > 0:
		rec.Outcome = string(capability.Unavailable)
		rec.Err = capability.Errorf(capability.Unavailable, "%d sessions stay on this node (%d for want of room on every other node)", end.Failed, end.Unplaced)
	}
	n.audit(context.WithoutCancel(ctx), rec)
}

func newNodeCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "node",
		Short: "Act on this node of a Quro cluster on Kubernetes (docs/kubernetes.md)",
	}
	g.serverFlags(cmd, true)
	cmd.AddCommand(local(&cobra.Command{
		Use:   "drain",
		Short: "Move every session of this node to the other nodes (the pod's preStop hook runs it)",
		Long: `Drain the cluster node running on --data (or --server): it stops taking new
sessions, then moves each session it owns to the first live node, by
headroom, that admits it (each is asked before the session is paused; one at
a ceiling for it passes it on to the next) — its workspace and settings
copied, then its owner switched in the sessions.quro.dev record. A session's
processes do not move: the result of its next call says so. A session no
node has room for, or whose move fails, stays here, usable, and is reported;
the command then exits 1. Running it again finishes the job.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return drain(cmd.Context(), g, cmd.OutOrStdout()) },
	}, "no capability: asks the running cluster node to drain over its operator-only route "+DrainPath+
		"; the moves are the node's own, each session quiesced and released by its life owner"))
	return cmd
}

// drain asks the server of g's target to drain and prints its moves.
func drain(ctx context.Context, g *globals, out io.Writer) error {
	t, err := g.target()
	if err != nil {
		return err
	}
	if t.url == "" || strings.HasPrefix(t.url, "unix://") {
		return errors.New("quro node drain acts on a running cluster node: run it where quro serve --cluster runs on --data, or name it with --server")
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimSuffix(t.url, "/")+DrainPath, nil)
	if err != nil {
		return err
	}
	if t.token.value != "" {
		req.Header.Set("Authorization", "Bearer "+t.token.value)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("quro node drain: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		return fmt.Errorf("quro node drain: %s: %s", resp.Status, strings.TrimSpace(string(b)))
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		var l drainLine
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			return fmt.Errorf("quro node drain: the server's answer: %w", err)
		}
		switch {
		case l.Move != nil && l.Session != "" && l.OK:
			renamed := ""
			if l.NewName != "" {
				renamed = ", named " + l.NewName + " there (its name was taken)"
			}
			passed := ""
			if len(l.PassedOver) > 0 {
				passed = "; passed over for room first: " + strings.Join(l.PassedOver, "; ")
			}
			fmt.Fprintf(out, "moved %s (%s) to %s%s%s\n", l.Session, l.Name, l.To, renamed, passed)
		case l.Move != nil && l.Session != "" && l.NoRoom:
			fmt.Fprintf(out, "NOT moved %s (%s), no node has room for it: %s\n", l.Session, l.Name, l.Error)
		case l.Move != nil && l.Session != "":
			fmt.Fprintf(out, "NOT moved %s (%s): %s\n", l.Session, l.Name, l.Error)
		default:
			why := ""
			if l.Failed > 0 {
				why = fmt.Sprintf(": %d for want of room on every other node, %d failed", l.Unplaced, l.Failed-l.Unplaced)
			}
			fmt.Fprintf(out, "%d sessions moved, %d not%s (drain %s, the id its audit entries name)\n", l.Moved, l.Failed, why, l.ID)
			if l.Fatal != "" {
				return fmt.Errorf("quro node drain: %s", l.Fatal)
			}
			if l.Unplaced > 0 {
				return fmt.Errorf("quro node drain: %d sessions stay on this node, %d of them because no other node has room (add a node, or raise the ceilings the refusals name, then run it again)", l.Failed, l.Unplaced)
			}
			if l.Failed > 0 {
				return fmt.Errorf("quro node drain: %d sessions stay on this node; run it again to retry them", l.Failed)
			}
			return nil
		}
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("quro node drain: %w", err)
	}
	return errors.New("quro node drain: the server's answer ended before its summary (did the server stop?); run it again to finish")
}

// routes are the node's own: a session another node moves here (signed
// by the cluster's key, checked as hostile), and quro node drain.
func (n *clusterNode) routes(mux *http.ServeMux, access rest.Access, authFn httpauth.Func) {
	mux.Handle(cluster.MovePath, n.drainer)
	mux.Handle("POST "+DrainPath, guard(access, requireOperator(authFn, "a drain moves every tenant's sessions", n.drainHandler())))
}

// long adds the node's routes to the long requests: a move's stream and
// a drain last as long as their copies.
func (n *clusterNode) long(prev func(*http.Request) bool) func(*http.Request) bool {
	return func(r *http.Request) bool { return prev(r) || strings.HasPrefix(r.URL.Path, "/cluster/v1/") }
}
