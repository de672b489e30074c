// Package egress is a forward proxy for the server's own helpers that go
// to the network on a tenant's behalf (pip's fetch): it resolves a
// destination itself, refuses addresses of the host and its networks
// (loopback, link-local, private…) unless the operator named that exact
// host and port, and dials the very address it checked, so a name that
// resolves differently the second time gains nothing.
//
// Transparent is the same idea for a session box's own connections,
// which nftables redirects to it out of the box's network namespace:
// each is held to the session's Policy (none, internet, rules), its
// name (the box's DNS answers fake addresses that stand for names)
// checked against the TLS SNI or HTTP Host the box sends.
package egress

import (
	"net/netip"
)

// Classes of the addresses the proxy refuses (Class's answers).
const (
	Loopback    = "loopback"
	LinkLocal   = "link-local"
	Private     = "private"
	Unspecified = "unspecified"
	Multicast   = "multicast"
	SharedCGNAT = "shared (CGNAT 100.64.0.0/10)"
	Reserved    = "reserved"
)

var (
	cgnat = netip.MustParsePrefix("100.64.0.0/10")
	// Not routable on the internet, or the host's own: "this network",
	// the IETF protocol assignments (192.0.0.0/24 holds NAT64's and
	// DS-Lite's host addresses), benchmarking, and 240/4 with broadcast.
	reserved4 = []netip.Prefix{
		netip.MustParsePrefix("0.0.0.0/8"),
		netip.MustParsePrefix("192.0.0.0/24"),
		netip.MustParsePrefix("198.18.0.0/15"),
		netip.MustParsePrefix("240.0.0.0/4"),
	}
	// IPv6 prefixes that carry an IPv4 address: NAT64's well-known prefix
	// (the low 32 bits) and 6to4 (bits 16–48). The IPv4 inside decides.
	nat64   = netip.MustParsePrefix("64:ff9b::/96")
	sixTo4  = netip.MustParsePrefix("2002::/16")
	siteLoc = netip.MustParsePrefix("fec0::/10") // deprecated site-local
	// IPv4-compatible (::a.b.c.d, deprecated) and IPv4-translated
	// (::ffff:0:a.b.c.d, SIIT: ::ffff:0:0:0/96) addresses, and the local-use NAT64 prefix
	// (RFC 8215), which a site's translator may route to private IPv4.
	compat4   = netip.MustParsePrefix("::/96")
	transl4   = netip.MustParsePrefix("::ffff:0:0:0/96")
	nat64site = netip.MustParsePrefix("64:ff9b:1::/48")
)

// Class is why the proxy refuses to connect to a, or "" when a is a
// public address. An IPv4 address inside IPv6 (mapped, compatible,
// translated, NAT64, 6to4) is classified as that IPv4 address; the
// local-use NAT64 prefix is reserved.
func Class(a netip.Addr) string {
	if !a.IsValid() {
		return Unspecified
	}
	a = a.Unmap().WithZone("")
	if a.Is6() {
		b := a.As16()
		switch {
		case nat64.Contains(a), transl4.Contains(a),
			compat4.Contains(a) && !a.IsUnspecified() && !a.IsLoopback():
			return Class(netip.AddrFrom4([4]byte(b[12:16])))
		case nat64site.Contains(a):
			return Reserved
		case sixTo4.Contains(a):
			return Class(netip.AddrFrom4([4]byte(b[2:6])))
		case siteLoc.Contains(a):
			return Private
		}
	}
	switch {
	case a.IsUnspecified():
		return Unspecified
	case a.IsLoopback():
		return Loopback
	case a.IsLinkLocalUnicast(), a.IsLinkLocalMulticast():
		return LinkLocal // 169.254.0.0/16 (the cloud metadata service), fe80::/10
	case a.IsMulticast():
		return Multicast
	case a.IsPrivate():
		return Private // RFC 1918, fc00::/7
	case cgnat.Contains(a):
		return SharedCGNAT
	}
	if a.Is4() {
		for _, p := range reserved4 {
			if p.Contains(a) {
				return Reserved
			}
		}
	}
	return ""
}
