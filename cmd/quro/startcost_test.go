package main

import (
	"bufio"
	"bytes"
	"os/exec"
	"strconv"
	"strings"
	"testing"
)

// TestStartAllocatesLittleInInit: every quro process that gets past the
// early hooks (the box's init, spawners, init child and file helper leave
// before: boxinit's footprint_test) runs the whole binary's package
// initialisation before its main — the server, each CLI command, and in a
// box the esbuild child of each TS/JS transform and the pip, apt-get and
// sudo stand-ins. No package may do sizeable work there that only some
// process uses: chroma's lexers and styles packages (which parse all their
// definitions at start; render builds its own on first use) are not
// linked, and no package's initialisation allocates 1 MiB or more (the
// Python archive's copy did: 4.2 MB). Read from Go's own trace
// (GODEBUG=inittrace=1) of this binary run as quro.
func TestStartAllocatesLittleInInit(t *testing.T) {
	t.Parallel()
	cmd := exec.Command(quroBin(t), "--help")
	cmd.Env = append(cliEnv(), "GODEBUG=inittrace=1")
	var errb bytes.Buffer
	cmd.Stderr = &errb
	if err := cmd.Run(); err != nil {
		t.Fatalf("quro --help: %v: %s", err, errb.String())
	}
	// init PKG @T ms, D ms clock, BYTES bytes, N allocs
	var pkgs, total int
	sc := bufio.NewScanner(&errb)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 10 || f[0] != "init" || f[8] != "bytes," {
			continue
		}
		pkgs++
		n, err := strconv.Atoi(f[7])
		if err != nil {
			t.Fatalf("%q: %v", sc.Text(), err)
		}
		total += n
		if strings.HasPrefix(f[1], "github.com/alecthomas/chroma/v2/lexers") || strings.HasPrefix(f[1], "github.com/alecthomas/chroma/v2/styles") {
			t.Errorf("%s is linked: it parses all of chroma's definitions in every quro process's start (%d bytes)", f[1], n)
		}
		if n >= 1<<20 {
			t.Errorf("%s allocates %d bytes in its initialisation; do that work on first use", f[1], n)
		}
	}
	if pkgs < 100 {
		t.Fatalf("read %d packages' initialisation from GODEBUG=inittrace=1; stderr:\n%s", pkgs, errb.String())
	}
	t.Logf("%d packages initialised, %d bytes allocated", pkgs, total)
}
