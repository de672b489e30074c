package app

import (
	"cmp"
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/quro-dev/quro/internal/capability"
	"github.com/quro-dev/quro/internal/controller"
	"github.com/quro-dev/quro/internal/egress"
	"github.com/quro-dev/quro/internal/sandbox"
	"github.com/quro-dev/quro/internal/session"
	"github.com/quro-dev/quro/internal/store"
)

// NetworkOptions are the operator's network settings.
type NetworkOptions struct {
	// Default is the policy of a session that names none ("" is
	// sandbox.NetworkNone).
	Default string
	// Max is the most any session may ask for, in the order none <
	// internet < host ("" is sandbox.NetworkInternet): "host", the host's
	// own network namespace, only when the operator says so.
	Max string
	// Trusted are the operator's exceptions to the egress's refusal of
	// private and the host's own addresses: "host:port" (connected to
	// whatever it resolves to) or a CIDR ("10.1.2.0/24"). They lift no
	// session's allow or deny rules.
	Trusted []string
	// Resolve resolves the names boxes connect to; nil is the system's
	// resolver (tests point names at stand-ins on 127.0.0.1).
	Resolve func(ctx context.Context, host string) ([]netip.Addr, error)
	// UpstreamCAs are trusted besides the system's roots by the egress
	// when it connects to the host of a session's secret (tests: a
	// stand-in's own CA).
	UpstreamCAs []*x509.Certificate
	// PreviewDomain, when set, gives each preview a host name of its own,
	// PORT-ID.DOMAIN (quro serve --preview-domain, which routes those
	// names to the preview proxy; wildcard DNS is the operator's): a
	// domain, with a port if need be ("preview.example.com",
	// "example.test:8080"), and a scheme for the URLs get_preview_url
	// gives ("http://example.test:8080"; default https).
	PreviewDomain string
	// PreviewPublic lets a session's creator make its ports public
	// (quro serve --preview-public): reached on their host form with no
	// token. The host forms alone serve them (PreviewDomain, or E2B's
	// domain), never the path form on the server's own origin.
	PreviewPublic bool
}

// ParsePreviewDomain splits a PreviewDomain into the URLs' scheme and the
// host (with its port, if any), refusing anything else (a path, userinfo,
// a scheme not http or https).
func ParsePreviewDomain(s string) (scheme, host string, err error) {
	if s == "" {
		return "", "", nil
	}
	raw := s
	if !strings.Contains(s, "://") {
		raw = "https://" + s
	}
	u, err := url.Parse(raw)
	if err != nil || u.User != nil || strings.Trim(u.Path, "/") != "" || u.RawQuery != "" || u.Fragment != "" ||
		(u.Scheme != "http" && u.Scheme != "https") || u.Hostname() == "" || net.ParseIP(u.Hostname()) != nil ||
		!strings.Contains(strings.Trim(u.Hostname(), "."), ".") && u.Hostname() != "localhost" {
		return "", "", fmt.Errorf("preview domain %q: want a domain of names, with a port and an http or https scheme if need be (preview.example.com, http://example.test:8080)", s)
	}
	return u.Scheme, strings.ToLower(strings.Trim(u.Host, ".")), nil
}

// networkRank orders the policies by what they open.
func networkRank(p string) int { return slices.Index(session.Networks, p) }

// checkNetworkOptions fills o's defaults and refuses what is not a policy
// or a default above the maximum.
func checkNetworkOptions(o *NetworkOptions) error {
	if o.Default == "" {
		o.Default = sandbox.NetworkNone
	}
	if o.Max == "" {
		o.Max = sandbox.NetworkInternet
	}
	for _, p := range []string{o.Default, o.Max} {
		if networkRank(p) < 0 {
			return fmt.Errorf("network policy %q: want one of %v", p, session.Networks)
		}
	}
	for _, t := range o.Trusted {
		if _, err := netip.ParsePrefix(t); err == nil {
			continue
		}
		if _, err := netip.ParseAddr(t); err == nil {
			continue
		}
		if h, p, err := net.SplitHostPort(t); err != nil || h == "" || p == "" {
			return fmt.Errorf("network exception %q: want HOST:PORT or a CIDR", t)
		}
	}
	if _, _, err := ParsePreviewDomain(o.PreviewDomain); err != nil {
		return err
	}
	if networkRank(o.Default) > networkRank(o.Max) {
		return fmt.Errorf("the default network policy %q opens more than the maximum %q", o.Default, o.Max)
	}
	return nil
}

