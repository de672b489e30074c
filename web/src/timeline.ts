import { Terminal } from '@xterm/xterm';
import { FitAddon } from '@xterm/addon-fit';
import { api, openSocket } from './api';
import { h, clear } from './dom';
import { Page, flash } from './page';

// The live view of a session: its timeline (every call on it, from any
// access path, as it happens) and its agent's own shell, which a person
// may take over and hand back. Both are fed by one WebSocket of server
// events per tab (GET /v1/events, quro.v1): no polling. Everything a
// program printed goes into the DOM as text (h, textContent) or into
// xterm.js, never as HTML.

export interface ServerEvent {
  seq: number;
  type: 'call' | 'output' | 'end' | 'hold' | 'dropped';
  call?: string;
  session?: string;
  capability?: string;
  path?: string;
  person?: boolean;
  input?: Record<string, unknown>;
  stream?: string;
  data?: string;
  outcome?: string;
  exit_code?: number;
  text?: string;
  artifacts?: string[];
  held?: boolean;
  dropped?: number;
  replay?: boolean;
  time: string;
}

interface Reply {
  type: 'hello' | 'taken' | 'released' | 'result' | 'error';
  id?: string;
  session?: string;
  output?: { running?: boolean; exit_code?: number; waiting_for_input?: boolean };
  error?: { code: string; message: string };
}

type Listener = (e: ServerEvent | Reply) => void;

// The tab's one event socket, opened when the first view mounts and
// closed when the last one leaves; it reconnects after a drop. When the
// first view is of one session, the socket asks for that session's
// recent events first (?replay=<id>: the server's ring of its last calls,
// each marked replay), so a page opened mid-run shows what the agent
// already did; a reconnect asks again and the views skip what they have
// seen by the events' sequence numbers (see seen).
const listeners = new Set<Listener>();
let sock: WebSocket | null = null;
let retry: ReturnType<typeof setTimeout> | undefined;
let replayOf = '';

function open() {
  clearTimeout(retry);
  const s = openSocket(replayOf ? `/v1/events?replay=${encodeURIComponent(replayOf)}` : '/v1/events');
  sock = s;
  s.onmessage = (m) => {
    if (typeof m.data !== 'string') return;
    let msg: ServerEvent | Reply;
    try {
      msg = JSON.parse(m.data);
    } catch {
      return;
    }
    for (const l of listeners) l(msg);
  };
  s.onclose = () => {
    if (sock !== s) return;
    sock = null;
    if (listeners.size) retry = setTimeout(open, 2000);
  };
}

function listen(l: Listener, replay = ''): () => void {
  listeners.add(l);
  if (!sock) {
    replayOf = replay;
    open();
  }
  return () => {
    listeners.delete(l);
    if (!listeners.size) {
      clearTimeout(retry);
      const s = sock;
      sock = null;
      s?.close();
    }
  };
}

function send(msg: Record<string, string>): boolean {
  if (sock?.readyState !== WebSocket.OPEN) {
    flash('Not connected to the server events; try again in a moment');
    return false;
  }
  sock.send(JSON.stringify(msg));
  return true;
}

function isEvent(m: ServerEvent | Reply): m is ServerEvent {
  return ['call', 'output', 'end', 'hold', 'dropped'].includes(m.type);
}

// seen returns a view's check of an event: false for one it has handled
// already (a replay after a reconnect repeats the ring). The server hands
// each socket its events in the order of their numbers.
function seen(): (m: ServerEvent) => boolean {
  let last = 0;
  return (m) => {
    if (!m.seq) return false;
    if (m.seq <= last) return true;
    last = m.seq;
    return false;
  };
}

function summary(input: Record<string, unknown> | undefined): string {
  if (!input) return '';
  for (const k of ['command', 'code', 'path', 'packages', 'cmd']) {
    const v = input[k];
    if (v !== undefined) return Array.isArray(v) ? v.join(' ') : String(v);
  }
  return JSON.stringify(input);
}

