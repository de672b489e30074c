package egress

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"
)

func TestParseRule(t *testing.T) {
	for in, want := range map[string]string{
		"pypi.org":               "pypi.org",
		"PyPI.Org.":              "pypi.org",
		"*.pythonhosted.org":     "*.pythonhosted.org",
		"github.com:443":         "github.com:443",
		"*.example.com:8443":     "*.example.com:8443",
		"_srv.example.com":       "_srv.example.com",
		"xn--bcher-kva.example":  "xn--bcher-kva.example",
		"203.0.113.7":            "203.0.113.7",
		"203.0.113.0/24":         "203.0.113.0/24",
		"203.0.113.9/24":         "203.0.113.0/24",
		"203.0.113.0/24:443":     "203.0.113.0/24:443",
		"203.0.113.7:22":         "203.0.113.7:22",
		"2001:db8::/32":          "2001:db8::/32",
		"2001:DB8::1":            "2001:db8::1",
		"[2001:db8::1]:443":      "[2001:db8::1]:443",
		"[2001:db8::/32]:443":    "[2001:db8::/32]:443",
		"::ffff:203.0.113.7":     "203.0.113.7",
		"::ffff:203.0.113.0/120": "203.0.113.0/24",
		"0.0.0.0/0":              "0.0.0.0/0",
	} {
		r, err := ParseRule(in)
		if err != nil {
			t.Errorf("ParseRule(%q): %v", in, err)
			continue
		}
		if got := r.String(); got != want {
			t.Errorf("ParseRule(%q).String() = %q, want %q", in, got, want)
		}
		if r2, err := ParseRule(r.String()); err != nil || r2 != r {
			t.Errorf("%q does not parse back: %v %v", r.String(), r2, err)
		}
	}
	for in, want := range map[string]string{
		"":                                "empty",
		"pypi .org":                       "spaces",
		" pypi.org":                       "spaces",
		"bücher.example":                  "xn--",
		"a..b":                            "empty label",
		".a.b":                            "empty label",
		"*":                               `"*"`,
		"*.":                              "empty domain",
		"a.*.b":                           `"*"`,
		"**.b":                            `"*"`,
		"*a.b":                            `"*"`,
		"a*.b":                            `"*"`,
		strings.Repeat("a", 64) + ".com":  "63",
		strings.Repeat("a.", 127) + "com": "253",
		"-a.com":                          "'-'",
		"a.com:0":                         "bad port",
		"a.com:65536":                     "bad port",
		"a.com:":                          "bad port",
		"a.com:x":                         "bad port",
		"a.com:080":                       "bad port",
		"203.0.113.0/33":                  "bad CIDR",
		"203.0.113.0/24:99999":            "bad port",
		"2001:db8::1:443x":                "bad port",
		"[2001:db8::1":                    "closing",
		"[203.0.113.7]:443":               "IPv6",
		"[2001:db8::1]443":                "[address]:port",
		"fe80::1%eth0":                    "",
		"1.2.3":                           "numeric",
		"a/b.com":                         "CIDR",
		"a_b!.com":                        "not allowed",
		"http://pypi.org":                 "",
		"2001:db8::/32:443":               "[address]:port",
	} {
		_, err := ParseRule(in)
		if err == nil {
			t.Errorf("ParseRule(%q) succeeded", in)
			continue
		}
		if !strings.Contains(err.Error(), want) || !strings.HasPrefix(err.Error(), "rule ") || strings.Contains(err.Error(), "\n") {
			t.Errorf("ParseRule(%q): %v (want it to say %q)", in, err, want)
		}
	}
}