// networkPolicy is the policy of a session of tenant that asks for
// asked, and a note for the caller when the name it used is deprecated; a
// policy above the effective maximum (the lower of the operator's quro
// serve --network-max and the tenant's own, quro tenant limits set
// --network-max) is refused, naming the one that refused it.
func (a *App) networkPolicy(ctx context.Context, tenant, asked string) (policy, note string, err error) {
	policy = asked
	switch asked {
	case "":
		policy = a.network.Default
	case session.LegacyFull:
		policy = sandbox.NetworkInternet
		note = `network "full" is deprecated and now means "internet": the public internet through the server's egress, never the host's own network or private addresses`
	}
	if networkRank(policy) < 0 {
		return "", "", capability.Errorf(capability.InvalidArgument, "network policy %q: use none, internet or host", asked)
	}
	if networkRank(policy) > networkRank(a.network.Max) {
		return "", "", capability.Errorf(capability.PermissionDenied,
			"network policy %q: this server allows at most %q (the operator's quro serve --network-max)", policy, a.network.Max)
	}
	own, err := a.tenants.own(ctx, tenant)
	if err != nil {
		return "", "", err // fail closed: unavailable, naming the fix
	}
	if own.NetworkMax != "" && networkRank(policy) > networkRank(own.NetworkMax) {
		flag := ""
		if tenant != "" {
			flag = " --tenant " + tenant
		}
		return "", "", capability.Errorf(capability.PermissionDenied,
			"network policy %q: %s may ask for at most %q (the operator's quro tenant limits set%s --network-max)",
			policy, sandbox.DisplayTenant(tenant), own.NetworkMax, flag)
	}
	return policy, note, nil
}

// netPolicies are the sessions' network policies as their boxes'
// connections are decided: read from the session the first time, then
// kept until the session ends (or its policy is changed).
type netPolicies struct {
	sessions *session.Manager
	mu       sync.Mutex
	byID     map[string]netPolicy
}

type netPolicy struct {
	network string         // the session's policy: none, internet or host
	egress  *egress.Policy // what the egress applies
}

func newNetPolicies(sessions *session.Manager) *netPolicies {
	return &netPolicies{sessions: sessions, byID: map[string]netPolicy{}}
}

// get is the egress policy of session id.
func (n *netPolicies) get(id string) *egress.Policy { return n.of(id).egress }

// of is session id's policy; a session that cannot be read (gone, or the
// store failing) has none: nothing goes out.
func (n *netPolicies) of(id string) netPolicy {
	n.mu.Lock()
	p, ok := n.byID[id]
	n.mu.Unlock()
	if ok {
		return p
	}
	s, err := n.sessions.ByIDAnyTenant(context.Background(), id)
	if err != nil {
		return netPolicy{sandbox.NetworkNone, sessionPolicy(sandbox.NetworkNone, nil)}
	}
	p = netPolicy{s.Network, sessionPolicy(s.Network, s.NetRules)}
	n.mu.Lock()
	defer n.mu.Unlock()
	if q, ok := n.byID[id]; ok {
		return q
	}
	n.byID[id] = p
	return p
}

// set is session id's policy from now on: its next connection is
// decided by it.
func (n *netPolicies) set(id, network string, rules *session.NetRules) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.byID[id] = netPolicy{network, sessionPolicy(network, rules)}
}

func (n *netPolicies) forget(id string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	delete(n.byID, id)
}

// netRules checks a session's egress rules: only under "internet", each
// a rule egress.ParseRule takes. nil when there are none.
func netRules(network string, allow, deny []string) (*session.NetRules, error) {
	if len(allow)+len(deny) == 0 {
		return nil, nil
	}
	if network != sandbox.NetworkInternet {
		return nil, capability.Errorf(capability.InvalidArgument,
			"allow_out and deny_out are rules of network internet, not %q: ask for network internet with them", network)
	}
	if _, err := egress.ParsePolicy(egress.ModeInternet, allow, deny); err != nil {
		return nil, capability.Errorf(capability.InvalidArgument, "network rules: %v", err)
	}
	return &session.NetRules{Allow: slices.Clone(allow), Deny: slices.Clone(deny)}, nil
}

// SetNetworkInput is set_session_network's input.
type SetNetworkInput struct {
	Session  string   `json:"session,omitempty" jsonschema:"session id or name; the default session when omitted"`
	Network  string   `json:"network,omitempty" jsonschema:"none, internet or host; omitted keeps the session's"`
	AllowOut []string `json:"allow_out,omitempty" jsonschema:"with internet: only these destinations (pypi.org, *.pythonhosted.org, github.com:443, 203.0.113.0/24); omitted with deny_out: the public internet"`
	DenyOut  []string `json:"deny_out,omitempty" jsonschema:"with internet: never these (same forms; deny wins)"`
}

// EgressLogInput is get_egress_log's input.
type EgressLogInput struct {
	Session  string `json:"session,omitempty" jsonschema:"session id or name; the default session when omitted"`
	Limit    int    `json:"limit,omitempty" jsonschema:"how many of the latest decisions (default 50, at most 1000)"`
	Decision string `json:"decision,omitempty" jsonschema:"only allowed or only denied ones"`
	Since    string `json:"since,omitempty" jsonschema:"only connections made at or after this time: RFC 3339 (2026-01-02T15:04:05Z) or a duration back from now (90s, 15m, 2h)"`
}

