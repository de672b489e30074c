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
// of s or after a space, a quote, '(', '[', '<', '=' or ',' (so a URL's
// "//" is left alone) and ends at a space, a quote, ':', ';', ',', ')',
// ']' or '>'. It is for text the server wrote about its host, never for
// paths inside a box, which a tenant needs whole.
func Names(s string) string {
	if !strings.Contains(s, "/") {
		return s
	}
	var b strings.Builder
	b.Grow(len(s))
	for i := 0; i < len(s); {
		if s[i] != '/' || (i > 0 && !strings.ContainsRune(" \t\n\"'`([<=,", rune(s[i-1]))) {
			b.WriteByte(s[i])
			i++
			continue
		}
		j := i
		for j < len(s) && !strings.ContainsRune(" \t\n\"'`:;,)]>", rune(s[j])) {
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
