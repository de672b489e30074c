import { api, fetchRaw, openSocket, RunResult, Session, Status } from './api';
import { clear, fill, h, keyed } from './dom';
import { renderArtifact } from './artifacts';
import { Page } from './page';
import { shown } from './files';
import { OutputView } from './outputview';
import { Compartment, Prec } from '@codemirror/state';
import { EditorView, editorSetup, keymap, mode } from './editor';

// The playground, a notebook-lite: cells of code (CodeMirror, highlighted
// in the language chosen) that run one at a time in the same session, so
// they share its state (the session's Python keeps its variables between
// runs); each cell streams its output into a virtualised view and shows
// its artifacts. The languages are the server's (GET /v1/status, the
// engines available). Every run is added to the session's history, kept by
// the server in the session's workspace (/home/user/.quro/playground/
// history.json, through write_file): it survives a reload and leaving the
// page, is bounded (HISTORY_MAX runs, each code cut at CODE_MAX), and a
// click puts a past run back into a cell. The history is data the session
// can write: it is only ever shown as text.

const HISTORY_PATH = '.quro/playground/history.json';
const HISTORY_MAX = 50;
const CODE_MAX = 16 << 10;

const SAMPLES: Record<string, string> = {
  python: `print("hello from Python")

class Page:
    def _repr_html_(self):
        return "<h2>An HTML artifact</h2><p>rendered in a sandboxed frame</p>"

display(Page())
`,
  sh: 'uname -a\nls -la\n',
  bash: 'uname -a\nls -la\n',
  js: 'console.log([1, 2, 3].map((x) => x * 2));\n',
  ts: 'const xs: number[] = [1, 2, 3];\nconsole.log(xs.reduce((a, b) => a + b, 0));\n',
  html: '<h1>Hello</h1>\n<p>rendered in a sandboxed frame</p>\n',
  svg: '<svg xmlns="http://www.w3.org/2000/svg" width="120" height="120"><circle cx="60" cy="60" r="50" fill="teal"/></svg>\n',
  json: '{"name": "quro", "tags": ["agents", "sandbox"], "nested": {"ok": true, "n": 3}}\n',
};

interface HistoryEntry {
  at: string;
  lang: string;
  code: string;
  exit: number;
  ms: number;
}

interface Cell {
  el: HTMLElement;
  editor: EditorView;
  run: () => void;
  close: () => void;
}

