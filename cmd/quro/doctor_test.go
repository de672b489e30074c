package main

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/quro-dev/quro/internal/sandbox"
)

// nobody is the unprivileged user the non-root tests run quro as.
const nobody = 65534

// nonRootQuro is a copy of this test binary (which is quro when called by
// that name) that uid 65534 can execute, with a home it owns.
type nonRootQuro struct {
	bin, home string
}

func newNonRootQuro(t *testing.T) *nonRootQuro {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to start quro as another user")
	}
	if _, err := exec.LookPath("setpriv"); err != nil {
		t.Skip("setpriv (util-linux) is missing")
	}
	// Not t.TempDir: its parent is private to root.
	dir, err := os.MkdirTemp("", "quro-nonroot-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	q := &nonRootQuro{bin: filepath.Join(dir, "quro"), home: filepath.Join(dir, "home")}
	src, err := os.Open(self)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	dst, err := os.OpenFile(q.bin, os.O_CREATE|os.O_WRONLY, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(dst, src); err != nil {
		t.Fatal(err)
	}
	if err := dst.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(q.home, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(q.home, nobody, nobody); err != nil {
		t.Fatal(err)
	}
	return q
}

// run runs quro as uid 65534, first moving the starting shell into the
// cgroup.procs files join (as root), and returns its output, stdout then
// stderr.
func (q *nonRootQuro) run(t *testing.T, join []string, args ...string) (string, error) {
	stdout, stderr, err := q.run2(t, join, args...)
	return stdout + stderr, err
}

func (q *nonRootQuro) run2(t *testing.T, join []string, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	argv := append([]string{"-c", `for p in $QURO_TEST_JOIN; do echo $$ > "$p" || exit 97; done; exec "$@"`, "sh",
		"setpriv", fmt.Sprintf("--reuid=%d", nobody), fmt.Sprintf("--regid=%d", nobody), "--clear-groups",
		"env", "-i", "HOME=" + q.home, "TMPDIR=" + q.home, "PATH=/usr/bin:/bin", "QURO_DATA=" + filepath.Join(q.home, "data"), q.bin}, args...)
	cmd := exec.Command("sh", argv...)
	cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "QURO_TEST_JOIN=" + strings.Join(join, " ")}
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err = cmd.Run()
	return out.String(), errOut.String(), err
}

type doctorReport struct {
	Engines []struct {
		Engine    string `json:"engine"`
		Available bool   `json:"available"`
		Reason    string `json:"reason"`
	} `json:"engines"`
	Isolation []sandbox.Feature `json:"isolation"`
}

func (q *nonRootQuro) doctor(t *testing.T, join []string, flags ...string) map[string]sandbox.Feature {
	t.Helper()
	out, errOut, err := q.run2(t, join, append(flags, "doctor", "--json")...)
	if err != nil {
		t.Fatalf("quro doctor as uid %d: %v\n%s%s", nobody, err, out, errOut)
	}
	var rep doctorReport
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("doctor --json: %v\n%s", err, out)
	}
	rows := map[string]sandbox.Feature{}
	for _, f := range rep.Isolation {
		rows[f.Name] = f
	}
	return rows
}

// TestDoctorNonRoot runs the built quro as an unprivileged user (uid 65534,
// as a person without root would) and checks that what doctor reports is
// what a run then gets: with no cgroup of its own the cgroups layer is
// missing and a run is refused with an error that names the ways out; with
// --isolation=minimal the run goes ahead, in a bubblewrap box exactly when
// doctor says user namespaces are used.
func TestDoctorNonRoot(t *testing.T) {
	t.Parallel() // its own copy of the binary, home and data directory
	q := newNonRootQuro(t)

	rows := q.doctor(t, nil)
	cg := rows["cgroups"]
	if cg.Available || cg.Used {
		t.Fatalf("doctor as uid %d says the cgroups layer is there; this process's cgroups belong to root: %+v", nobody, cg)
	}
	for _, want := range []string{"not writable", "permission denied", "MISSING (runs refused)", "run quro as root", "chown -R", "--isolation=minimal", "without per-run memory"} {
		if !strings.Contains(cg.Detail, want) {
			t.Errorf("doctor's cgroups row lacks %q: %s", want, cg.Detail)
		}
	}
	ns, userns := rows["namespaces"], rows["user namespaces"]
	if userns.Used != ns.Used {
		t.Errorf("user namespaces used=%v but the namespaces layer (bubblewrap) used=%v", userns.Used, ns.Used)
	}

	// Full isolation: refused, and the error says what to do.
	out, err := q.run(t, nil, "run", "--lang", "sh", "-c", "echo ran")
	if err == nil || strings.Contains(out, "ran\n") {
		t.Fatalf("a run as uid %d without cgroups went ahead under full isolation: %v\n%s", nobody, err, out)
	}
	for _, want := range []string{"isolation layer(s) missing", "cgroups:", "run quro as root", "chown -R", "--isolation=minimal"} {
		if !strings.Contains(out, want) {
			t.Errorf("the refused run's error lacks %q:\n%s", want, out)
		}
	}

	// Minimal: doctor says cgroups are not used, and the run goes ahead in
	// the box doctor promises (uid 1000 inside a user namespace) or, with
	// no box, as the server's own uid.
	rows = q.doctor(t, nil, "--isolation=minimal")
	if rows["cgroups"].Used {
		t.Errorf("doctor --isolation=minimal as uid %d says cgroups are used: %+v", nobody, rows["cgroups"])
	}
	out, errOut, err := q.run2(t, nil, "--isolation=minimal", "run", "--lang", "sh", "-c", "id -u")
	if err != nil {
		t.Fatalf("run --isolation=minimal as uid %d: %v\n%s%s", nobody, err, out, errOut)
	}
	want := fmt.Sprint(nobody)
	if rows["user namespaces"].Used {
		want = "1000"
	}
	if got := lastLine(out); got != want {
		t.Errorf("minimal run's uid = %q, doctor (user namespaces used=%v) means %s\n%s", got, rows["user namespaces"].Used, want, out)
	}
}

