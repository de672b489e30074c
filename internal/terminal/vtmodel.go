package terminal

import (
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/charmbracelet/x/ansi"
	"github.com/charmbracelet/x/ansi/parser"
	"github.com/charmbracelet/x/vt"
)

// The screen model (read_screen) parses what the box prints with
// charmbracelet/x/vt. Box output is hostile, and that emulator takes the
// counts of its sequences at their word: ESC[65535b printed 65,535 cells
// for 8 bytes, ESC[65535S scrolled 65,535 times, ESC[65535I walked 65,535
// tab stops. So the model
//
//   - clamps every count that multiplies work to the screen (clampCounts,
//     hooked into the emulator's own parser so it sees exactly what the
//     emulator sees: raw C1 CSI, split writes and all);
//   - is never bigger than modelMaxCols x modelMaxRows, whatever size a
//     viewer asks the PTY for (work per sequence is bounded by the screen);
//   - parses in its own goroutine, in pieces of modelPiece bytes, so the
//     PTY reader (scrollback, viewers) never waits for it and read_screen
//     waits for one piece at most;
//   - spends at most ModelBudget of every modelWindow of wall time parsing:
//     a flood beyond that is dropped, oldest first (only the latest screen
//     matters), and counted.
const (
	modelMaxCols    = 400
	modelMaxRows    = 150
	modelPiece      = 256
	modelPending    = 256 << 10
	modelTail       = 4 << 10 // parsed after the shell ended, over budget
	modelWindow     = 100 * time.Millisecond
	modelScrollback = 16 // lines; read_screen shows the screen, the Ring keeps history
)

// ModelStats count what the screen model did.
type ModelStats struct {
	Read    int64 // bytes the PTY printed
	Parsed  int64 // bytes the emulator parsed
	Dropped int64 // bytes dropped unparsed because the model was over budget
	Clamped int64 // sequence counts cut to the screen
	// RepeatCells is how many cells REP (CSI n b) printed in all.
	RepeatCells int64
	Panics      int64 // emulator panics recovered (the screen started over)
}

type model struct {
	mu  sync.Mutex // the emulator is not safe for concurrent use
	emu *vt.Emulator

	budget time.Duration // parse time allowed per modelWindow

	pmu     sync.Mutex
	pending []byte
	wake    chan struct{} // one token: pending has bytes or the input ended
	ended   bool
	notify  chan struct{} // closed and replaced after every parsed piece

	read, parsed, dropped, clamped, repeat, panics atomic.Int64
}

func modelSize(cols, rows int) (int, int) {
	return max(1, min(cols, modelMaxCols)), max(1, min(rows, modelMaxRows))
}

func newModel(cols, rows int, budget time.Duration) *model {
	if budget <= 0 {
		budget = modelWindow / 5
	}
	m := &model{budget: min(budget, modelWindow), wake: make(chan struct{}, 1), notify: make(chan struct{})}
	m.emu = m.newEmulator(modelSize(cols, rows))
	return m
}

func (m *model) newEmulator(cols, rows int) *vt.Emulator {
	e := vt.NewEmulator(cols, rows)
	e.SetScrollbackSize(modelScrollback)
	clampCounts(e, func(n int) { m.clamped.Add(int64(n)) }, func(n int) { m.repeat.Add(int64(n)) })
	// The emulator answers terminal queries on a pipe, synchronously; the
	// viewers answer those, so its answers are drained and dropped until
	// closeInput.
	go func() { _, _ = io.Copy(io.Discard, e) }() // ends at closeInput; nothing to report
	return e
}

// closeInput ends the drain of e's answers.
func closeInput(e *vt.Emulator) {
	if pw, ok := e.InputPipe().(*io.PipeWriter); ok {
		pw.Close()
	}
}

// clampCounts hooks the emulator's CSI dispatch: for every sequence whose
// parameters are counts or positions, each parameter is cut to the screen's
// width or height before the emulator's own handler runs (a handler that
// returns false passes the same parameter slice on to the one registered
// before it). Sequences with a private prefix or an intermediate byte are
// other commands (CSI ? 1049 s saves a mode) and left alone.
func clampCounts(e *vt.Emulator, clamped, repeated func(int)) {
	type axis int
	const (
		horizontal axis = iota
		vertical
	)
	one := func(cmd byte, ax axis) {
		e.RegisterCsiHandler(int(cmd), func(params ansi.Params) bool {
			lim := e.Width()
			if ax == vertical {
				lim = e.Height()
			}
			clamped(clampParams(params, func(int) int { return lim }))
			if cmd == 'b' {
				n, _, _ := params.Param(0, 1)
				repeated(max(n, 1))
			}
			return false
		})
	}
	for _, c := range []byte("@PXCDG`aIZb") {
		one(c, horizontal)
	}
	for _, c := range []byte("ABEFLMSTde") {
		one(c, vertical)
	}
	// Row;column and top;bottom and left;right.
	for c, lims := range map[byte][2]axis{'H': {vertical, horizontal}, 'f': {vertical, horizontal}, 'r': {vertical, vertical}, 's': {horizontal, horizontal}} {
		e.RegisterCsiHandler(int(c), func(params ansi.Params) bool {
			clamped(clampParams(params, func(i int) int {
				if i < 2 && lims[i] == vertical {
					return e.Height()
				}
				return e.Width()
			}))
			return false
		})
	}
}

