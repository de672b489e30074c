import { api, openSocket, RunResult, Session } from './api';
import { clear, h } from './dom';
import { renderArtifact } from './artifacts';
import { Page } from './page';
import { shown } from './files';

const LANGS = ['python', 'sh', 'js', 'ts', 'html', 'svg', 'json', 'css', 'xml', 'go', 'rust', 'c'];

const SAMPLES: Record<string, string> = {
  python: `print("hello from Python")

class Page:
    def _repr_html_(self):
        return "<h2>An HTML artifact</h2><p>rendered in a sandboxed frame</p>"

display(Page())
`,
  sh: 'uname -a\nls -la\n',
  js: 'console.log([1, 2, 3].map((x) => x * 2));\n',
  ts: 'const xs: number[] = [1, 2, 3];\nconsole.log(xs.reduce((a, b) => a + b, 0));\n',
  html: '<h1>Hello</h1>\n<p>rendered in a sandboxed frame</p>\n',
  svg: '<svg xmlns="http://www.w3.org/2000/svg" width="120" height="120"><circle cx="60" cy="60" r="50" fill="teal"/></svg>\n',
  json: '{"name": "quro", "tags": ["agents", "sandbox"], "nested": {"ok": true, "n": 3}}\n',
};

// Escape and other control characters in program output are shown as
// visible symbols: output is text here; only the terminal interprets them.
function visible(s: string): string {
  return s.replace(/[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]/g, (c) => (c === '\x7f' ? '\u2421' : String.fromCharCode(0x2400 + c.charCodeAt(0))));
}

export function playgroundPage(sessionParam?: string): Page {
  const session = h('select', { id: 'play-session', 'aria-label': 'session' });
  const lang = h('select', { id: 'play-lang', 'aria-label': 'language' }, LANGS.map((l) => h('option', { value: l }, l)));
  const code = h('textarea', { id: 'play-code', spellcheck: 'false', autocomplete: 'off', 'aria-label': 'code', rows: 14 });
  code.value = SAMPLES.python;
  const run = h('button', { id: 'play-run', type: 'button', class: 'primary', title: 'Ctrl+Enter' }, 'Run');
  const stop = h('button', { id: 'play-stop', type: 'button', disabled: true }, 'Stop');
  const summary = h('p', { id: 'play-summary', class: 'summary' });
  const output = h('pre', { id: 'play-output', class: 'output', 'aria-live': 'polite' });
  const artifacts = h('div', { id: 'play-artifacts' });
  let ws: WebSocket | null = null;
  let edited = false;

  code.addEventListener('input', () => (edited = true));
  lang.addEventListener('change', () => {
    if (!edited && SAMPLES[lang.value] !== undefined) code.value = SAMPLES[lang.value];
  });
  code.addEventListener('keydown', (e) => {
    if (e.key === 'Enter' && (e.ctrlKey || e.metaKey)) {
      e.preventDefault();
      start();
    } else if (e.key === 'Tab' && !e.shiftKey) {
      e.preventDefault();
      code.setRangeText('    ', code.selectionStart, code.selectionEnd, 'end');
    }
  });

  function write(stream: string, data: string) {
    output.append(h('span', { class: stream === 'stderr' ? 'stderr' : 'stdout' }, visible(data)));
  }

  function finish(text: string, cls: string) {
    summary.textContent = text;
    summary.className = `summary ${cls}`;
    run.disabled = false;
    stop.disabled = true;
    ws = null;
  }

  function start() {
    if (ws) return;
    clear(output);
    clear(artifacts);
    finish('running…', 'wait');
    run.disabled = true;
    stop.disabled = false;
    let dropped = false;
    let ended = false;
    const sock = openSocket('/v1/stream/run_code');
    ws = sock;
    sock.onopen = () => {
      const args: Record<string, string> = { code: code.value, lang: lang.value };
      if (session.value) args.session = session.value;
      sock.send(JSON.stringify(args));
    };
    sock.onmessage = (m) => {
      if (typeof m.data !== 'string') return;
      const msg = JSON.parse(m.data);
      switch (msg.type) {
        case 'output':
          write(msg.stream, msg.data ?? '');
          break;
        case 'dropped':
          dropped = true;
          break;
        case 'result': {
          ended = true;
          const r = msg.output as RunResult;
          if (dropped) {
            // The stream skipped output; the result has it as kept.
            clear(output);
            write('stdout', r.stdout);
            write('stderr', r.stderr);
          }
          for (const n of r.notes ?? []) write('note', `ℹ ${n}\n`);
          for (const a of r.artifacts ?? []) artifacts.append(renderArtifact(a));
          const bits = [`exit ${r.exit_code}`, r.engine, `${Math.round(r.duration_ms)} ms`];
          if (r.error) bits.unshift(`error: ${r.error}`);
          if (r.timed_out) bits.push('timed out');
          if (r.truncated) bits.push(`output cut, full: ${r.stdout_file ?? r.stderr_file ?? ''}`);
          const n = r.artifacts?.length ?? 0;
          if (n) bits.push(`${n} artifact${n > 1 ? 's' : ''}`);
          finish(bits.join(' · '), r.error || r.exit_code ? 'bad' : 'ok');
          // A cut output's whole file opens in the workspace browser.
          for (const f of [r.stdout_file, r.stderr_file]) {
            if (!f) continue;
            const rel = f.replace(/^\/home\/user\//, '');
            summary.append(' ', h('a', { class: 'mono play-full', href: `#/files/${encodeURIComponent(r.session)}/${rel.split('/').map(encodeURIComponent).join('/')}` }, shown(rel)));
          }
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
    };
  }

  run.addEventListener('click', start);
  stop.addEventListener('click', () => {
    if (ws?.readyState === WebSocket.OPEN) ws.send(JSON.stringify({ type: 'cancel' }));
  });

  api<{ sessions: Session[] | null }>('GET', '/v1/sessions')
    .then(({ sessions }) => {
      for (const s of sessions ?? []) {
        session.append(h('option', { value: s.id, selected: sessionParam ? s.id === sessionParam || s.name === sessionParam : s.default }, s.default ? `${s.name} (default)` : s.name));
      }
    })
    .catch(() => {});

  const el = h(
    'section',
    { id: 'playground' },
    h('h1', null, 'Playground'),
    h('div', { class: 'row' }, h('label', null, 'Session ', session), h('label', null, 'Language ', lang), run, stop, h('span', { class: 'hint' }, 'Ctrl+Enter runs')),
    code,
    summary,
    output,
    artifacts,
  );
  return {
    el,
    close: () => {
      ws?.close();
    },
  };
}
