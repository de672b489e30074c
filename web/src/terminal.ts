import { Terminal } from '@xterm/xterm';
import { FitAddon } from '@xterm/addon-fit';
import { api, APIError, openSocket, Session, onUnauthenticated } from './api';
import { h } from './dom';
import { Page, flash } from './page';

// The session's interactive terminal over /v1/sessions/{id}/pty (quro.v1):
// binary frames are terminal bytes both ways, text frames JSON control
// messages. Every (re)connect starts with hello and the scrollback as one
// binary frame, so the screen is reset on hello and then repainted.
// Escape sequences only ever reach xterm.js, which draws into its own
// element; nothing of the terminal's output touches the page's DOM as HTML.
// The smallest terminal the page fits to (a phone's is some 40 columns
// and 15 rows); a box smaller than that keeps the size the terminal has.
const MIN_COLS = 20;
const MIN_ROWS = 5;

export function terminalPage(id: string): Page {
  const title = h('span', { class: 'mono' }, id);
  const state = h('span', { class: 'conn', id: 'term-state' }, 'connecting…');
  const box = h('div', { class: 'term', id: 'terminal' });
  const copyBtn = h('button', { type: 'button', title: 'Copy the selection (Ctrl+Shift+C)' }, 'Copy');
  const pasteBtn = h('button', { type: 'button', title: 'Paste the clipboard (Ctrl+Shift+V)' }, 'Paste');
  const reconnectBtn = h('button', { type: 'button', id: 'term-reconnect' }, 'Reconnect');
  // The extra-keys row (a phone's keyboard has no Esc, Tab, Ctrl or
  // arrows): each sends the bytes the key sends; Ctrl is held for the
  // next key typed.
  let ctrl = false;
  const ctrlBtn = h('button', { type: 'button', 'aria-pressed': 'false', title: 'Ctrl with the next key' }, 'Ctrl');
  const extra: [string, string][] = [
    ['Esc', '\x1b'],
    ['Tab', '\t'],
    ['←', '\x1b[D'],
    ['↑', '\x1b[A'],
    ['↓', '\x1b[B'],
    ['→', '\x1b[C'],
  ];
  const keys = h(
    'div',
    { class: 'extra-keys', id: 'term-keys' },
    extra.slice(0, 2).map(([label, seq]) => h('button', { type: 'button', onclick: () => sendKey(seq) }, label)),
    ctrlBtn,
    extra.slice(2).map(([label, seq]) => h('button', { type: 'button', 'aria-label': label, onclick: () => sendKey(seq) }, label)),
  );
  ctrlBtn.addEventListener('click', () => {
    ctrl = !ctrl;
    ctrlBtn.setAttribute('aria-pressed', String(ctrl));
    term.focus();
  });
  const el = h(
    'section',
    { id: 'term-page' },
    h('h1', null, 'Terminal ', title, ' ', state),
    h('div', { class: 'row' }, copyBtn, pasteBtn, reconnectBtn, h('span', { class: 'hint' }, 'Ctrl+Shift+C / Ctrl+Shift+V copy and paste; the shell lives on when you leave.')),
    box,
    keys,
  );

  const term = new Terminal({
    cursorBlink: true,
    scrollback: 5000,
    fontFamily: 'ui-monospace, "DejaVu Sans Mono", Menlo, Consolas, monospace',
    fontSize: 14,
    // At lineHeight 1 the cell is the font's ascent+descent rounded to
    // device pixels; at DPR 1 that cut the underscore (drawn at the very
    // bottom of the descent) off the row. A taller row keeps every glyph
    // inside its cell at DPR 1 and 2.
    lineHeight: 1.2,
    theme: { background: '#111417', foreground: '#d8dee4' },
  });
  const fit = new FitAddon();
  term.loadAddon(fit);

  let ws: WebSocket | null = null;
  let closed = false; // the page was left
  let exited = false; // the shell ended: wait for the user to reconnect
  let attempt = 0;
  let retry: ReturnType<typeof setTimeout> | undefined;
  const enc = new TextEncoder();

  function setState(text: string, cls: string) {
    state.textContent = text;
    state.className = `conn ${cls}`;
  }

  function sendResize() {
    if (ws?.readyState === WebSocket.OPEN) ws.send(JSON.stringify({ type: 'resize', cols: term.cols, rows: term.rows }));
  }

  async function copy() {
    const sel = term.getSelection();
    if (!sel) return;
    try {
      await navigator.clipboard.writeText(sel);
      flash('Copied');
    } catch {
      flash('The browser refused the clipboard');
    }
  }
  async function paste() {
    try {
      const text = await navigator.clipboard.readText();
      if (text) term.paste(text);
    } catch {
      flash('The browser refused the clipboard; use its own paste (Ctrl+V or middle click)');
    }
    term.focus();
  }
  copyBtn.addEventListener('click', copy);
  pasteBtn.addEventListener('click', paste);
  term.attachCustomKeyEventHandler((e) => {
    if (e.type === 'keydown' && e.ctrlKey && e.shiftKey && (e.code === 'KeyC' || e.code === 'KeyV')) {
      if (e.code === 'KeyC') copy();
      else paste();
      e.preventDefault();
      return false;
    }
    return true;
  });

  function sendKey(seq: string) {
    if (ws?.readyState === WebSocket.OPEN) ws.send(enc.encode(seq));
    term.focus();
  }
  term.onData((d) => {
    if (ctrl && d.length === 1) {
      // Ctrl held from the extra-keys row: a letter becomes its control code.
      const c = d.toUpperCase().charCodeAt(0);
      if (c >= 0x40 && c <= 0x5f) d = String.fromCharCode(c - 0x40);
      ctrl = false;
      ctrlBtn.setAttribute('aria-pressed', 'false');
    }
    if (ws?.readyState === WebSocket.OPEN) ws.send(enc.encode(d));
  });
  term.onBinary((d) => {
    if (ws?.readyState !== WebSocket.OPEN) return;
    const b = new Uint8Array(d.length);
    for (let i = 0; i < d.length; i++) b[i] = d.charCodeAt(i) & 0xff;
    ws.send(b);
  });
  term.onResize(sendResize);

  function connect() {
    clearTimeout(retry);
    if (closed) return;
    exited = false;
    setState(attempt ? 'reconnecting…' : 'connecting…', 'wait');
    const sock = openSocket(`/v1/sessions/${encodeURIComponent(id)}/pty`);
    ws = sock;
    sock.onmessage = (m) => {
      if (typeof m.data !== 'string') {
        term.write(new Uint8Array(m.data as ArrayBuffer));
        return;
      }
      let msg: { type?: string; code?: number; message?: string };
      try {
        msg = JSON.parse(m.data);
      } catch {
        return;
      }
      switch (msg.type) {
        case 'hello':
          attempt = 0;
          term.reset(); // the scrollback frame that follows repaints the screen
          setState('connected', 'ok');
          refit();
          sendResize();
          term.focus();
          break;
        case 'exit':
          exited = true;
          setState(`shell exited (code ${msg.code ?? '?'}); Reconnect starts a new one`, 'bad');
          break;
        case 'error':
          flash(msg.message ?? 'terminal error');
          break;
      }
    };
    sock.onclose = async (ev) => {
      if (ws !== sock || closed) return;
      ws = null;
      if (exited) return;
      // Find out why before trying again: a revoked token or a destroyed
      // session will not come back.
      try {
        await api('GET', `/v1/sessions/${encodeURIComponent(id)}`);
      } catch (x) {
        if (x instanceof APIError && x.status === 401) {
          onUnauthenticated();
          return;
        }
        if (x instanceof APIError && x.status === 404) {
          setState('this session no longer exists', 'bad');
          return;
        }
      }
      attempt++;
      const wait = Math.min(5000, 250 * 2 ** Math.min(attempt, 5));
      setState(`disconnected (${ev.code}${ev.reason ? ': ' + ev.reason : ''}); reconnecting in ${Math.round(wait / 100) / 10}s`, 'wait');
      retry = setTimeout(connect, wait);
    };
  }

  reconnectBtn.addEventListener('click', () => {
    const old = ws;
    ws = null;
    old?.close();
    attempt = 0;
    connect();
  });

  // refit fits the terminal to its box unless the box is, for the moment,
  // smaller than any terminal a person uses (a layout passing through,
  // such as a screenshot beyond the viewport: a box 12 px wide). Each fit
  // resizes the shell's terminal, and readline redraws its line for the
  // new width: fitted to 2 columns and back, it moved up and cleared a
  // line for every row its prompt had wrapped onto, erasing the output
  // above — in the scrollback too, which a reload then replayed.
  function refit() {
    const d = box.clientWidth > 0 ? fit.proposeDimensions() : undefined;
    if (d && d.cols >= MIN_COLS && d.rows >= MIN_ROWS) fit.fit();
  }
  const ro = new ResizeObserver(refit);

  // Open once the element is in the document (xterm measures it).
  queueMicrotask(() => {
    term.open(box);
    refit();
    ro.observe(box);
    connect();
  });
  api<Session>('GET', `/v1/sessions/${encodeURIComponent(id)}`)
    .then((s) => {
      title.textContent = s.name;
      title.title = s.id;
    })
    .catch(() => {});

  return {
    el,
    close: () => {
      closed = true;
      clearTimeout(retry);
      ro.disconnect();
      ws?.close();
      term.dispose();
    },
  };
}