// clampParams cuts each present parameter to limit(i) (at least 1) in
// place, keeping the sub-parameter flag; it returns how many it cut.
func clampParams(params ansi.Params, limit func(i int) int) int {
	n := 0
	for i, p := range params {
		v := int(p) & parser.ParamMask
		lim := max(1, limit(i))
		if v == parser.MissingParam || v <= lim {
			continue
		}
		params[i] = ansi.Param(ansi.Parameter(lim, p.HasMore()))
		n++
	}
	return n
}

// feed queues what the PTY printed; it never waits for the parser. Past
// modelPending queued bytes the oldest are dropped.
func (m *model) feed(b []byte) {
	m.read.Add(int64(len(b)))
	m.pmu.Lock()
	m.pending = append(m.pending, b...)
	if over := len(m.pending) - modelPending; over > 0 {
		m.dropped.Add(int64(over))
		m.pending = m.pending[over:]
	}
	m.pmu.Unlock()
	select {
	case m.wake <- struct{}{}:
	default:
	}
}

// end tells the parser that no more input comes; it returns once the
// queued bytes are parsed (or dropped).
func (m *model) end() {
	m.pmu.Lock()
	m.ended = true
	m.pmu.Unlock()
	select {
	case m.wake <- struct{}{}:
	default:
	}
}

// run parses queued input until end; one goroutine per model.
func (m *model) run() {
	window := time.Now()
	var spent time.Duration
	piece := make([]byte, 0, modelPiece)
	for {
		m.pmu.Lock()
		n := min(len(m.pending), modelPiece)
		piece = append(piece[:0], m.pending[:n]...)
		m.pending = m.pending[n:]
		if len(m.pending) == 0 {
			m.pending = nil // let a flood's buffer go
		}
		ended := m.ended
		m.pmu.Unlock()
		if n == 0 {
			if ended {
				m.mu.Lock()
				closeInput(m.emu)
				m.mu.Unlock()
				m.signal()
				return
			}
			<-m.wake
			continue
		}
		if now := time.Now(); now.Sub(window) >= modelWindow {
			window, spent = now, 0
		} else if spent >= m.budget && ended {
			// The shell has ended and the model has spent its budget: only
			// the last modelTail bytes (the final screen) are still parsed,
			// so no goroutine keeps parsing a flood after the terminal.
			m.pmu.Lock()
			over := len(m.pending) - modelTail
			if over > 0 {
				m.dropped.Add(int64(over + n))
				m.pending = m.pending[over:]
			}
			m.pmu.Unlock()
			if over > 0 {
				continue // piece is older than the tail kept
			}
		} else if spent >= m.budget {
			// Over budget: rest until the window ends. The queue keeps
			// filling (and dropping its oldest bytes) meanwhile.
			time.Sleep(modelWindow - now.Sub(window))
			window, spent = time.Now(), 0
		}
		t0 := time.Now()
		m.write(piece)
		spent += time.Since(t0)
		m.parsed.Add(int64(n))
		m.signal()
	}
}

// write parses b. A panic of the emulator on hostile input must not take
// the server down: the model starts over on a blank screen of the same
// size, and the panic is counted.
func (m *model) write(b []byte) {
	m.mu.Lock()
	defer m.mu.Unlock()
	defer func() {
		if p := recover(); p != nil {
			m.panics.Add(1)
			closeInput(m.emu)
			m.emu = m.newEmulator(m.emu.Width(), m.emu.Height())
		}
	}()
	m.emu.Write(b)
}

func (m *model) signal() {
	m.pmu.Lock()
	close(m.notify)
	m.notify = make(chan struct{})
	m.pmu.Unlock()
}

// changed returns a channel closed after the next parsed piece.
func (m *model) changed() <-chan struct{} {
	m.pmu.Lock()
	defer m.pmu.Unlock()
	return m.notify
}

func (m *model) screen() string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.emu.String()
}

func (m *model) resize(cols, rows int) {
	m.mu.Lock()
	m.emu.Resize(modelSize(cols, rows))
	m.mu.Unlock()
}

func (m *model) stats() ModelStats {
	return ModelStats{Read: m.read.Load(), Parsed: m.parsed.Load(), Dropped: m.dropped.Load(),
		Clamped: m.clamped.Load(), RepeatCells: m.repeat.Load(), Panics: m.panics.Load()}
}