// mountTimeline shows the calls on session id (every session of the
// tenant when id is empty) in el as they happen, newest last; it returns
// the function that stops it. The view keeps the last 200 calls.
export function mountTimeline(el: HTMLElement, id = ''): () => void {
  const list = h('ol', { class: 'timeline', id: 'timeline' });
  const empty = h('p', { class: 'hint' }, 'Waiting for calls on this session… (a call from any client, the agent’s or yours, appears here as it runs)');
  clear(el);
  el.append(empty, list);
  const calls = new Map<string, { li: HTMLElement; out: HTMLElement; end: HTMLElement }>();
  const old = seen();
  const stop = listen((m) => {
    if (m.type === 'hello') list.dataset.connected = '1';
    if (!isEvent(m) || old(m)) return;
    if (m.type === 'dropped') {
      list.append(h('li', { class: 'tl-dropped' }, `${m.dropped} events were lost: this view fell behind`));
      return;
    }
    if (id && m.session !== id) return;
    if (m.type === 'hold') {
      list.append(h('li', { class: 'tl-hold' }, m.held ? 'A person took over the shell' : 'The shell was handed back'));
      return;
    }
    if (!m.call) return;
    let c = calls.get(m.call);
    if (m.type === 'call') {
      empty.hidden = true;
      const out = h('pre', { class: 'tl-out' });
      const end = h('span', { class: 'tl-end wait' }, 'running…');
      const li = h(
        'li',
        { class: m.replay ? 'tl-call tl-replay' : 'tl-call', 'data-call': m.call, 'data-capability': m.capability ?? '', ...(m.replay ? { 'data-replay': '1', title: 'before this page opened' } : {}) },
        h(
          'div',
          { class: 'tl-head' },
          h('time', null, new Date(m.time).toLocaleTimeString()),
          ' ',
          h('b', null, m.capability ?? ''),
          ' ',
          h('span', { class: 'tl-path' }, m.person ? 'person' : m.path ?? ''),
          ' ',
          end,
        ),
        h('pre', { class: 'tl-input' }, summary(m.input)),
        out,
      );
      c = { li, out, end };
      calls.set(m.call, c);
      list.append(li);
      while (list.children.length > 200) {
        const first = list.firstElementChild as HTMLElement;
        const k = first.dataset.call;
        if (k) calls.delete(k);
        first.remove();
      }
      return;
    }
    if (!c) return;
    if (m.type === 'output') {
      c.out.append(m.data ?? '');
      return;
    }
    if (m.type === 'end') {
      const ok = m.outcome === 'ok' && (m.exit_code ?? 0) === 0;
      c.end.className = `tl-end ${ok ? 'ok' : 'bad'}`;
      c.end.textContent = m.exit_code !== undefined ? `${m.outcome} · exit ${m.exit_code}` : m.outcome ?? '';
      if (!c.out.textContent && m.text) c.out.append(m.text);
      if (m.artifacts?.length) c.li.append(h('div', { class: 'tl-artifacts' }, 'artifacts: ', m.artifacts.join(', ')));
    }
  }, id);
  return stop;
}

