package boxinit

import (
	"container/heap"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// The box init is the quro binary re-executed (Arg): every package that
// Go initialises before this package's init hook is paid by every
// sandboxed process start and by every box's init, in time and in memory
// (one import of runtime/debug here moved the hook from 25 package inits
// to 189 and a box init's RSS to 48 MB). Go initialises packages in the
// order of their import paths among those whose imports are initialised
// (Go 1.21+), so what runs first is decided by this package's imports and
// by the binary's packages that sort before it. These tests keep both
// where they are today; check a change with
//
//	GODEBUG=inittrace=1 quro __quro_sandbox_init-probe 2>&1 | grep -c '^init '
//
// (25 package inits at the time of writing).

// boxinitImports are the only packages this package may import: small
// standard ones whose own imports are initialised early.
var boxinitImports = []string{"errors", "os", "runtime", "strconv", "sync", "syscall", "time", "unsafe"}

// maxInitsBefore bounds how many of the binary's packages are initialised
// before this one: 139 when it was written (of which 25 have init work),
// with room for a few more that sort before it.
const maxInitsBefore = 150

const self = "github.com/quro-dev/quro/internal/sandbox/boxinit"

func TestBoxInitImportsOnlyItsAllowlist(t *testing.T) {
	t.Parallel()
	out, err := exec.Command("go", "list", "-f", `{{join .Imports "\n"}}`, ".").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	for imp := range strings.FieldsSeq(string(out)) {
		if !slices.Contains(boxinitImports, imp) {
			t.Errorf("boxinit imports %s, which is not in its allowlist %v: every package it imports (and theirs) "+
				"must be initialised before its hook runs, which every sandboxed process start pays; "+
				"do without it, or measure with GODEBUG=inittrace=1 quro __quro_sandbox_init-probe and add it here", imp, boxinitImports)
		}
	}
}

func TestBoxInitRunsEarlyInTheQuroBinary(t *testing.T) {
	t.Parallel()
	out, err := exec.Command("go", "list", "-deps", "-f", `{{.ImportPath}} {{join .Imports " "}}`, "github.com/quro-dev/quro/cmd/quro").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	before, found := initsBefore(string(out), self)
	if !found {
		t.Fatalf("%s is not among the quro binary's packages", self)
	}
	if len(before) > maxInitsBefore {
		t.Errorf("%d packages of the quro binary are initialised before the box init's hook (at most %d): each is paid by every sandboxed process start. "+
			"Check which have init work with GODEBUG=inittrace=1 quro __quro_sandbox_init-probe; they are, in order:\n%s",
			len(before), maxInitsBefore, strings.Join(before, "\n"))
	}
}

// initsBefore lists the packages initialised before target in the binary
// whose packages and imports list gives ("path import import..." a line,
// as go list -deps prints them): Go's order, the first by import path of
// the packages whose imports are all initialised.
func initsBefore(list, target string) (before []string, found bool) {
	left := map[string]int{}
	users := map[string][]string{}
	for line := range strings.Lines(list) {
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		left[f[0]] += 0
		for _, d := range f[1:] {
			if d == "C" || d == "unsafe" { // no package to initialise
				continue
			}
			left[f[0]]++
			users[d] = append(users[d], f[0])
		}
	}
	var ready pathHeap
	for p, n := range left {
		if n == 0 {
			ready = append(ready, p)
		}
	}
	heap.Init(&ready)
	for ready.Len() > 0 {
		p := heap.Pop(&ready).(string)
		if p == target {
			return before, true
		}
		before = append(before, p)
		for _, u := range users[p] {
			if left[u]--; left[u] == 0 {
				heap.Push(&ready, u)
			}
		}
	}
	return before, false
}

type pathHeap []string

func (h pathHeap) Len() int           { return len(h) }
func (h pathHeap) Less(i, j int) bool { return h[i] < h[j] }
func (h pathHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *pathHeap) Push(x any)        { *h = append(*h, x.(string)) }
func (h *pathHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// The order initsBefore computes on a small graph: a package waits for
// its imports, and among the ready ones the first by path goes first.
func TestInitsBeforeOrder(t *testing.T) {
	t.Parallel()
	list := "a/late z\nb c\nc\nz\nm b\n"
	got, found := initsBefore(list, "m")
	if want := []string{"c", "b"}; !found || !slices.Equal(got, want) {
		t.Errorf("initsBefore = %q %v, want %q", got, found, want)
	}
	got, _ = initsBefore(list, "a/late")
	if want := []string{"c", "b", "m", "z"}; !slices.Equal(got, want) {
		t.Errorf("initsBefore a/late = %q, want %q", got, want)
	}
}
