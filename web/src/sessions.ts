import { api, APIError, Session } from './api';
import { ago, fill, h, keyed, latest } from './dom';
import { Page, flash } from './page';

// The session list: status, cwd, last exit, mode; create, destroy, set default.
export function sessionsPage(): Page {
  const body = h('tbody');
  const err = h('p', { class: 'error', role: 'alert' });
  const name = h('input', { name: 'name', placeholder: 'name (optional)', pattern: '[A-Za-z0-9._-]*', autocomplete: 'off' });
  const network = h('select', { name: 'network' }, h('option', { value: 'none' }, 'network: none'), h('option', { value: 'internet' }, 'network: internet'));
  const lifetime = h('input', { name: 'timeout_s', type: 'number', min: 0, placeholder: 'lifetime s (optional)', 'aria-label': 'lifetime in seconds' });
  const metadata = h('input', { name: 'metadata', placeholder: 'labels: k=v, k2=v2', autocomplete: 'off', 'aria-label': 'metadata' });
  const form = h(
    'form',
    { class: 'row', id: 'create-session' },
    name,
    network,
    lifetime,
    metadata,
    h('button', { type: 'submit' }, 'Create session'),
  );
  form.addEventListener('submit', async (e) => {
    e.preventDefault();
    const args: Record<string, unknown> = { network: network.value };
    if (name.value.trim()) args.name = name.value.trim();
    if (Number(lifetime.value) > 0) args.timeout_s = Number(lifetime.value);
    const labels: Record<string, string> = {};
    for (const pair of metadata.value.split(',')) {
      const [k, ...v] = pair.split('=');
      if (k.trim()) labels[k.trim()] = v.join('=').trim();
    }
    if (Object.keys(labels).length) args.metadata = labels;
    try {
      const s = await api<Session>('POST', '/v1/sessions', args);
      name.value = '';
      lifetime.value = '';
      metadata.value = '';
      flash(`Created session ${s.name}`);
      await load();
    } catch (x) {
      err.textContent = (x as Error).message;
    }
  });

  async function act(what: () => Promise<unknown>) {
    err.textContent = '';
    try {
      await what();
    } catch (x) {
      err.textContent = (x as Error).message;
    }
    await load();
  }

  // The rows, keyed by session id, are kept across refreshes and only
  // their changed cells are rewritten (dom.ts's keyed and fill).
  interface Row {
    s: Session;
    el: HTMLTableRowElement;
    name: HTMLTableCellElement;
    status: HTMLTableCellElement;
    cwd: HTMLTableCellElement;
    exit: HTMLTableCellElement;
    mode: HTMLTableCellElement;
    used: HTMLTableCellElement;
    makeDefault: HTMLButtonElement;
  }

  function newRow(s: Session): Row {
    const r: Row = {
      s,
      el: h('tr', { 'data-session': s.name }),
      name: h('td', { 'data-label': 'Name' }),
      status: h('td', { 'data-label': 'Status' }),
      cwd: h('td', { class: 'mono path', 'data-label': 'Directory' }),
      exit: h('td', { 'data-label': 'Last exit' }),
      mode: h('td', { 'data-label': 'Mode' }),
      used: h('td', { 'data-label': 'Used' }),
      // The buttons act on the row's session as last listed (r.s), not
      // on the one the row was made for.
      makeDefault: h('button', { onclick: () => act(() => api('POST', '/v1/set_default_session', { session: r.s.id })) }, 'Make default'),
    };
    const id = encodeURIComponent(s.id);
    const destroy = () => {
      if (confirm(`Destroy session ${r.s.name}? Its workspace is deleted.`)) act(() => api('DELETE', `/v1/sessions/${id}`));
    };
    r.el.append(
      r.name,
      r.status,
      r.cwd,
      r.exit,
      r.mode,
      r.used,
      h(
        'td',
        { class: 'actions' },
        h('a', { href: `#/term/${id}`, class: 'button' }, 'Terminal'),
        h('a', { href: `#/play/${id}`, class: 'button' }, 'Run code'),
        r.makeDefault,
        h('button', { class: 'danger', onclick: destroy }, 'Destroy'),
      ),
    );
    return r;
  }

  function update(r: Row, s: Session) {
    r.s = s;
    if (r.el.dataset.session !== s.name) r.el.dataset.session = s.name;
    const id = encodeURIComponent(s.id);
    fill(r.name, null, h('a', { href: `#/session/${id}`, class: 'name' }, s.name), s.default ? h('span', { class: 'badge' }, 'default') : null);
    const state = s.state === 'paused' ? 'paused' : s.busy ? 'busy' : s.alive ? 'alive' : 'idle';
    fill(r.status, null, h('span', { class: `state ${state}` }, state));
    fill(r.cwd, { title: s.cwd }, s.cwd);
    fill(r.exit, { class: s.last_exit === 0 ? 'mono' : 'mono bad' }, s.last_exit);
    fill(r.mode, null, `${s.mode}${s.rootfs ? ` (${s.rootfs})` : ''}${s.network !== 'none' ? ` · ${s.network}` : ''}`);
    fill(r.used, { title: s.last_used_at }, ago(s.last_used_at));
    if (r.makeDefault.disabled !== s.default) r.makeDefault.disabled = s.default;
  }
  const rows = keyed(body, (s: Session) => s.id, newRow, update);

  // Refreshes overlap (the timer's and an action's): only a list newer
  // than the one shown is drawn (see latest).
  const ticket = latest();
  let refreshes = 0;
  async function load() {
    const fresh = ticket();
    let list: Session[];
    try {
      list = (await api<{ sessions: Session[] | null }>('GET', '/v1/sessions', undefined, undefined, true)).sessions ?? [];
    } catch (x) {
      if (!(x instanceof APIError && x.status === 401)) err.textContent = (x as Error).message;
      return;
    }
    if (!fresh()) return;
    rows.sync(list);
    // What a watcher (the browser test) waits on: a refresh has been drawn.
    el.dataset.refreshes = String(++refreshes);
  }

  const el = h(
    'section',
    { id: 'sessions' },
    h('h1', null, 'Sessions'),
    form,
    err,
    h(
      'table',
      { class: 'grid cards' },
      h('thead', null, h('tr', null, ['Name', 'Status', 'Working directory', 'Last exit', 'Mode', 'Used', ''].map((t) => h('th', null, t)))),
      body,
    ),
  );
  load();
  const timer = setInterval(load, 5000);
  return { el, close: () => clearInterval(timer) };
}
