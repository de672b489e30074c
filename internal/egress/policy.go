package egress

import (
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
)

// Network modes of a Policy.
const (
	ModeNone     = "none"     // no connection at all
	ModeInternet = "internet" // any public address, less the deny rules
	ModeRules    = "rules"    // only what an allow rule names, less the deny rules
)

// MaxRules bounds each of a policy's rule lists.
const MaxRules = 256

// Policy is a session's network policy as the egress applies it.
type Policy struct {
	Mode  string // ModeNone, ModeInternet or ModeRules
	Allow []Rule // ModeRules: only what a rule names
	Deny  []Rule // any mode but none: deny wins
	// Trusted are host:port pairs (as TransparentOptions.Trusted: the
	// name and port a connection was made for) whose addresses this
	// policy admits even where Class or the server's own addresses would
	// refuse them. Only the server sets it, for its own helpers (pip's
	// fetch: the configured indexes); a session's policy has none.
	Trusted []string
}

// trusts is whether p trusts hostport (lower case, as key makes it).
func (p *Policy) trusts(hostport string) bool {
	if p == nil {
		return false
	}
	for _, t := range p.Trusted {
		if k, ok := key(t); ok && k == hostport {
			return true
		}
	}
	return false
}

// Rule is the parsed form of one rule string: a domain (exact, or any
// subdomain of it when Wildcard) or an address prefix, and a port or
// any (0).
type Rule struct {
	Domain   string       // lower-case, without the "*." of a wildcard; "" for an address rule
	Wildcard bool         // "*.example.org": any subdomain, not the apex
	Prefix   netip.Prefix // an address rule's prefix (a single address is /32 or /128)
	Port     int          // 0: any port
}

// ParseRule parses one rule: a domain ("pypi.org"), a wildcard domain
// ("*.pythonhosted.org": any subdomain, not the apex), either with
// ":port" ("github.com:443"), an IP address or CIDR ("203.0.113.7",
// "203.0.113.0/24", "2001:db8::/32"), with a port as "203.0.113.0/24:443",
// "[2001:db8::1]:443" or "[2001:db8::/32]:443".
func ParseRule(s string) (Rule, error) {
	r, err := parseRule(s)
	if err != nil {
		return Rule{}, fmt.Errorf("rule %q: %v", truncate(s, 80), err)
	}
	return r, nil
}

func parseRule(s string) (Rule, error) {
	if s == "" {
		return Rule{}, errors.New("empty")
	}
	if len(s) > 300 {
		return Rule{}, errors.New("too long")
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; c <= ' ' || c >= 0x7f {
			return Rule{}, errors.New("only printable ASCII without spaces (write an international domain in its xn-- form)")
		}
	}
	// An address or prefix with no port: v6 has colons of its own.
	if r, ok, err := parseNet(s); ok && err == nil {
		return r, nil
	}
	host, port := s, 0
	if strings.HasPrefix(s, "[") {
		end := strings.IndexByte(s, ']')
		if end < 0 {
			return Rule{}, errors.New("no closing ]")
		}
		host, rest := s[1:end], s[end+1:]
		if rest != "" {
			if !strings.HasPrefix(rest, ":") {
				return Rule{}, errors.New("want [address]:port")
			}
			var err error
			if port, err = parsePort(rest[1:]); err != nil {
				return Rule{}, err
			}
		}
		r, ok, err := parseNet(host)
		if err != nil {
			return Rule{}, err
		}
		if !ok || !r.Prefix.Addr().Is6() {
			return Rule{}, errors.New("brackets hold an IPv6 address or prefix")
		}
		r.Port = port
		return r, nil
	}
	if i := strings.LastIndexByte(s, ':'); i >= 0 {
		var err error
		if port, err = parsePort(s[i+1:]); err != nil {
			return Rule{}, err
		}
		host = s[:i]
		if strings.Contains(host, ":") {
			return Rule{}, errors.New("an IPv6 address with a port is written [address]:port")
		}
	}
	if r, ok, err := parseNet(host); ok || err != nil {
		r.Port = port
		return r, err
	}
	r := Rule{Port: port}
	if strings.HasPrefix(host, "*.") {
		r.Wildcard, host = true, host[2:]
	}
	d, err := normalizeDomain(host)
	if err != nil {
		return Rule{}, err
	}
	r.Domain = d
	return r, nil
}