// mountAgentShell shows session id's shell — the one terminal_exec uses
// — in el: each command as "$ command" and its output as it comes, from
// whoever ran it. Take over gives the shell to this tab: then the line
// below runs commands in it (or answers a command that reads its input),
// and every other caller's terminal_exec is refused with "a person holds
// this session" until Hand back (or the tab closes).
export function mountAgentShell(el: HTMLElement, id: string): () => void {
  const box = h('div', { class: 'term agent-term', id: 'agent-terminal' });
  const state = h('span', { class: 'conn', id: 'hold-state' }, 'watching');
  const takeBtn = h('button', { type: 'button', id: 'take-over' }, 'Take over');
  const backBtn = h('button', { type: 'button', id: 'hand-back', disabled: true }, 'Hand back');
  const line = h('input', { type: 'text', id: 'shell-line', disabled: true, autocomplete: 'off', spellcheck: 'false', placeholder: 'Take over to type into the shell' });
  const form = h('form', { class: 'row shell-line' }, h('span', { class: 'mono' }, '$'), line);
  clear(el);
  el.append(h('div', { class: 'row' }, takeBtn, backBtn, state), box, form);

  const term = new Terminal({
    convertEol: true,
    disableStdin: true,
    scrollback: 5000,
    fontFamily: 'ui-monospace, "DejaVu Sans Mono", Menlo, Consolas, monospace',
    fontSize: 14,
    theme: { background: '#111417', foreground: '#d8dee4' },
  });
  const fit = new FitAddon();
  term.loadAddon(fit);
  term.open(box);
  fit.fit();
  const onResize = () => fit.fit();
  window.addEventListener('resize', onResize);

  let holding = false; // this tab holds the shell
  let running = false; // the person's command is running (input answers it)
  let seq = 0;
  const mine = new Set<string>(); // ids of this tab's messages
  const shellCalls = new Set<string>();
  const old = seen();

  function setHold(held: boolean, byMe: boolean) {
    holding = held && byMe;
    takeBtn.disabled = held;
    backBtn.disabled = !holding;
    line.disabled = !holding;
    line.placeholder = holding ? (running ? 'input for the running command' : 'a command for the shell') : 'Take over to type into the shell';
    state.textContent = holding ? 'you hold this shell: the agent’s commands are refused' : held ? 'a person holds this shell' : 'watching';
    state.className = `conn ${held ? 'bad' : 'ok'}`;
    if (holding) line.focus();
  }

  function msg(type: string, extra: Record<string, string> = {}): boolean {
    const ref = `m${++seq}`;
    mine.add(ref);
    return send({ type, session: id, id: ref, ...extra });
  }

  takeBtn.addEventListener('click', () => msg('take'));
  backBtn.addEventListener('click', () => msg('release'));
  form.addEventListener('submit', (ev) => {
    ev.preventDefault();
    if (!holding) return;
    const text = line.value;
    line.value = '';
    if (running) msg('input', { data: `${text}\n` });
    else if (text.trim()) {
      running = true;
      setHold(true, true);
      msg('exec', { command: text });
    }
  });

  const stop = listen((m) => {
    if (!isEvent(m)) {
      if (!m.id || !mine.has(m.id)) return;
      mine.delete(m.id);
      switch (m.type) {
        case 'taken':
          setHold(true, true);
          break;
        case 'released':
          running = false;
          setHold(false, false);
          break;
        case 'result':
          running = !!m.output?.running;
          setHold(true, holding);
          break;
        case 'error':
          running = false;
          setHold(holding, holding);
          flash(m.error?.message ?? 'error');
          break;
      }
      return;
    }
    if (m.session !== id || old(m)) return;
    if (m.type === 'hold') {
      if (!m.held || !holding) setHold(!!m.held, false);
      return;
    }
    if (!m.call) return;
    if (m.type === 'call' && m.capability === 'terminal_exec') {
      shellCalls.add(m.call);
      const who = (m.person ? 'person' : m.path ?? '') + (m.replay ? ', before you opened this page' : '');
      term.write(`\x1b[1;32m$\x1b[0m \x1b[1m${String(m.input?.command ?? '')}\x1b[0m  \x1b[2m(${who})\x1b[0m\n`);
    } else if (m.type === 'call' && m.capability === 'send_input') {
      shellCalls.add(m.call);
    } else if (m.type === 'output' && shellCalls.has(m.call)) {
      term.write(m.data ?? '');
    } else if (m.type === 'end' && shellCalls.has(m.call)) {
      shellCalls.delete(m.call);
      if (m.outcome !== 'ok') term.write(`\x1b[31m[${m.outcome}] ${m.text ?? ''}\x1b[0m\n`);
      else if (m.exit_code !== undefined && m.exit_code !== 0) term.write(`\x1b[31m[exit ${m.exit_code}]\x1b[0m\n`);
    }
  }, id);
  // Whether someone holds the shell now is not known until an event says
  // so; the server refuses a take of a held shell and says why.
  return () => {
    stop();
    window.removeEventListener('resize', onResize);
    term.dispose();
  };
}

// livePage is the route #/live/<session>: the agent's shell and the
// session's timeline side by side (the session page shows them too).
export function livePage(id: string): Page {
  const title = h('span', { class: 'mono' }, id);
  const shell = h('div', { class: 'live-shell' });
  const tl = h('div', { class: 'live-timeline' });
  const el = h('section', { id: 'live-page' }, h('h1', null, 'Live ', title), h('div', { class: 'live' }, shell, tl));
  let stops: (() => void)[] = [];
  // Mount once the element is in the page (xterm.js measures its box).
  const t = setTimeout(async () => {
    let sid = id;
    try {
      sid = (await api<{ id: string }>('GET', `/v1/sessions/${encodeURIComponent(id)}`)).id;
    } catch (x) {
      flash(x instanceof Error ? x.message : String(x));
      return;
    }
    title.textContent = sid;
    stops = [mountAgentShell(shell, sid), mountTimeline(tl, sid)];
  });
  return {
    el,
    close: () => {
      clearTimeout(t);
      for (const s of stops) s();
    },
  };
}