func TestParsePolicy(t *testing.T) {
	p, err := ParsePolicy("", nil, nil)
	if err != nil || p.Mode != ModeInternet {
		t.Fatalf("default: %+v %v", p, err)
	}
	p, err = ParsePolicy(ModeInternet, []string{"pypi.org"}, []string{"10.0.0.0/8"})
	if err != nil || p.Mode != ModeRules || len(p.Allow) != 1 || len(p.Deny) != 1 {
		t.Fatalf("allow makes rules: %+v %v", p, err)
	}
	if _, err := ParsePolicy(ModeNone, []string{"pypi.org"}, nil); err == nil {
		t.Error("none with rules")
	}
	if _, err := ParsePolicy("open", nil, nil); err == nil || !strings.Contains(err.Error(), `"open"`) {
		t.Errorf("bad mode: %v", err)
	}
	if _, err := ParsePolicy(ModeRules, []string{"ok.org", "bad..org"}, nil); err == nil || !strings.Contains(err.Error(), `allow rule "bad..org"`) {
		t.Errorf("bad rule: %v", err)
	}
	many := make([]string, MaxRules+1)
	for i := range many {
		many[i] = fmt.Sprintf("h%d.example", i)
	}
	if _, err := ParsePolicy(ModeRules, many, nil); err == nil {
		t.Error("257 allow rules")
	}
	if _, err := ParsePolicy(ModeInternet, nil, many); err == nil {
		t.Error("257 deny rules")
	}
	if _, err := ParsePolicy(ModeRules, many[:MaxRules], many[:MaxRules]); err != nil {
		t.Errorf("256 rules: %v", err)
	}
}

