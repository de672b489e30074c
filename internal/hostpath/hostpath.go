// Package hostpath keeps the server's host paths out of the text a tenant
// reads: the errors of the server's own system calls, the cgroups it
// makes, its data directory, an installer's output. The whole text stays
// in the server log.
package hostpath

import (
	"path"
	"strings"
)

// Names replaces every absolute path in s with its last element:
// "mkdir /sys/fs/cgroup/memory/quro/run-1: permission denied" reads
// "mkdir run-1: permission denied". A path starts at a '/' at the start
// of s or after a space, a quote, '(', '[', '{', '<', '=', ',' or ':'
// (a list such as PATH's), except a URL's "://", and ends at a space, a
// quote, ':', ';', ',', ')', ']', '}' or '>'. A host path with a space in
// it keeps what follows the space. It is for text the server wrote about its host, never for
// paths inside a box, which a tenant needs whole.
func Names(s string) string {
	if !strings.Contains(s, "/") {
		return s
	}
	var b strings.Builder
	b.Grow(len(s))
	for i := 0; i < len(s); {
		if s[i] != '/' || (i > 0 && !strings.ContainsRune(" \t\n\"'`([{<=,:", rune(s[i-1]))) ||
			(i > 0 && s[i-1] == ':' && i+1 < len(s) && s[i+1] == '/') {
			b.WriteByte(s[i])
			i++
			continue
		}
		j := i
		for j < len(s) && !strings.ContainsRune(" \t\n\"'`:;,)]}>", rune(s[j])) {
			j++
		}
		p := s[i:j]
		if base := path.Base(p); base != "/" && base != "." {
			b.WriteString(base)
		} else {
			b.WriteString(p)
		}
		i = j
	}
	return b.String()
}

// Home is the one name a session's workspace has in everything a model
// reads or sends: every session box shows the workspace there, and only
// there (never at its host path).
const Home = "/home/user"

// InHome is p, a path in the workspace ws (its host path), named under
// Home: InHome("/d/sessions/x/workspace", "/d/sessions/x/workspace/a")
// is "/home/user/a". A path outside ws is returned as it is.
func InHome(ws, p string) string {
	if ws == "" || p == "" {
		return p
	}
	ws = strings.TrimSuffix(ws, "/")
	if p == ws {
		return Home
	}
	if rest, ok := strings.CutPrefix(p, ws+"/"); ok {
		return path.Join(Home, rest)
	}
	return p
}

// FromHome is the inverse of InHome: a path under Home named in the
// workspace ws; another path as it is.
func FromHome(ws, p string) string {
	if ws == "" {
		return p
	}
	c := path.Clean(p)
	if c == Home {
		return ws
	}
	if rest, ok := strings.CutPrefix(c, Home+"/"); ok {
		return path.Join(ws, rest)
	}
	return p
}

// HomeText replaces the workspace's host path ws wherever it stands as a
// path (followed by '/', the end or a character that cannot continue a
// name) in s with Home: the text a process printed about its own
// directory ("pwd", a traceback's file name).
func HomeText(ws, s string) string { return Replace(ws, Home, s) }

// Replace replaces the path from wherever it stands as a path in s
// (followed by '/', the end or a character that cannot continue a name)
// with to: how a host path is named by the path a box shows it at.
func Replace(from, to, s string) string {
	from = strings.TrimSuffix(from, "/")
	if from == "" || !strings.Contains(s, from) {
		return s
	}
	var b strings.Builder
	b.Grow(len(s))
	for {
		i := strings.Index(s, from)
		if i < 0 {
			b.WriteString(s)
			return b.String()
		}
		end := i + len(from)
		if end < len(s) && !strings.ContainsRune("/ \t\n\r\"'`:;,)]>", rune(s[end])) {
			b.WriteString(s[:end])
			s = s[end:]
			continue
		}
		b.WriteString(s[:i])
		b.WriteString(to)
		s = s[end:]
	}
}

// Error is err as a tenant may read it: its text through Names, while
// errors.Is and errors.As see err whole. nil stays nil.
func Error(err error) error {
	if err == nil {
		return nil
	}
	return hidden{err}
}

type hidden struct{ err error }

func (h hidden) Error() string { return Names(h.err.Error()) }
func (h hidden) Unwrap() error { return h.err }
