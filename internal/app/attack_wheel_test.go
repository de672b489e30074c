package app

import (
	"encoding/base64"
	"fmt"
	"os"
	"strings"
	"testing"
)

// TestAttackWheelPlanting: a session of alice tries every route it has to
// plant a wheel (quroplant 9.9, a higher version than the index's 1.0) for
// a later pip install of another session of alice: writing it into every
// writable mount of its box and into the tenant's cache by its path and by
// paths relative to its home, hard-linking and symlinking the cache into
// its workspace, pip configurations (its home's, the system's) that add
// its own directory as a source, and install_packages of its own through
// those. Another session of alice then gets the index's package, by
// install_packages and by the shell's pip with network, and the cache
// holds only the index's wheel.
func TestAttackWheelPlanting(t *testing.T) {
	t.Parallel()
	real := pureWheel(t, "quroplant", "1.0", "real")
	fake := pureWheel(t, "quroplant", "9.9", "planted")
	ix := newTestIndex(t, real)
	a := pipApp(t, ix)
	wheels := a.pip.cache.Wheels("alice")

	evil := sessionAs(t, a, pipAlice, "evil", "", nil)
	r := runIn(t, a, pipAlice, RunCodeInput{Session: evil.ID, Code: fmt.Sprintf(`import base64, os
data = base64.b64decode(%q)
name = %q
wheels = %q
home = os.path.expanduser("~")
def attempt(what, f):
    try:
        f()
        print(what, "DONE")
    except OSError as e:
        print(what, "refused", type(e).__name__)
def put(d):
    def f():
        with open(os.path.join(d, name), "wb") as w:
            w.write(data)
    return f
# Into the cache by its path, its neighbours and from home upwards.
attempt("wheels", put(wheels))
attempt("by-hash", put(os.path.join(os.path.dirname(wheels), "by-hash")))
attempt("tenant dir", put(os.path.dirname(wheels)))
attempt("pip root", put(os.path.dirname(os.path.dirname(wheels))))
attempt("mkdir in cache", lambda: os.mkdir(os.path.join(wheels, "x")))
attempt("rename into cache", lambda: (put(home)(), os.rename(os.path.join(home, name), os.path.join(wheels, name))))
up = home
for i in range(6):
    up = os.path.join(up, "..")
    attempt("relative %%d" %% i, put(os.path.join(up, "pip", "t-alice", "wheels")))
# Every writable mount of the box gets the wheel at its root (a mount
# that were the cache's would show it on the host).
for line in open("/proc/self/mountinfo"):
    f = line.split()
    mp, opts = f[4], f[5].split(",")
    if "rw" in opts and not mp.startswith(("/proc", "/sys", "/dev")):
        attempt("mount " + mp, put(mp))
# Links: a hard link of a cached blob (the same inode) and a symlink.
for e in (os.listdir(wheels) if os.path.isdir(wheels) else []):
    attempt("hardlink " + e, lambda: os.link(os.path.join(wheels, e), os.path.join(home, "h-" + e)))
attempt("symlink", lambda: os.symlink(wheels, os.path.join(home, "cache-link")))
attempt("write through symlink", put(os.path.join(home, "cache-link")))
# pip configurations naming the session's own directory as a source.
plant = os.path.join(home, "plant")
os.makedirs(plant, exist_ok=True)
put(plant)()
conf = "[global]\nfind-links = %%s\nno-index = false\n" %% plant
for p in ["~/.config/pip/pip.conf", "~/.pip/pip.conf", "/etc/pip.conf", "/etc/xdg/pip/pip.conf"]:
    p = os.path.expanduser(p)
    def w(p=p):
        os.makedirs(os.path.dirname(p), exist_ok=True)
        with open(p, "w") as f:
            f.write(conf)
    attempt("conf " + p, w)
`, base64.StdEncoding.EncodeToString(fake.Data), fake.Name, wheels)})
	t.Logf("the planting session:\n%s%s", r.Stdout, r.Stderr)
	for _, l := range strings.Split(r.Stdout, "\n") {
		for _, target := range []string{"wheels ", "by-hash ", "tenant dir ", "pip root ", "mkdir in cache ", "rename into cache ", "write through symlink "} {
			if strings.HasPrefix(l, target) && strings.HasSuffix(l, " DONE") {
				t.Errorf("the box wrote the cache: %s", l)
			}
		}
	}
	// Its own install_packages through its configuration: pip of its own
	// box may take its own plant (its own user site), never into the cache.
	if res, err := installPip(t, a, pipAlice, evil.ID, "quroplant"); err != nil {
		t.Logf("the planting session's install_packages: %v", err)
	} else {
		t.Logf("the planting session's install_packages: from cache %v, wheels %v", res.FromCache, res.Wheels)
	}
	assertCacheHolds := func() {
		t.Helper()
		ents, err := os.ReadDir(wheels)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range ents {
			if e.Name() != real.Name {
				t.Fatalf("the tenant's cache holds %s", e.Name())
			}
			b, err := os.ReadFile(wheels + "/" + e.Name())
			if err != nil || string(b) != string(real.Data) {
				t.Fatalf("the cache's %s is not the index's: %v", e.Name(), err)
			}
		}
	}
	assertCacheHolds()

	// Another session of alice: install_packages, then the shell's pip
	// with network (which would take the highest version of every source).
	other := sessionAs(t, a, pipAlice, "other", "", nil)
	// What the planter's box could write (its /tmp, its home) is its own.
	if r := runIn(t, a, pipAlice, RunCodeInput{Session: other.ID, Lang: "bash", Code: "ls -a /tmp /home/user ~ ~/.config 2>&1"}); strings.Contains(r.Stdout, fake.Name) || strings.Contains(r.Stdout, "pip") {
		t.Fatalf("the other session sees the planter's files:\n%s", r.Stdout)
	}
	if _, err := installPip(t, a, pipAlice, other.ID, "quroplant"); err != nil {
		t.Fatal(err)
	}
	if r := runIn(t, a, pipAlice, RunCodeInput{Session: other.ID, Code: "import quroplant; print(quroplant.VALUE)"}); r.Stdout != "real\n" {
		t.Fatalf("the other session's install_packages got: %+v", r)
	}
	net := sessionAs(t, a, pipAlice, "net", "host", nil)
	r = runIn(t, a, pipAlice, RunCodeInput{Session: net.ID, Lang: "bash", Code: "pip install -q quroplant && python3 -c 'import quroplant; print(quroplant.VALUE)'"}) // runIn's budget: pip took over the default 30 s under load
	if r.ExitCode != 0 || !strings.HasSuffix(r.Stdout, "real\n") {
		t.Fatalf("the other session's shell pip got: %+v", r)
	}
	assertCacheHolds()
}
