package main

import (
	"bytes"
	"os"
	"slices"
	"strings"
	"testing"

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
