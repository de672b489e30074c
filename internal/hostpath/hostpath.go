// Package hostpath keeps the server's host paths out of the text a tenant
// reads: the errors of the server's own system calls, the cgroups it
// makes, its data directory, an installer's output. The whole text stays
// in the server log.
package hostpath

import (
	"path"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Names replaces every absolute path in s with its last element:
// "mkdir /sys/fs/cgroup/memory/quro/run-1: permission denied" reads
// "mkdir run-1: permission denied". A path starts at a '/' that does not
// continue a word: at the start of s, or after any character but a
// letter, a digit, a mark or one of the ASCII characters that go on a
// name or a URL (see inWord), so after a space, a quote (ASCII or
// Unicode: ‘’“”«»), a bracket, '=', ',', ':' (a list such as PATH's),
// ';', '|', '@', '!', '>' (a redirection), '\r'; but not within a URL's
// "://", except a file URL's path ("file:///abs/x" reads "file://x");
// and after a compiler's option ("-I/usr/include", "-L/opt/lib"). It ends
// at a space or a control character, a quote, ':', ';', ',', '|', ')',
// ']', '}', '<' or '>'. A host path with a space in it keeps what follows
// the space. It is for text the server wrote about its host (or a tool it
// ran printed), never for paths inside a box, which a tenant needs whole.
func Names(s string) string {
	if !strings.Contains(s, "/") {
		return s
	}
	var b strings.Builder
	b.Grow(len(s))
	for i := 0; i < len(s); {
		if s[i] != '/' || !startsPath(s, i) {
			b.WriteByte(s[i])
			i++
			continue
		}
		j := i + pathLen(s[i:])
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

// startsPath reports whether the '/' at s[i] starts an absolute path.
func startsPath(s string, i int) bool {
	before := s[:i]
	if fileURL(before) {
		return true
	}
	if strings.HasSuffix(before, ":") && strings.HasPrefix(s[i:], "//") {
		return false // a URL's "://"
	}
	r, _ := utf8.DecodeLastRuneInString(before) // at the start of s: RuneError, which is in no word
	return !inWord(r) || option(before)
}

// inWord reports whether r goes on a word that a '/' after it continues
// ("n/a", "1/2", "acme/x", "https://h/a/b", "~/x", "$HOME/x", "a.b/c").
func inWord(r rune) bool {
	if r < utf8.RuneSelf {
		return 'a' <= r && r <= 'z' || 'A' <= r && r <= 'Z' || '0' <= r && r <= '9' ||
			strings.ContainsRune("._-~+%/\\)]}*$#&?^", r)
	}
	return unicode.IsLetter(r) || unicode.IsDigit(r) || unicode.IsMark(r)
}

// fileURL reports whether before ends with a file URL's "file://" (of no
// host, as pip, Python's pathlib and Node print them; "git+file://"
// too): the '/' that follows starts a host path.
func fileURL(before string) bool {
	const scheme = "file://"
	return len(before) >= len(scheme) && strings.EqualFold(before[len(before)-len(scheme):], scheme)
}

// option reports whether before ends with a command-line option glued to
// a path: "-I", "-L", "-isystem" of a compiler's command line.
func option(before string) bool {
	w := before[strings.LastIndexAny(before, " \t\n\r\"'`=,")+1:]
	name := strings.TrimLeft(w, "-")
	if len(w)-len(name) == 0 || len(w)-len(name) > 2 || name == "" || !isLetter(name[0]) {
		return false
	}
	for k := 0; k < len(name); k++ {
		if c := name[k]; !isLetter(c) && (c < '0' || c > '9') && c != '-' && c != '_' {
			return false
		}
	}
	return true
}

func isLetter(c byte) bool { return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' }

// pathLen is the length of the path at the start of s (s[0] is '/'): up
// to the first character that ends a path.
func pathLen(s string) int {
	for j := 0; j < len(s); {
		r, n := utf8.DecodeRuneInString(s[j:])
		if r < 0x20 || r == 0x7f || unicode.IsSpace(r) || strings.ContainsRune("\"'`:;,|)]}<>‘’“”«»", r) {
			return j
		}
		j += n
	}
	return len(s)
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

// Error marks err as text about the server's host (an installer's
// failure naming the install root): its Error() stays whole, for the
// server's log, and Tenant, which the edges where a tenant reads an error
// call (the controller's classification, run_code's results), names each
// path in it by its last element. errors.Is and errors.As see err. nil
// stays nil.
func Error(err error) error {
	if err == nil {
		return nil
	}
	return hidden{err}
}

type hidden struct{ err error }

func (h hidden) Error() string { return h.err.Error() }
func (h hidden) Unwrap() error { return h.err }

// Tenant is err's text as a tenant may read it: the text of every error
// Error marked within it (through Unwrap) through Names, the rest as it
// is. When a wrapper's text does not hold a marked error's text whole
// (it rewrote it), the whole text goes through Names.
func Tenant(err error) string {
	if err == nil {
		return ""
	}
	s := err.Error()
	whole := false
	marked(err, func(h hidden) {
		w := h.err.Error()
		if strings.Contains(s, w) {
			s = strings.ReplaceAll(s, w, Names(w))
		} else {
			whole = true
		}
	})
	if whole {
		return Names(s)
	}
	return s
}

// marked calls f for each error Error marked in err's tree, outermost
// first, not looking beneath one.
func marked(err error, f func(hidden)) {
	switch e := err.(type) { //nolint:errorlint // the walk of the tree itself, one node at a time
	case nil:
	case hidden:
		f(e)
	case interface{ Unwrap() error }:
		marked(e.Unwrap(), f)
	case interface{ Unwrap() []error }:
		for _, x := range e.Unwrap() {
			marked(x, f)
		}
	}
}
