package cluster

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/quro-dev/quro/internal/api/rest"
	"github.com/quro-dev/quro/internal/capability"
)

// auditPath is REST's audit query, which a node answers for every node.
const auditPath = "/v1/audit"

// isAuditQuery: GET /v1/audit in JSON, naming no session (a session's
// query goes to its owner, whose log holds its calls).
func isAuditQuery(r *http.Request) bool {
	return r.Method == http.MethodGet && r.URL.Path == auditPath && !r.URL.Query().Has("session") && !rest.WantsText(r)
}

// maxAuditReply bounds what one node's audit answer may hold (1000
// entries of bounded summaries fit well within it).
const maxAuditReply = 8 << 20

// A fan-out costs the cluster a sub-query on every node and this node up
// to maxAuditReply of each answer, decoded, at once: the fan-outs in
// flight are bounded per tenant and on this node, so that a tenant's
// many connections (256 per address by default) cannot hold the cluster
// with the same query. A query over a bound is told 429 with Retry-After
// (it costs nothing then: this node's own answer was read only).
const (
	maxAuditFanOutsPerTenant = 2
	maxAuditFanOuts          = 8
)

// fanOuts counts the audit fan-outs in flight (a Router's).
type fanOuts struct {
	mu        sync.Mutex
	all       int
	perTenant map[string]int
}

// take counts a fan-out of tenant, or reports false when one more would
// pass a bound; release gives it back.
func (f *fanOuts) take(tenant string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.all >= maxAuditFanOuts || f.perTenant[tenant] >= maxAuditFanOutsPerTenant {
		return false
	}
	if f.perTenant == nil {
		f.perTenant = map[string]int{}
	}
	f.all++
	f.perTenant[tenant]++
	return true
}

func (f *fanOuts) release(tenant string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.all--
	if f.perTenant[tenant]--; f.perTenant[tenant] <= 0 {
		delete(f.perTenant, tenant)
	}
}

// nodeEntry is one audit entry as a node answered it, with the node
// named.
type nodeEntry struct {
	time  time.Time
	node  string
	seq   int64
	entry map[string]any
}

// auditFanOut asks every live node the same audit query with the
// caller's own credential (each node checks it and answers the caller's
// entries only) and answers them merged, oldest first, each entry with
// its "node"; the latest limit of them, as one node would. A node that
// does not answer is named in "nodes_unanswered" rather than left out in
// silence. This node's own answer decides the status: a caller it
// refuses is refused.
func (rt *Router) auditFanOut(w http.ResponseWriter, r *http.Request) {
	self := rt.Table.Self()
	rec := httptest.NewRecorder()
	rt.Next.ServeHTTP(rec, r)
	if rec.Code != http.StatusOK {
		for k, v := range rec.Header() {
			w.Header()[k] = v
		}
		w.WriteHeader(rec.Code)
		_, _ = w.Write(rec.Body.Bytes())
		return
	}
	tenant := ""
	if rt.Auth != nil {
		caller, err := rt.Auth(r)
		if err != nil { // this node answered it: the caller is known
			rest.WriteError(w, http.StatusUnauthorized, capability.Errorf(capability.Unauthenticated, "%v", err))
			return
		}
		tenant = caller.Tenant
	}
	if !rt.fanOuts.take(tenant) {
		e := capability.Errorf(capability.ResourceExhausted, "too many audit queries across the cluster at once (at most %d of a tenant's, %d on this node): try again when one has answered", maxAuditFanOutsPerTenant, maxAuditFanOuts)
		e.RetryAfter = 1
		w.Header().Set("Retry-After", "1")
		rest.WriteError(w, http.StatusTooManyRequests, e)
		return
	}
	defer rt.fanOuts.release(tenant)
	var all []nodeEntry
	mine, err := auditEntries(self, rec.Body)
	if err != nil {
		rest.WriteError(w, http.StatusInternalServerError, capability.Errorf(capability.Internal, "this node's audit answer: %v", err))
		return
	}
	all = append(all, mine...)
	var (
		mu         sync.Mutex
		wg         sync.WaitGroup
		unanswered []string
	)
	now := time.Now()
	for _, n := range rt.Table.Nodes() {
		if n.Name == self {
			continue
		}
		if !n.Live(now) {
			mu.Lock() // the askers started already append too
			unanswered = append(unanswered, n.Name)
			mu.Unlock()
			continue
		}
		wg.Go(func() {
			got, err := rt.askAudit(r, n)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				rt.Logger.Warn("cluster: a node's audit did not answer", "node", n.Name, "err", err)
				unanswered = append(unanswered, n.Name)
				return
			}
			all = append(all, got...)
		})
	}
	wg.Wait()
	slices.SortFunc(all, func(a, b nodeEntry) int {
		return cmp.Or(a.time.Compare(b.time), cmp.Compare(a.node, b.node), cmp.Compare(a.seq, b.seq))
	})
	limit := 50 // get_audit_log's default
	if l, err := strconv.Atoi(r.URL.Query().Get("limit")); err == nil && l > 0 {
		limit = min(l, 1000)
	}
	if len(all) > limit {
		all = all[len(all)-limit:]
	}
	out := struct {
		Entries    []map[string]any `json:"entries"`
		Unanswered []string         `json:"nodes_unanswered,omitempty"`
	}{Entries: make([]map[string]any, 0, len(all))}
	for _, e := range all {
		out.Entries = append(out.Entries, e.entry)
	}
	slices.Sort(unanswered)
	out.Unanswered = unanswered
	rest.WriteJSON(w, http.StatusOK, out)
}

// askAudit asks node n r's audit query, forwarded (served there, not
// fanned out again) with the caller's credential.
func (rt *Router) askAudit(r *http.Request, n Node) ([]nodeEntry, error) {
	ctx, cancel := context.WithTimeout(toNode(r.Context(), n.Name), 30*time.Second)
	defer cancel()
	u := url.URL{Scheme: rt.TLS.scheme("http"), Host: n.Address, Path: auditPath, RawQuery: r.URL.RawQuery}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return nil, err
	}
	req.Host = r.Host // the owner checks the Host the client named
	for _, h := range []string{"Authorization", "Cookie", "Origin"} {
		if v := r.Header.Values(h); len(v) > 0 {
			req.Header[h] = v
		}
	}
	req.Header.Set(HeaderForwardedBy, rt.forwardedBy())
	resp, err := rt.client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return nil, fmt.Errorf("%s: %s", resp.Status, bytes.TrimSpace(b))
	}
	return auditEntries(n.Name, io.LimitReader(resp.Body, maxAuditReply))
}

// auditEntries reads a node's audit answer, each entry named with node.
func auditEntries(node string, body io.Reader) ([]nodeEntry, error) {
	var reply struct {
		Entries []map[string]any `json:"entries"`
	}
	if err := json.NewDecoder(body).Decode(&reply); err != nil {
		return nil, err
	}
	out := make([]nodeEntry, 0, len(reply.Entries))
	for _, e := range reply.Entries {
		ts, _ := e["time"].(string)
		t, err := time.Parse(time.RFC3339Nano, ts)
		if err != nil {
			return nil, fmt.Errorf("an entry's time %q: %v", ts, err)
		}
		seq, _ := e["seq"].(float64)
		e["node"] = node
		out = append(out, nodeEntry{time: t, node: node, seq: int64(seq), entry: e})
	}
	return out, nil
}
