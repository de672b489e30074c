package main

import (
	"bytes"
	"encoding/json"
	"os"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/quro-dev/quro/internal/api/insession"
)

func TestParseApt(t *testing.T) {
	for _, tc := range []struct {
		args []string
		verb string
		pkgs []string
	}{
		{[]string{"install", "-y", "jq"}, "install", []string{"jq"}},
		{[]string{"-y", "-q", "--no-install-recommends", "install", "jq", "tree=2.1.0-1"}, "install", []string{"jq", "tree=2.1.0-1"}},
		{[]string{"-o", "Dpkg::Options::=--force-confold", "install", "jq"}, "install", []string{"jq"}},
		{[]string{"-t", "bookworm-backports", "install", "jq"}, "install", []string{"jq"}},
		{[]string{"update"}, "update", nil},
		{nil, "", nil},
	} {
		verb, pkgs := parseApt(tc.args)
		if verb != tc.verb || !slices.Equal(pkgs, tc.pkgs) {
			t.Errorf("%q: %q %q, want %q %q", tc.args, verb, pkgs, tc.verb, tc.pkgs)
		}
	}
}

// Outside a session's box there is no server socket: the stand-in says
// what to do instead of failing obscurely.
func TestAptShimWithoutAServer(t *testing.T) {
	if _, err := os.Stat(insession.SocketInBox); err == nil {
		t.Skip(insession.SocketInBox + " exists here")
	}
	var out, errb bytes.Buffer
	if code := aptShim("apt-get", []string{"install", "-y", "jq"}, &out, &errb); code != 100 {
		t.Fatalf("exit %d", code)
	}
	if msg := errb.String(); !strings.Contains(msg, "no quro server is reachable to install jq") || !strings.Contains(msg, "install_packages") {
		t.Fatalf("%q", msg)
	}
}

// FuzzAptInstallRequest: whatever argv code in a box gives apt-get, the
// request sent to the server holds only a packages list, each an argument
// the box gave after the verb install, never one that starts with '-'
// (an option) and never empty.
func FuzzAptInstallRequest(f *testing.F) {
	for _, args := range [][]string{
		{"install", "-y", "jq"},
		{"-o", "APT::Get::AllowUnauthenticated=1", "install", "cowsa."},
		{"install", "--reinstall", "jq-", "g++", "-oDpkg::Options::=--force-all"},
		{"-t", "install", "update"},
		{"install", "-o"},
		{"install"},
		{"remove", "coreutils"},
		{"install", "a\x00b", "", "-", "--"},
	} {
		f.Add(strings.Join(args, "\x1f"))
	}
	f.Fuzz(func(t *testing.T, joined string) {
		args := strings.Split(joined, "\x1f")
		req, pkgs, ok := aptInstallRequest(args)
		if !ok {
			if req != nil || pkgs != nil {
				t.Fatalf("not ok, yet %q %q", req, pkgs)
			}
			return
		}
		var in struct {
			Packages []string `json:"packages"`
		}
		dec := json.NewDecoder(bytes.NewReader(req))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&in); err != nil {
			t.Fatalf("request %s: %v", req, err)
		}
		if len(in.Packages) == 0 || len(in.Packages) != len(pkgs) {
			t.Fatalf("request %s for %q", req, pkgs)
		}
		verbAt := slices.Index(args, "install")
		for i, p := range in.Packages {
			if p == "" || strings.HasPrefix(p, "-") {
				t.Fatalf("%q passed as a package from %q", p, args)
			}
			if !slices.Contains(args[verbAt+1:], p) && !strings.ContainsRune(p, utf8.RuneError) {
				t.Fatalf("%q (#%d) is not an argument after install in %q", p, i, args)
			}
		}
	})
}
