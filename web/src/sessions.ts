import { api, APIError, Session } from './api';
import { ago, clear, h } from './dom';
import { Page, flash } from './page';

// The session list: status, cwd, last exit, mode; create, destroy, set default.
export function sessionsPage(): Page {
  const body = h('tbody');
  const err = h('p', { class: 'error', role: 'alert' });
  const name = h('input', { name: 'name', placeholder: 'name (optional)', pattern: '[A-Za-z0-9._-]*', autocomplete: 'off' });
  const network = h('select', { name: 'network' }, h('option', { value: 'none' }, 'network: none'), h('option', { value: 'full' }, 'network: full'));
  const form = h(
    'form',
    { class: 'row', id: 'create-session' },
    name,
    network,
    h('button', { type: 'submit' }, 'Create session'),
  );
  form.addEventListener('submit', async (e) => {
    e.preventDefault();
    const args: Record<string, string> = { network: network.value };
    if (name.value.trim()) args.name = name.value.trim();
    try {
      const s = await api<Session>('POST', '/v1/sessions', args);
      name.value = '';
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

  async function load() {
    let list: Session[];
    try {
      list = (await api<{ sessions: Session[] | null }>('GET', '/v1/sessions')).sessions ?? [];
    } catch (x) {
      if (!(x instanceof APIError && x.status === 401)) err.textContent = (x as Error).message;
      return;
    }
    clear(body);
    for (const s of list) {
      const state = s.busy ? 'busy' : s.alive ? 'alive' : 'idle';
      body.append(
        h(
          'tr',
          { 'data-session': s.name },
          h('td', null, h('a', { href: `#/term/${encodeURIComponent(s.id)}`, class: 'name' }, s.name), s.default ? h('span', { class: 'badge' }, 'default') : null),
          h('td', null, h('span', { class: `state ${state}` }, state)),
          h('td', { class: 'mono path', title: s.cwd }, s.cwd),
          h('td', { class: s.last_exit === 0 ? 'mono' : 'mono bad' }, s.last_exit),
          h('td', null, s.mode, s.rootfs ? ` (${s.rootfs})` : '', s.network === 'full' ? ' · net' : ''),
          h('td', { title: s.last_used_at }, ago(s.last_used_at)),
          h(
            'td',
            { class: 'actions' },
            h('a', { href: `#/term/${encodeURIComponent(s.id)}`, class: 'button' }, 'Terminal'),
            h('a', { href: `#/play/${encodeURIComponent(s.id)}`, class: 'button' }, 'Run code'),
            h('button', { disabled: s.default, onclick: () => act(() => api('POST', '/v1/set_default_session', { session: s.id })) }, 'Make default'),
            h(
              'button',
              {
                class: 'danger',
                onclick: () => {
                  if (confirm(`Destroy session ${s.name}? Its workspace is deleted.`)) act(() => api('DELETE', `/v1/sessions/${encodeURIComponent(s.id)}`));
                },
              },
              'Destroy',
            ),
          ),
        ),
      );
    }
  }

  const el = h(
    'section',
    { id: 'sessions' },
    h('h1', null, 'Sessions'),
    form,
    err,
    h(
      'table',
      { class: 'grid' },
      h('thead', null, h('tr', null, ['Name', 'Status', 'Working directory', 'Last exit', 'Mode', 'Used', ''].map((t) => h('th', null, t)))),
      body,
    ),
  );
  load();
  const timer = setInterval(load, 5000);
  return { el, close: () => clearInterval(timer) };
}