// TestDoctorNonRootDelegated gives uid 65534 a v1 cgroup subtree of its own
// (mkdir and chown -R by root, the setup the error and the README name)
// and checks that doctor then reports the cgroups layer, and that a run
// under full isolation works and makes its cgroups in that subtree.
func TestDoctorNonRootDelegated(t *testing.T) {
	t.Parallel() // its own copy of the binary and cgroups of its own name
	q := newNonRootQuro(t)
	own := v1Cgroups(t)
	var rnd [4]byte
	rand.Read(rnd[:])
	name := fmt.Sprintf("quro-test-%d-%x", os.Getpid(), rnd)
	var join []string
	memory := ""
	for _, ctrl := range []string{"memory", "pids", "cpu"} {
		path, ok := own[ctrl]
		if !ok {
			t.Skipf("no cgroup v1 %s hierarchy here: the chown delegation is the v1 setup", ctrl)
		}
		dir := filepath.Join(path, name)
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { removeCgroupTree(t, dir) })
		if err := filepath.WalkDir(dir, func(p string, _ fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			return os.Chown(p, nobody, nobody)
		}); err != nil {
			t.Fatal(err)
		}
		join = append(join, filepath.Join(dir, "cgroup.procs"))
		if ctrl == "memory" {
			memory = dir
		}
	}

	rows := q.doctor(t, join)
	if cg := rows["cgroups"]; !cg.Available || !cg.Used || !strings.Contains(cg.Detail, "memory v1") {
		t.Fatalf("doctor as uid %d in its own cgroups: %+v", nobody, cg)
	}
	out, _, err := q.run2(t, join, "run", "--lang", "sh", "-c", "id -u")
	if err != nil {
		t.Fatalf("full-isolation run as uid %d in its own cgroups: %v\n%s", nobody, err, out)
	}
	want := fmt.Sprint(nobody)
	if rows["user namespaces"].Used {
		want = "1000"
	}
	if got := lastLine(out); got != want {
		t.Errorf("run's uid = %q, want %s (doctor: user namespaces used=%v)\n%s", got, want, rows["user namespaces"].Used, out)
	}
	// The run's cgroups were made in the delegated subtree, by quro: its
	// quro/ parent there has been charged memory (v1 keeps the peak of
	// every cgroup beneath it; the run's and the tenant's own cgroups are
	// removed once the run and the App are done).
	b, err := os.ReadFile(filepath.Join(memory, "quro", "memory.max_usage_in_bytes"))
	if err != nil {
		t.Fatalf("no quro cgroup under %s after the run: the run did not use the delegated cgroups: %v", memory, err)
	}
	if peak, _ := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64); peak == 0 {
		t.Fatalf("nothing ran in %s/quro: the run did not use the delegated cgroups", memory)
	}
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.TrimSpace(lines[len(lines)-1])
}

// v1Cgroups maps each v1 controller to the directory of this process's
// cgroup in its hierarchy.
func v1Cgroups(t *testing.T) map[string]string {
	t.Helper()
	mnt := map[string]string{}
	f, err := os.Open("/proc/self/mounts")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fl := strings.Fields(sc.Text())
		if len(fl) >= 4 && fl[2] == "cgroup" {
			for _, o := range strings.Split(fl[3], ",") {
				mnt[o] = fl[1]
			}
		}
	}
	b, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, line := range strings.Split(string(b), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 || parts[1] == "" {
			continue
		}
		for _, ctrl := range strings.Split(parts[1], ",") {
			if m, ok := mnt[ctrl]; ok {
				out[ctrl] = filepath.Join(m, parts[2])
			}
		}
	}
	return out
}

// removeCgroupTree removes a cgroup and its children, deepest first. The
// processes that were in it have exited (each run is waited for).
func removeCgroupTree(t *testing.T, dir string) {
	var dirs []string
	filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			dirs = append(dirs, p)
		}
		return nil
	})
	for i := len(dirs) - 1; i >= 0; i-- {
		if err := os.Remove(dirs[i]); err != nil {
			t.Errorf("remove test cgroup: %v", err)
		}
	}
}