// parseNet parses an address or a prefix; ok is false when s is neither
// (and looks like neither), err when s looks like one but is wrong.
func parseNet(s string) (Rule, bool, error) {
	if strings.Contains(s, "/") {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return Rule{}, false, errors.New("bad CIDR (want address/bits, no zone)")
		}
		if p.Addr().Is4In6() {
			p = netip.PrefixFrom(p.Addr().Unmap(), max(p.Bits()-96, 0))
		}
		return Rule{Prefix: p.Masked()}, true, nil
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		if strings.Contains(s, "%") {
			return Rule{}, false, errors.New("an address with a zone")
		}
		return Rule{}, false, nil
	}
	if a.Zone() != "" {
		return Rule{}, false, errors.New("an address with a zone")
	}
	a = a.Unmap()
	return Rule{Prefix: netip.PrefixFrom(a, a.BitLen())}, true, nil
}

func parsePort(s string) (int, error) {
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 || n > 65535 || s[0] == '0' || s[0] == '+' {
		return 0, fmt.Errorf("bad port %q (want 1-65535)", truncate(s, 10))
	}
	return n, nil
}

// normalizeDomain is name in lower case without a trailing dot, or why
// it is no domain name.
func normalizeDomain(name string) (string, error) {
	name = strings.TrimSuffix(name, ".")
	switch {
	case name == "":
		return "", errors.New("empty domain")
	case len(name) > 253:
		return "", errors.New("domain longer than 253 characters")
	case strings.Contains(name, "*"):
		return "", errors.New(`"*" is allowed only as a leading "*."`)
	}
	b := []byte(name)
	labels := strings.Split(name, ".")
	for _, l := range labels {
		if l == "" {
			return "", errors.New("empty label in domain")
		}
		if len(l) > 63 {
			return "", errors.New("domain label longer than 63 characters")
		}
		if l[0] == '-' || l[len(l)-1] == '-' {
			return "", errors.New("domain label begins or ends with '-'")
		}
	}
	for i, c := range b {
		switch {
		case c >= 'A' && c <= 'Z':
			b[i] = c + 'a' - 'A'
		case c >= 'a' && c <= 'z', c >= '0' && c <= '9', c == '-', c == '.', c == '_':
		default:
			return "", fmt.Errorf("character %q not allowed in a domain", c)
		}
	}
	last := labels[len(labels)-1]
	if strings.Trim(last, "0123456789") == "" {
		return "", errors.New("not an address and not a domain (numeric top label)")
	}
	return string(b), nil
}

// String is r's canonical form, which ParseRule parses back to r.
func (r Rule) String() string {
	var h string
	switch {
	case r.Domain != "":
		h = r.Domain
		if r.Wildcard {
			h = "*." + h
		}
	case !r.Prefix.IsValid():
		return "<invalid rule>"
	case r.Prefix.IsSingleIP():
		h = r.Prefix.Addr().String()
	default:
		h = r.Prefix.String()
	}
	if r.Port == 0 {
		return h
	}
	if r.Domain == "" && r.Prefix.Addr().Is6() {
		h = "[" + h + "]"
	}
	return h + ":" + strconv.Itoa(r.Port)
}

func (r Rule) portOK(port int) bool { return r.Port == 0 || r.Port == port }

// matchName is whether r names name (normalized) and port.
func (r Rule) matchName(name string, port int) bool {
	if r.Domain == "" || !r.portOK(port) {
		return false
	}
	if r.Wildcard {
		return len(name) > len(r.Domain)+1 && strings.HasSuffix(name, r.Domain) && name[len(name)-len(r.Domain)-1] == '.'
	}
	return name == r.Domain
}

// matchAddr is whether r's prefix holds a (unmapped) and port.
func (r Rule) matchAddr(a netip.Addr, port int) bool {
	return r.Domain == "" && r.Prefix.IsValid() && r.portOK(port) && r.Prefix.Contains(a.Unmap().WithZone(""))
}

// ParsePolicy is mode with its rules; mode "" is internet, and a
// non-empty allow list means ModeRules whatever mode says (but none).
func ParsePolicy(mode string, allow, deny []string) (*Policy, error) {
	switch mode {
	case "", ModeInternet, ModeRules:
		if len(allow) > 0 {
			mode = ModeRules
		} else if mode == "" {
			mode = ModeInternet
		}
	case ModeNone:
		if len(allow)+len(deny) > 0 {
			return nil, errors.New("network none takes no allow or deny rules")
		}
		return &Policy{Mode: ModeNone}, nil
	default:
		return nil, fmt.Errorf("network mode %q: want none, internet or rules", truncate(mode, 40))
	}
	p := &Policy{Mode: mode}
	var err error
	if p.Allow, err = parseRules("allow", allow); err != nil {
		return nil, err
	}
	if p.Deny, err = parseRules("deny", deny); err != nil {
		return nil, err
	}
	return p, nil
}

