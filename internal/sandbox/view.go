package sandbox

import (
	"cmp"
	"path/filepath"
	"slices"

	"github.com/quro-dev/quro/internal/hostpath"
)

// The box's view of the session's writable directories: a directory that
// a writable bind shows elsewhere (the workspace at HomeUser) or that is
// the run's TmpDir (shown at BoxTmp) is bound there only, never at its
// host path, so that nothing in the box (its mount table, a working
// directory, an environment variable, /etc/passwd, a program's argv)
// names the server's data directory. The paths the server hands a run
// (Dir, HOME, the environment's values, the arguments) are translated at
// this boundary: the server keeps its host paths, the box sees its own.

// viewsOf are the views of a box whose writable directories are writable,
// with binds and the directory tmp shown at BoxTmp ("" for none): each a
// host directory Src shown at Dst, the longest Src first.
func viewsOf(writable []string, binds []Bind, tmp string) []Bind {
	var v []Bind
	for _, bd := range binds {
		if bd.Writable && slices.ContainsFunc(writable, func(d string) bool { return beneath(filepath.Clean(bd.Src), d) }) {
			v = append(v, Bind{Src: filepath.Clean(bd.Src), Dst: filepath.Clean(bd.Dst), Writable: true})
		}
	}
	if tmp != "" {
		v = append(v, Bind{Src: filepath.Clean(tmp), Dst: BoxTmp, Writable: true})
	}
	slices.SortStableFunc(v, func(a, b Bind) int { return cmp.Compare(len(b.Src), len(a.Src)) })
	return slices.Compact(v)
}

// hidden reports whether the box with views shows the host directory d
// only through one of them (and so not at its host path).
func hidden(views []Bind, d string) bool {
	return slices.ContainsFunc(views, func(v Bind) bool { return beneath(d, v.Src) })
}

// inView is where a box with views shows the host path p: beneath the Dst
// of the view whose Src holds it; else p.
func inView(views []Bind, p string) string {
	for _, v := range views {
		if beneath(p, v.Src) {
			if rel, err := filepath.Rel(v.Src, filepath.Clean(p)); err == nil {
				return filepath.Join(v.Dst, rel)
			}
		}
	}
	return p
}

// viewText is s with every host path beneath a view's Src named as the box
// shows it (an argument, a variable's value: "-c", "cd /d/ws/a && …").
func viewText(views []Bind, s string) string {
	for _, v := range views {
		s = hostpath.Replace(v.Src, v.Dst, s)
	}
	return s
}

// viewArgs is args through viewText, args itself when nothing changes.
func viewArgs(views []Bind, args []string) []string {
	var out []string
	for i, a := range args {
		if t := viewText(views, a); t != a && out == nil {
			out = slices.Clone(args)
			out[i] = t
		} else if out != nil {
			out[i] = t
		}
	}
	if out == nil {
		return args
	}
	return out
}

// view sets the views of pl's box, whose binds are binds, and names by
// them what the program is told: its arguments and its environment (HOME
// among it); its directory is named where the box enters it. A run
// outside a box has none.
func (pl *plan) view(binds []Bind) {
	if !pl.boxed {
		return
	}
	pl.views = viewsOf(pl.writable, binds, pl.tmp)
	if args := viewArgs(pl.views, pl.spec.Args); !slices.Equal(args, pl.spec.Args) {
		c := *pl.spec
		c.Args = args
		pl.spec, pl.prog = &c, c.Args[0]
	}
	for i, kv := range pl.env {
		pl.env[i] = viewText(pl.views, kv)
	}
}

// ViewPath is where a run of s sees the host path p of one of its
// session's writable directories: beneath the Dst of a writable bind of
// s (Options.Binds, ForSession's: the workspace at HomeUser) that holds
// it, when its runs start in a box; else p. For a path the server hands a
// program through a pipe rather than its Spec (a worker's directory).
func (s *Sandbox) ViewPath(p string) string {
	if s == nil || !s.Boxed() {
		return p
	}
	var writable []string
	for _, bd := range s.binds {
		if bd.Writable {
			writable = append(writable, filepath.Clean(bd.Src))
		}
	}
	return inView(viewsOf(writable, s.binds, ""), p)
}