func mustPolicy(t testing.TB, mode string, allow, deny []string) *Policy {
	t.Helper()
	p, err := ParsePolicy(mode, allow, deny)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestDecideName(t *testing.T) {
	rules := mustPolicy(t, ModeRules,
		[]string{"pypi.org", "*.pythonhosted.org", "github.com:443", "*.example.com"},
		[]string{"evil.example.com", "*.bad.example.com:443"})
	internet := mustPolicy(t, ModeInternet, nil, []string{"*.tracker.test", "blocked.test:80"})
	none := mustPolicy(t, ModeNone, nil, nil)
	for _, c := range []struct {
		p    *Policy
		name string
		port int
		ok   bool
		rule string
	}{
		{rules, "pypi.org", 443, true, "pypi.org"},
		{rules, "PyPI.org.", 80, true, "pypi.org"},
		{rules, "www.pypi.org", 443, false, "not in the allow list"},
		{rules, "files.pythonhosted.org", 443, true, "*.pythonhosted.org"},
		{rules, "a.b.pythonhosted.org", 443, true, "*.pythonhosted.org"},
		{rules, "pythonhosted.org", 443, false, "not in the allow list"},
		{rules, "xpythonhosted.org", 443, false, "not in the allow list"},
		{rules, "github.com", 443, true, "github.com:443"},
		{rules, "github.com", 22, false, "not in the allow list"},
		{rules, "evil.example.com", 443, false, "evil.example.com"},
		{rules, "good.example.com", 443, true, "*.example.com"},
		{rules, "x.bad.example.com", 443, false, "*.bad.example.com:443"},
		{rules, "x.bad.example.com", 80, true, "*.example.com"},
		{rules, "bad name", 80, false, "not a valid domain name"},
		{internet, "anything.test", 443, true, "internet"},
		{internet, "a.tracker.test", 443, false, "*.tracker.test"},
		{internet, "tracker.test", 443, true, "internet"},
		{internet, "blocked.test", 80, false, "blocked.test:80"},
		{internet, "blocked.test", 443, true, "internet"},
		{none, "pypi.org", 443, false, "network none"},
		{nil, "pypi.org", 443, false, "network none"},
	} {
		ok, rule := c.p.DecideName(c.name, c.port)
		if ok != c.ok || rule != c.rule {
			t.Errorf("%v DecideName(%q, %d) = %v %q, want %v %q", c.p, c.name, c.port, ok, rule, c.ok, c.rule)
		}
	}
}

func TestDecideAddr(t *testing.T) {
	rules := mustPolicy(t, ModeRules, []string{"203.0.113.0/24", "[2001:db8::/32]:443", "198.51.100.7:22", "10.9.0.0/16"}, []string{"203.0.113.66"})
	internet := mustPolicy(t, ModeInternet, nil, []string{"198.51.100.0/24:25", "2001:db8:bad::/48"})
	for _, c := range []struct {
		p    *Policy
		addr string
		port int
		ok   bool
		rule string
	}{
		{rules, "203.0.113.7", 443, true, "203.0.113.0/24"},
		{rules, "::ffff:203.0.113.7", 80, true, "203.0.113.0/24"},
		{rules, "203.0.113.66", 443, false, "203.0.113.66"},
		{rules, "203.0.114.1", 443, false, "not in the allow list"},
		{rules, "2001:db8::1", 443, true, "[2001:db8::/32]:443"},
		{rules, "2001:db8::1", 80, false, "not in the allow list"},
		{rules, "198.51.100.7", 22, true, "198.51.100.7:22"},
		{rules, "198.51.100.7", 23, false, "not in the allow list"},
		{rules, "10.9.1.1", 80, false, "private address"}, // a rule does not lift Class
		{internet, "8.8.8.8", 53, true, "internet"},
		{internet, "198.51.100.1", 25, false, "198.51.100.0/24:25"},
		{internet, "198.51.100.1", 587, true, "internet"},
		{internet, "2001:db8:bad::1", 443, false, "2001:db8:bad::/48"},
		{internet, "127.0.0.1", 80, false, "loopback address"},
		{internet, "169.254.169.254", 80, false, "link-local address"},
		{mustPolicy(t, ModeNone, nil, nil), "8.8.8.8", 53, false, "network none"},
	} {
		ok, rule := c.p.DecideAddr(netip.MustParseAddr(c.addr), c.port)
		if ok != c.ok || rule != c.rule {
			t.Errorf("DecideAddr(%s, %d) = %v %q, want %v %q", c.addr, c.port, ok, rule, c.ok, c.rule)
		}
	}
}

func FuzzParseRule(f *testing.F) {
	for _, s := range []string{"pypi.org", "*.a.b:443", "203.0.113.0/24:443", "[2001:db8::/32]:443", "::1", "a..b", "[::1", "1.2.3"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		r, err := ParseRule(s)
		if err != nil {
			if strings.Contains(err.Error(), "\n") {
				t.Fatalf("multi-line error %q", err)
			}
			return
		}
		r2, err := ParseRule(r.String())
		if err != nil || r2 != r {
			t.Fatalf("%q → %q does not parse back: %+v %v", s, r.String(), r2, err)
		}
		if r.Domain != "" && (len(r.Domain) > 253 || strings.ContainsAny(r.Domain, "* ")) {
			t.Fatalf("%q: domain %q", s, r.Domain)
		}
	})
}

// TestDecideLookup: the box's DNS answers a name an allow rule names at
// any port (a port rule must not leave its name unresolvable), and
// refuses only names a port-less deny rule names.
func TestDecideLookup(t *testing.T) {
	rules := mustPolicy(t, ModeRules, []string{"github.com:443", "*.pythonhosted.org"}, []string{"bad.pythonhosted.org", "evil.test:80"})
	internet := mustPolicy(t, ModeInternet, nil, []string{"evil.test:80", "worse.test"})
	for _, c := range []struct {
		p    *Policy
		name string
		want bool
	}{
		{rules, "github.com", true},
		{rules, "GitHub.com.", true},
		{rules, "files.pythonhosted.org", true},
		{rules, "bad.pythonhosted.org", false},
		{rules, "pythonhosted.org", false},
		{rules, "gitlab.com", false},
		{internet, "evil.test", true}, // its port 80 is denied, not its name
		{internet, "worse.test", false},
		{internet, "example.com", true},
		{&Policy{Mode: ModeNone}, "example.com", false},
	} {
		if ok, rule := c.p.DecideLookup(c.name); ok != c.want {
			t.Errorf("%s under %s: %v (%s), want %v", c.name, c.p.Mode, ok, rule, c.want)
		}
	}
}