export function playgroundPage(sessionParam?: string): Page {
  const session = h('select', { id: 'play-session', 'aria-label': 'session' });
  const lang = h('select', { id: 'play-lang', 'aria-label': 'language' });
  const add = h('button', { id: 'play-add', type: 'button' }, '+ Cell');
  const cellsEl = h('div', { id: 'play-cells' });
  const historyList = h('div', { class: 'history-runs' }, h('p', { class: 'hint' }, 'loading…'));
  const historyEl = h('div', { id: 'play-history', 'aria-label': 'run history' }, h('h2', null, 'History'), historyList);
  const cells: Cell[] = [];
  const langMode = new Compartment();
  let history: HistoryEntry[] = [];
  let queue: Promise<void> = Promise.resolve(); // cells run one at a time

  function setLang(l: string) {
    for (const c of cells) c.editor.dispatch({ effects: langMode.reconfigure(mode(l)) });
  }

  function newCell(code: string): Cell {
    const first = cells.length === 0;
    const id = (name: string) => (first ? `play-${name}` : undefined);
    const editorEl = h('div', { class: 'editor', id: id('code') });
    const run = h('button', { id: id('run'), type: 'button', class: 'primary play-run', title: 'Ctrl+Enter' }, 'Run');
    const stop = h('button', { id: id('stop'), type: 'button', class: 'play-stop', disabled: true }, 'Stop');
    const summary = h('p', { id: id('summary'), class: 'summary' });
    const output = new OutputView(id('output'));
    const artifacts = h('div', { id: id('artifacts'), class: 'play-artifacts' });
    let ws: WebSocket | null = null;
    const editor = new EditorView({
      doc: code,
      parent: editorEl,
      extensions: [
        Prec.highest(keymap.of([{ key: 'Mod-Enter', run: () => (start(), true) }])),
        editorSetup,
        langMode.of(mode(lang.value)),
        EditorView.contentAttributes.of({ 'aria-label': 'code' }),
      ],
    });

    function finish(text: string, cls: string) {
      summary.textContent = text;
      summary.className = `summary ${cls}`;
      run.disabled = false;
      stop.disabled = true;
      ws = null;
    }

    function start() {
      if (ws || run.disabled) return;
      run.disabled = true;
      summary.textContent = 'waiting…';
      summary.className = 'summary wait';
      queue = queue.then(() => execute());
    }

    function execute(): Promise<void> {
      return new Promise((done) => {
        output.clear();
        clear(artifacts);
        summary.textContent = 'running…';
        stop.disabled = false;
        const t0 = performance.now();
        let dropped = false;
        let ended = false;
        const code = editor.state.doc.toString();
        const language = lang.value;
        const sock = openSocket('/v1/stream/run_code');
        ws = sock;
        sock.onopen = () => {
          const args: Record<string, string> = { code, lang: language };
          if (session.value) args.session = session.value;
          sock.send(JSON.stringify(args));
        };
        sock.onmessage = (m) => {
          if (typeof m.data !== 'string') return;
          const msg = JSON.parse(m.data);
          switch (msg.type) {
            case 'output':
              output.append(msg.stream, msg.data ?? '');
              break;
            case 'dropped':
              dropped = true;
              break;
            case 'result': {
              ended = true;
              const r = msg.output as RunResult;
              if (dropped) {
                // The stream skipped output; the result has it as kept.
                output.clear();
                output.append('stdout', r.stdout);
                output.append('stderr', r.stderr);
              }
              for (const n of r.notes ?? []) output.append('note', `ℹ ${n}\n`);
              for (const a of r.artifacts ?? []) artifacts.append(renderArtifact(a));
              const bits = [`exit ${r.exit_code}`, r.engine, `${Math.round(r.duration_ms)} ms`];
              if (r.error) bits.unshift(`error: ${r.error}`);
              if (r.timed_out) bits.push('timed out');
              if (r.truncated) bits.push('output cut, full:');
              const n = r.artifacts?.length ?? 0;
              if (n) bits.push(`${n} artifact${n > 1 ? 's' : ''}`);
              finish(bits.join(' · '), r.error || r.exit_code ? 'bad' : 'ok');
              // A cut output's whole file opens in the workspace browser.
              for (const f of [r.stdout_file, r.stderr_file]) {
                if (!f) continue;
                const rel = f.replace(/^\/home\/user\//, '');
                summary.append(' ', h('a', { class: 'mono play-full', href: `#/files/${encodeURIComponent(r.session)}/${rel.split('/').map(encodeURIComponent).join('/')}` }, shown(rel)));
              }
              remember({ at: new Date().toISOString(), lang: language, code, exit: r.exit_code, ms: Math.round(r.duration_ms) });
              // The moment the output is drawn: what the page's test measures.
              output.settled().then(() => {
                const ms = Math.round(performance.now() - t0);
                output.el.dataset.settledMs = String(ms);
                output.el.dispatchEvent(new CustomEvent('quro-settled', { bubbles: true, detail: { lines: output.lineCount, ms } }));
              });
              break;
            }
            case 'error':
              ended = true;
              finish(`error ${msg.error?.code}: ${msg.error?.message}`, 'bad');
              break;
          }
        };
        sock.onclose = (ev) => {
          if (ws === sock && !ended) finish(`connection closed (${ev.code}) before the result`, 'bad');
          done();
        };
      });
    }

    run.addEventListener('click', start);
    stop.addEventListener('click', () => {
      if (ws?.readyState === WebSocket.OPEN) ws.send(JSON.stringify({ type: 'cancel' }));
    });
    const el = h('div', { class: 'cell' }, editorEl, h('div', { class: 'row' }, run, stop, summary), output.el, artifacts);
    const cell = { el, editor, run: start, close: () => (ws?.close(), editor.destroy()) };
    cells.push(cell);
    cellsEl.append(el);
    return cell;
  }

  // The session's history: read when the session is chosen, written
  // after each run (whole, bounded); a write that fails loses only history.
  function historyPath(): string {
    return `/v1/sessions/${encodeURIComponent(session.value)}/files/${HISTORY_PATH}`;
  }

  // The runs, latest first, kept across redraws (a run added, another
  // session's history read): a run's button stays while the run is in
  // the history. A run has no id: its key is what it is (when, what
  // language, what code) and the how-many-th of its like, oldest first,
  // so that a newer run does not renumber the older.
  type Run = { e: HistoryEntry; key: string };
  const noRuns = h('p', { class: 'hint' }, 'no runs yet in this session');
  const runs = keyed(
    historyList,
    (r: Run) => r.key,
    ({ e }) => {
      const b = h('button', { type: 'button', class: 'mono' });
      b.addEventListener('click', () => {
        if (Array.from(lang.options).some((o) => o.value === e.lang)) {
          lang.value = e.lang;
          setLang(e.lang);
        }
        newCell(e.code).editor.focus();
      });
      return { el: b };
    },
    (r, { e }) => fill(r.el as HTMLElement, { title: e.code }, `${e.exit === 0 ? '✓' : '✗'} ${e.lang} · ${e.code.split('\n')[0]}`),
  );
  function drawHistory() {
    const n = new Map<string, number>();
    const list = history.map((e) => {
      const k = JSON.stringify([e.at, e.lang, e.code]);
      const i = (n.get(k) ?? 0) + 1;
      n.set(k, i);
      return { e, key: `${k}#${i}` };
    });
    runs.sync(list.reverse(), !list.length && noRuns);
  }

  async function loadHistory() {
    history = [];
    try {
      // Looked for before it is read: a missing file would be a 404, an
      // error in the console of every new session's first visit.
      const sp = `/v1/sessions/${encodeURIComponent(session.value)}/files`;
      type Listing = { entries: { path: string }[] | null };
      const root = await api<Listing>('GET', `${sp}/`);
      if (!root.entries?.some((e) => e.path === '.quro')) throw new Error('no history');
      const internal = await api<Listing>('POST', '/v1/list_files', { session: session.value, path: '.quro', depth: 2 });
      if (!internal.entries?.some((e) => e.path === HISTORY_PATH)) throw new Error('no history');
      const c = await api<{ content: string; encoding: string }>('GET', historyPath());
      const parsed = JSON.parse(c.encoding === 'base64' ? '' : c.content) as unknown;
      if (Array.isArray(parsed)) {
        history = parsed
          .filter((e): e is HistoryEntry => typeof e?.code === 'string' && typeof e?.lang === 'string')
          .slice(-HISTORY_MAX);
      }
    } catch {
      /* none yet, or not ours to read: an empty history */
    }
    drawHistory();
  }

  function remember(e: HistoryEntry) {
    e.code = e.code.slice(0, CODE_MAX);
    history = [...history, e].slice(-HISTORY_MAX);
    drawHistory();
    fetchRaw('PUT', historyPath(), new Blob([JSON.stringify(history)])).catch(() => {});
  }

  lang.addEventListener('change', () => {
    setLang(lang.value);
    const c = cells[0];
    if (cells.length === 1 && SAMPLES[lang.value] !== undefined && Object.values(SAMPLES).includes(c.editor.state.doc.toString())) {
      c.editor.dispatch({ changes: { from: 0, to: c.editor.state.doc.length, insert: SAMPLES[lang.value] } });
    }
  });
  session.addEventListener('change', () => loadHistory());
  add.addEventListener('click', () => newCell('').editor.focus());

  Promise.all([api<Status>('GET', '/v1/status'), api<{ sessions: Session[] | null }>('GET', '/v1/sessions')])
    .then(([st, { sessions }]) => {
      const langs = [...new Set((st.engines ?? []).filter((e) => e.available).map((e) => e.lang))];
      for (const l of langs) lang.append(h('option', { value: l, selected: l === 'python' }, l));
      setLang(lang.value);
      for (const s of sessions ?? []) {
        session.append(h('option', { value: s.id, selected: sessionParam ? s.id === sessionParam || s.name === sessionParam : s.default }, s.default ? `${s.name} (default)` : s.name));
      }
      return loadHistory();
    })
    .catch(() => {});

  newCell(SAMPLES.python);
  const el = h(
    'section',
    { id: 'playground' },
    h('h1', null, 'Playground'),
    h('div', { class: 'row' }, h('label', null, 'Session ', session), h('label', null, 'Language ', lang), add, h('span', { class: 'hint' }, 'Ctrl+Enter runs a cell; cells share the session’s state')),
    h('div', { class: 'play-layout' }, cellsEl, historyEl),
  );
  return {
    el,
    close: () => {
      for (const c of cells) c.close();
    },
  };
}
