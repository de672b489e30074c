import { api, APIError, Session } from './api';
import { ago, clear, h } from './dom';
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

  async function load() {
    let list: Session[];
    try {
      list = (await api<{ sessions: Session[] | null }>('GET', '/v1/sessions', undefined, undefined, true)).sessions ?? [];
    } catch (x) {
      if (!(x instanceof APIError && x.status === 401)) err.textContent = (x as Error).message;
      return;
    }
    clear(body);
    for (const s of list) {
      const state = s.state === 'paused' ? 'paused' : s.busy ? 'busy' : s.alive ? 'alive' : 'idle';
      body.append(
        h(
          'tr',
          { 'data-session': s.name },
          h('td', { 'data-label': 'Name' }, h('a', { href: `#/session/${encodeURIComponent(s.id)}`, class: 'name' }, s.name), s.default ? h('span', { class: 'badge' }, 'default') : null),
          h('td', { 'data-label': 'Status' }, h('span', { class: `state ${state}` }, state)),
          h('td', { class: 'mono path', title: s.cwd, 'data-label': 'Directory' }, s.cwd),
          h('td', { class: s.last_exit === 0 ? 'mono' : 'mono bad', 'data-label': 'Last exit' }, s.last_exit),
          h('td', { 'data-label': 'Mode' }, s.mode, s.rootfs ? ` (${s.rootfs})` : '', s.network !== 'none' ? ` · ${s.network}` : ''),
          h('td', { title: s.last_used_at, 'data-label': 'Used' }, ago(s.last_used_at)),
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
      { class: 'grid cards' },
      h('thead', null, h('tr', null, ['Name', 'Status', 'Working directory', 'Last exit', 'Mode', 'Used', ''].map((t) => h('th', null, t)))),
      body,
    ),
  );
  load();
  const timer = setInterval(load, 5000);
  return { el, close: () => clearInterval(timer) };
}
