package js

import (
	"fmt"
	"regexp"
	"sort"
	"strconv"
	"strings"
)

// QuickJS names every script this package evaluates "<eval>" (and code of
// eval and Function "<input>"). So that a position still says which file it
// is in, each source is given its own range of line numbers: the main script
// starts at line 1, every required module is padded with newlines to start
// after the previous one, and the prelude sits at preludeLine. sources maps
// an engine position back to file, line and column, through the esbuild
// source map where the code was transpiled.
type sources struct {
	list []*source // sorted by start
	next int       // first free engine line
}

type source struct {
	name    string
	text    string     // the original text, for excerpts
	start   int        // engine line of the source's line 1
	lines   int        // lines of the code as evaluated
	sm      *sourceMap // nil when the code ran as written
	prelude bool
}

// line returns line n (1-based) of the original text.
func (s *source) line(n int) string {
	t := s.text
	for i := 1; i < n; i++ {
		k := strings.IndexByte(t, '\n')
		if k < 0 {
			return ""
		}
		t = t[k+1:]
	}
	if k := strings.IndexByte(t, '\n'); k >= 0 {
		t = t[:k]
	}
	return t
}

// pos is a position in a user source.
type pos struct {
	src       *source
	line, col int
}

func (p *pos) String() string { return fmt.Sprintf("%s:%d:%d", p.src.name, p.line, p.col) }

// excerpt shows the source line of p with a caret under the column.
func (p *pos) excerpt() string {
	if p == nil {
		return ""
	}
	text := p.src.line(p.line)
	if strings.TrimSpace(text) == "" {
		return ""
	}
	return caret(p.line, text, p.col)
}

// preludeLine is the engine line of the prelude's first line; user sources
// are numbered below it.
const preludeLine = 1_000_000

func newSources() *sources { return &sources{next: 1} }

// add places code (after any header line) at the next free lines and
// returns how many newlines to put before it. original is the text the user
// wrote (code itself unless it was transpiled).
func (s *sources) add(name, original, code string, sm *sourceMap, header bool) (pad int) {
	start := s.next
	if header {
		start++
	}
	src := &source{name: name, text: original, start: start, lines: strings.Count(code, "\n") + 1, sm: sm}
	s.insert(src)
	s.next = src.start + src.lines + 1
	pad = start - 1
	if header {
		pad--
	}
	return pad
}

func (s *sources) addPrelude(code string) {
	s.insert(&source{name: "quro:prelude", start: preludeLine, lines: strings.Count(code, "\n") + 1, prelude: true})
}

func (s *sources) insert(src *source) {
	s.list = append(s.list, src)
	sort.Slice(s.list, func(i, j int) bool { return s.list[i].start < s.list[j].start })
}

// find returns the source holding engine line l, or nil.
func (s *sources) find(l int) *source {
	i := sort.Search(len(s.list), func(i int) bool { return s.list[i].start > l }) - 1
	if i < 0 {
		return nil
	}
	src := s.list[i]
	if l >= src.start+src.lines+1 { // +1: a module wrapper's closing line
		return nil
	}
	return src
}

// position maps an engine position to a source position; nil when no
// source holds it.
func (s *sources) position(l, c int) *pos {
	src := s.find(l)
	if src == nil {
		return nil
	}
	line := l - src.start + 1
	if src.sm != nil {
		if ol, oc, ok := src.sm.lookup(line, c); ok {
			line, c = ol, oc
		}
	}
	return &pos{src: src, line: line, col: c}
}

var (
	frameRE     = regexp.MustCompile(`^(\s*at )(.*?) \((<eval>|<input>):(\d+):(\d+)\)$`)
	bareFrameRE = regexp.MustCompile(`^(\s*at )(<eval>|<input>):(\d+):(\d+)$`)
)

// maxFrames bounds a rendered stack; repeated frames (deep recursion) are
// folded first.
const maxFrames = 24

// stack rewrites the frames of a QuickJS stack trace: positions mapped to
// files and original lines, frames of the prelude dropped, repeats folded.
// It also returns the first position in a user source, if any.
func (s *sources) stack(raw string) (string, *pos) {
	var frames []string
	var first *pos
	for _, line := range strings.Split(strings.TrimRight(raw, "\n"), "\n") {
		if strings.TrimSpace(line) == "" {
			continue
		}
		f, p, keep := s.frame(line)
		if keep {
			frames = append(frames, f)
			if first == nil && p != nil {
				first = p
			}
		}
	}
	// Fold runs of the same frame.
	var folded []string
	for i := 0; i < len(frames); {
		j := i + 1
		for j < len(frames) && frames[j] == frames[i] {
			j++
		}
		folded = append(folded, frames[i])
		if n := j - i - 1; n > 0 {
			folded = append(folded, fmt.Sprintf("    ... the frame above repeated %d more times", n))
		}
		i = j
	}
	if len(folded) > maxFrames {
		cut := len(folded) - maxFrames + 1
		head := folded[:maxFrames-4]
		tail := folded[len(folded)-3:]
		folded = append(append(append([]string{}, head...), fmt.Sprintf("    ... %d more frames", cut)), tail...)
	}
	return strings.Join(folded, "\n"), first
}

// frame rewrites one line of a stack; keep is false for prelude frames.
func (s *sources) frame(line string) (text string, p *pos, keep bool) {
	var prefix, fn, file string
	var l, c int
	if m := frameRE.FindStringSubmatch(line); m != nil {
		prefix, fn, file = m[1], m[2], m[3]
		if fn == "<eval>" {
			fn = "<top level>"
		}
		l, _ = strconv.Atoi(m[4])
		c, _ = strconv.Atoi(m[5])
	} else if m := bareFrameRE.FindStringSubmatch(line); m != nil {
		prefix, file = m[1], m[2]
		l, _ = strconv.Atoi(m[3])
		c, _ = strconv.Atoi(m[4])
	} else {
		return line, nil, true
	}
	where := fmt.Sprintf("eval code:%d:%d", l, c)
	if file == "<eval>" {
		p = s.position(l, c)
		switch {
		case p == nil:
			where = fmt.Sprintf("<unknown>:%d:%d", l, c)
		case p.src.prelude:
			return "", nil, false
		default:
			where = p.String()
		}
	}
	if fn == "" {
		return prefix + where, p, true
	}
	return prefix + fn + " (" + where + ")", p, true
}