// EgressLog is get_egress_log's output.
type EgressLog struct {
	Session string         `json:"session"`
	Entries []egress.Event `json:"entries" jsonschema:"oldest first"`
}

// Text is one line per decision.
func (l *EgressLog) Text() string {
	if len(l.Entries) == 0 {
		return "no network connections of this session match"
	}
	var b strings.Builder
	for _, e := range l.Entries {
		fmt.Fprintf(&b, "%s %s %s", e.Start.UTC().Format(time.RFC3339), e.Decision, e.Dest)
		if e.Rule != "" {
			b.WriteString(" rule=" + e.Rule)
		}
		if e.Reason != "" {
			b.WriteString(" (" + e.Reason + ")")
		}
		if e.Decision == egress.Allowed {
			fmt.Fprintf(&b, " out=%d in=%d %.0fms", e.BytesOut, e.BytesIn, float64(e.Duration.Microseconds())/1000)
		}
		b.WriteString("\n")
	}
	return strings.TrimRight(b.String(), "\n")
}

func (a *App) registerNetwork(reg *capability.Registry) {
	reg.Register(capability.New("set_session_network",
		"Change a session's network for its next connections (open ones go on): none (its own loopback), internet (public addresses; "+
			"allow_out limits it to the destinations named, deny_out refuses those), or host if the operator allows it (only while nothing runs in the session).",
		capability.ScopeExec, a.setSessionNetwork).InSession(capability.UseHold))
	reg.Register(capability.New("get_egress_log",
		"The network connections a session's code made and the server's decision on each (allowed or denied, the rule, why, bytes each way), latest last; "+
			"kept across restarts (the latest 1,000 of a session) and deleted with the session.",
		capability.ScopeRead, func(ctx context.Context, in EgressLogInput) (*EgressLog, error) {
			s, err := entered(ctx)
			if err != nil {
				return nil, err
			}
			if in.Limit < 0 || in.Limit > egressKeep {
				return nil, capability.Errorf(capability.InvalidArgument, "limit must be between 1 and %d", egressKeep)
			}
			switch in.Decision {
			case "", egress.Allowed, egress.Denied:
			default:
				return nil, capability.Errorf(capability.InvalidArgument, "decision %q: use allowed or denied", in.Decision)
			}
			f := store.EgressFilter{Session: s.ID, Decision: in.Decision, Limit: cmp.Or(in.Limit, 50)}
			if in.Since != "" {
				if f.Since, err = parseSince(in.Since, time.Now()); err != nil {
					return nil, err
				}
			}
			// What the egress decided before this call is written first.
			if err := a.egress.events.w.flush(ctx); err != nil {
				return nil, err
			}
			rows, err := a.Store.Egress(ctx, f)
			if err != nil {
				return nil, err
			}
			out := make([]egress.Event, 0, len(rows))
			for _, r := range rows {
				out = append(out, egress.Event{Box: r.Session, Dest: r.Dest, Addr: r.Addr, Decision: r.Decision, Rule: r.Rule,
					Reason: r.Reason, BytesOut: r.BytesOut, BytesIn: r.BytesIn, Start: r.Start, Duration: r.Duration})
			}
			return &EgressLog{Session: s.ID, Entries: out}, nil
		}).InSession(capability.UseRead))
	a.registerPreview(reg)
	a.registerPorts(reg)
	a.registerSecrets(reg)
}

func (a *App) setSessionNetwork(ctx context.Context, in SetNetworkInput) (*SessionInfo, error) {
	// A session's own code may not open its way out.
	if c, ok := controller.CallerFrom(ctx); ok && c.Session != "" {
		return nil, capability.Errorf(capability.PermissionDenied, "code in a session cannot change a session's network")
	}
	s, err := entered(ctx)
	if err != nil {
		return nil, err
	}
	asked := in.Network
	if asked == "" {
		asked = s.Network
	}
	network, note, err := a.networkPolicy(ctx, s.Tenant, asked)
	if err != nil {
		return nil, err
	}
	rules, err := netRules(network, in.AllowOut, in.DenyOut)
	if err != nil {
		return nil, err
	}
	was, wasRules := s.Network, s.NetRules
	if err := a.Sessions.SetNetwork(ctx, s, network, rules); err != nil {
		return nil, err
	}
	if err := a.Sandbox.SetNetwork(s.ID, network); err != nil {
		_ = a.Sessions.SetNetwork(context.WithoutCancel(ctx), s, was, wasRules)
		if errors.Is(err, sandbox.ErrNetworkNeedsNewBox) {
			return nil, capability.Errorf(capability.Busy,
				"session %s has processes running with network %q: a running session moves between none and internet only; to or from host, create a session with network %q (nothing was changed)", s.Name, was, network)
		}
		return nil, err
	}
	a.netPolicies.set(s.ID, network, rules)
	info := a.sessionInfo(ctx, s)
	info.Note = note
	return info, nil
}
