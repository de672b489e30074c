import { api, APIError, Session } from './api';
import { ago, clear, h } from './dom';
import { Page } from './page';

// The operator's view across tenants (list_sessions with tenant "*" or a
// tenant's name): for an admin of the local tenant only; the server
// refuses anyone else (403), and the page says so.
export function operatorPage(): Page {
  const tenant = h('select', { id: 'operator-tenant', 'aria-label': 'tenant' }, h('option', { value: '*' }, 'every tenant'));
  const body = h('tbody');
  const err = h('p', { class: 'error', role: 'alert', id: 'operator-error' });
  const count = h('span', { class: 'hint', id: 'operator-count' });
  const known = new Set<string>();
  let timer: ReturnType<typeof setInterval> | undefined;

  async function load() {
    let list: Session[];
    try {
      list = (await api<{ sessions: Session[] | null }>('POST', '/v1/list_sessions', { tenant: tenant.value }, undefined, true)).sessions ?? [];
    } catch (x) {
      if (x instanceof APIError && x.status === 403) {
        clearInterval(timer);
        err.textContent = `This view is the operator's (an admin token of the local tenant): ${x.message}`;
      } else if (!(x instanceof APIError && x.status === 401)) err.textContent = (x as Error).message;
      return;
    }
    err.textContent = '';
    clear(body);
    for (const s of list) {
      const t = s.tenant ?? '';
      if (tenant.value === '*' && !known.has(t)) {
        known.add(t);
        tenant.append(h('option', { value: t === '' ? '' : t }, t === '' ? '(local)' : t));
      }
      const r = s.resources;
      body.append(
        h(
          'tr',
          { 'data-tenant': t, 'data-session': s.name },
          h('td', { 'data-label': 'Tenant', class: 'mono' }, t === '' ? '(local)' : t),
          // Another tenant's session opens read-only: its page shows what
          // this listing gives (the operator's token acts only in its own
          // tenant's sessions).
          h('td', { 'data-label': 'Session' }, h('a', { href: `#/session/${encodeURIComponent(s.id)}` }, s.name), h('span', { class: 'hint mono' }, ` ${s.id.slice(0, 8)}`)),
          h('td', { 'data-label': 'State' }, h('span', { class: `state ${s.state === 'paused' ? 'paused' : s.busy ? 'busy' : 'alive'}` }, s.state ?? '')),
          h('td', { 'data-label': 'Memory', class: 'mono' }, r ? `${(r.memory_bytes / 1048576).toFixed(1)} MiB` : '—'),
          h('td', { 'data-label': 'CPU', class: 'mono' }, r ? `${r.cpu_seconds.toFixed(1)} s` : '—'),
          h('td', { 'data-label': 'Network' }, s.network),
          h('td', { 'data-label': 'Created', title: s.created_at }, ago(s.created_at)),
          h('td', { 'data-label': 'Idle', title: s.last_used_at }, ago(s.last_used_at)),
        ),
      );
    }
    count.textContent = `${list.length} session${list.length === 1 ? '' : 's'}`;
  }
  tenant.addEventListener('change', load);
  load();
  timer = setInterval(load, 5000);
  const el = h(
    'section',
    { id: 'operator' },
    h('h1', null, 'Operator: every tenant'),
    h('div', { class: 'row' }, h('label', null, 'Tenant ', tenant), count),
    err,
    h('table', { class: 'grid cards' }, h('thead', null, h('tr', null, ['Tenant', 'Session', 'State', 'Memory', 'CPU', 'Network', 'Created', 'Idle'].map((x) => h('th', null, x)))), body),
  );
  return { el, close: () => clearInterval(timer) };
}