func parseRules(list string, ss []string) ([]Rule, error) {
	if len(ss) > MaxRules {
		return nil, fmt.Errorf("%d %s rules, at most %d", len(ss), list, MaxRules)
	}
	var rs []Rule
	for _, s := range ss {
		r, err := ParseRule(s)
		if err != nil {
			return nil, fmt.Errorf("%s %w", list, err)
		}
		rs = append(rs, r)
	}
	return rs, nil
}

// Reasons a Policy gives.
const (
	reasonNone      = "network none"
	reasonNotListed = "not in the allow list"
	reasonBadName   = "not a valid domain name"
)

// DecideName is whether the box may connect to name:port (a name from
// DNS, SNI or Host); rule is the matching rule's String() or the reason.
func (p *Policy) DecideName(name string, port int) (ok bool, rule string) {
	ok, r, reason := p.decideName(name, port)
	if r != nil {
		return ok, r.String()
	}
	return ok, reason
}

func (p *Policy) decideName(name string, port int) (bool, *Rule, string) {
	if p == nil || p.Mode == ModeNone || p.Mode == "" {
		return false, nil, reasonNone
	}
	n, err := normalizeDomain(name)
	if err != nil {
		return false, nil, reasonBadName
	}
	for i := range p.Deny {
		if p.Deny[i].matchName(n, port) {
			return false, &p.Deny[i], ""
		}
	}
	if p.Mode == ModeInternet {
		return true, nil, ModeInternet
	}
	for i := range p.Allow {
		if p.Allow[i].matchName(n, port) {
			return true, &p.Allow[i], ""
		}
	}
	return false, nil, reasonNotListed
}

// DecideLookup is whether the box's DNS may answer for name: a name some
// connection to it could be allowed to, at any port. An allow rule with a
// port ("github.com:443") lets the name resolve; only a deny rule without
// a port refuses it (one with a port refuses that port's connections).
func (p *Policy) DecideLookup(name string) (ok bool, rule string) {
	if p == nil || p.Mode == ModeNone || p.Mode == "" {
		return false, reasonNone
	}
	n, err := normalizeDomain(name)
	if err != nil {
		return false, reasonBadName
	}
	for _, r := range p.Deny {
		if r.Port == 0 && r.matchName(n, 0) {
			return false, r.String()
		}
	}
	if p.Mode == ModeInternet {
		return true, ModeInternet
	}
	for _, r := range p.Allow {
		if r.matchName(n, r.Port) {
			return true, r.String()
		}
	}
	return false, reasonNotListed
}

// DecideAddr is whether the box may connect to a:port by address (an IP
// literal, or the address a name resolved to): the address must be
// public (Class "") and no deny rule's prefix may hold it; under
// ModeRules an allow rule's prefix must hold it too. rule is the
// matching rule's String() or the reason.
func (p *Policy) DecideAddr(a netip.Addr, port int) (ok bool, rule string) {
	ok, r, reason := p.decideAddr(a, port)
	if ok {
		if cl := Class(a); cl != "" {
			return false, cl + " address"
		}
	}
	if r != nil {
		return ok, r.String()
	}
	return ok, reason
}

// decideAddr is DecideAddr without the Class check (which the
// transparent proxy makes itself, with the operator's exceptions).
func (p *Policy) decideAddr(a netip.Addr, port int) (bool, *Rule, string) {
	if p == nil || p.Mode == ModeNone || p.Mode == "" {
		return false, nil, reasonNone
	}
	if r := p.denyAddr(a, port); r != nil {
		return false, r, ""
	}
	if p.Mode == ModeInternet {
		return true, nil, ModeInternet
	}
	for i := range p.Allow {
		if p.Allow[i].matchAddr(a, port) {
			return true, &p.Allow[i], ""
		}
	}
	return false, nil, reasonNotListed
}

// denyAddr is the deny rule whose prefix holds a:port, or nil.
func (p *Policy) denyAddr(a netip.Addr, port int) *Rule {
	for i := range p.Deny {
		if p.Deny[i].matchAddr(a, port) {
			return &p.Deny[i]
		}
	}
	return nil
}

// denyNames is whether a deny rule names domains (then the transparent
// proxy checks SNI and Host under internet too).
func (p *Policy) denyNames() bool {
	for _, r := range p.Deny {
		if r.Domain != "" {
			return true
		}
	}
	return false
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}
