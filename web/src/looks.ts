import { h } from './dom';

// Looks that are the whole UI's: the colour scheme and the keyboard
// shortcuts. The scheme follows prefers-color-scheme until a person picks
// one with the header's toggle (or t); the choice is kept in localStorage
// (a preference, nothing secret) as data-theme on <html>, which app.css
// reads.

const THEME = 'quro.theme';

export function theme(): 'light' | 'dark' {
  const t = document.documentElement.dataset.theme;
  if (t === 'light' || t === 'dark') return t;
  return matchMedia('(prefers-color-scheme: dark)').matches ? 'dark' : 'light';
}

function setTheme(t: 'light' | 'dark' | null) {
  if (t) {
    document.documentElement.dataset.theme = t;
    localStorage.setItem(THEME, t);
  } else {
    delete document.documentElement.dataset.theme;
    localStorage.removeItem(THEME);
  }
  document.dispatchEvent(new CustomEvent('quro-theme'));
}

export function toggleTheme(): void {
  const next = theme() === 'dark' ? 'light' : 'dark';
  // Back to following the system when the choice is what it says anyway.
  const system = matchMedia('(prefers-color-scheme: dark)').matches ? 'dark' : 'light';
  setTheme(next === system ? null : next);
}

// SHORTCUTS are the keys the UI answers outside a text field or terminal.
const SHORTCUTS: [string, string, () => void][] = [
  ['?', 'show this list', () => showHelp()],
  ['g s', 'go to Sessions', () => (location.hash = '#/sessions')],
  ['g p', 'go to the Playground', () => (location.hash = '#/play')],
  ['g a', 'go to the Audit log', () => (location.hash = '#/audit')],
  ['g o', 'go to the Operator view', () => (location.hash = '#/operator')],
  ['g t', 'go to Status', () => (location.hash = '#/status')],
  ['t', 'light or dark', toggleTheme],
  ['Esc', 'close this list', () => hideHelp()],
];

let help: HTMLDialogElement | null = null;

function showHelp() {
  if (!help) {
    help = h(
      'dialog',
      { id: 'shortcuts', 'aria-label': 'Keyboard shortcuts' },
      h('h2', null, 'Keyboard shortcuts'),
      h('dl', { class: 'facts' }, SHORTCUTS.flatMap(([k, what]) => [h('dt', null, h('kbd', null, k)), h('dd', null, what)])),
      h('p', { class: 'hint' }, 'In the terminal: Ctrl+Shift+C / Ctrl+Shift+V copy and paste. In the playground: Ctrl+Enter runs.'),
      h('button', { type: 'button', onclick: () => hideHelp() }, 'Close'),
    );
    document.body.append(help);
  }
  if (!help.open) help.showModal();
}

function hideHelp() {
  if (help?.open) help.close();
}

function typing(t: EventTarget | null): boolean {
  const el = t as HTMLElement | null;
  if (!el || !el.closest) return false;
  return !!el.closest('input, textarea, select, [contenteditable], .xterm, .cm-editor');
}

export function installLooks(): void {
  const saved = localStorage.getItem(THEME);
  if (saved === 'light' || saved === 'dark') document.documentElement.dataset.theme = saved;
  matchMedia('(prefers-color-scheme: dark)').addEventListener('change', () => document.dispatchEvent(new CustomEvent('quro-theme')));
  document.addEventListener('click', (e) => {
    if ((e.target as HTMLElement | null)?.closest?.('#theme-toggle')) toggleTheme();
  });
  let prefix = '';
  document.addEventListener('keydown', (e) => {
    if (e.ctrlKey || e.metaKey || e.altKey || typing(e.target)) return;
    const key = prefix ? `${prefix} ${e.key}` : e.key;
    prefix = '';
    if (key === 'g') {
      prefix = 'g';
      return;
    }
    const hit = SHORTCUTS.find(([k]) => k === key || (k === 'Esc' && key === 'Escape'));
    if (hit) {
      e.preventDefault();
      hit[2]();
    }
  });
}
