package sandbox

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// TestLoginPathKept: a login shell sourcing the box's /etc/profile (a
// Debian one, which sets a fixed PATH, then a profile.d script adding a
// directory) keeps the PATH it was started with first, the profile's
// additions after, in bash and in dash, and leaves no variable of its own
// nor a changed IFS behind.
func TestLoginPathKept(t *testing.T) {
	debian := `PATH="/usr/local/bin:/usr/bin:/bin:/usr/local/games:/usr/games"
export PATH
PATH="$PATH:/opt/tool bin"
`
	f := filepath.Join(t.TempDir(), "profile")
	if err := os.WriteFile(f, []byte(loginPathKept(debian)), 0o644); err != nil {
		t.Fatal(err)
	}
	const start = "/run/quro/bin:/data/python/3.14/quro-bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
	want := start + ":/usr/local/games:/usr/games:/opt/tool bin|" + "set:no"
	for _, sh := range []string{"bash", "dash"} {
		path, err := exec.LookPath(sh)
		if err != nil {
			t.Logf("no %s here", sh)
			continue
		}
		script := `ifs=$IFS; . "$1"; printf '%s|' "$PATH"; [ "$IFS" = "$ifs" ] && printf set: ; env | grep -q __quro && echo leaked || echo no`
		cmd := exec.Command(path, "-c", script, sh, f)
		cmd.Env = []string{"PATH=" + start}
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("%s: %v", sh, err)
		}
		if got := string(out[:len(out)-1]); got != want {
			t.Errorf("%s: PATH after the profile\n got %q\nwant %q", sh, got, want)
		}
	}
}

// TestProfileOfRootfsReadInIt: the attack of a rootfs whose /etc/profile
// is a link to a host file (a rootfs is changed by apt in install boxes):
// the server reads the profile it shows a box as the box would, inside
// the rootfs, so the link's target is the rootfs's own file (or none),
// never the host's.
func TestProfileOfRootfsReadInIt(t *testing.T) {
	secret := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(secret, []byte("host secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "etc"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, target := range []string{secret, "../../../../../../.." + secret} {
		link := filepath.Join(root, profilePath)
		os.Remove(link)
		if err := os.Symlink(target, link); err != nil {
			t.Fatal(err)
		}
		b, err := readSmall(func() (*os.File, error) { return openInRoot(root, profilePath) })
		if !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("link to %s: read %q, %v; want no such file (the target is looked up in the rootfs)", target, b, err)
		}
	}
	// The same path inside the rootfs is what it reads.
	inside := filepath.Join(root, secret)
	if err := os.MkdirAll(filepath.Dir(inside), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(inside, []byte("PATH=/rootfs\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	b, err := readSmall(func() (*os.File, error) { return openInRoot(root, profilePath) })
	if err != nil || string(b) != "PATH=/rootfs\n" {
		t.Fatalf("read %q, %v; want the rootfs's own file", b, err)
	}
}

// TestLoginProfileAsksBashForTheUID: Debian's profile chooses root's PATH
// by "$(id -u)"; in the box's copy a login bash takes its $EUID instead
// (no fork and exec of id in each E2B commands.run) and chooses the same
// branch, while dash, which has no EUID, still asks id. The id on PATH
// here records that it ran.
func TestLoginProfileAsksBashForTheUID(t *testing.T) {
	debian := `if [ "$(id -u)" -eq 0 ]; then
  PATH="/root/bin"
else
  PATH="/user/bin"
fi
export PATH
`
	dir := t.TempDir()
	f := filepath.Join(dir, "profile")
	if err := os.WriteFile(f, []byte(loginPathKept(debian)), 0o644); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "bin")
	if err := os.Mkdir(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	ran := filepath.Join(dir, "id-ran")
	if err := os.WriteFile(filepath.Join(bin, "id"), []byte("#!/bin/sh\n: >>"+ran+"\nexec /usr/bin/id \"$@\"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	want := bin + ":/user/bin"
	if os.Geteuid() == 0 {
		want = bin + ":/root/bin"
	}
	for _, c := range []struct {
		sh    string
		askID bool
	}{{"bash", false}, {"dash", true}} {
		path, err := exec.LookPath(c.sh)
		if err != nil {
			t.Logf("no %s here", c.sh)
			continue
		}
		os.Remove(ran)
		cmd := exec.Command(path, "-c", `. "$1"; printf %s "$PATH"`, c.sh, f)
		cmd.Env = []string{"PATH=" + bin}
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("%s: %v", c.sh, err)
		}
		if string(out) != want {
			t.Errorf("%s: PATH after the profile %q, want %q", c.sh, out, want)
		}
		if _, err := os.Stat(ran); (err == nil) != c.askID {
			t.Errorf("%s: id ran: %v, want %v", c.sh, err == nil, c.askID)
		}
	}
}
