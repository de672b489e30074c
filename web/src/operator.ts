import { api, APIError, Session } from './api';
import { ago, fill, h, keyed, latest } from './dom';
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

  // The rows, keyed by session id, are kept across refreshes and only
  // their changed cells are rewritten (dom.ts's keyed and fill): a click
  // on a session's link, a selection or a screen reader's place in the
  // table lives through the 5 s refresh.
  interface Row {
    el: HTMLTableRowElement;
    cells: HTMLTableCellElement[];
  }
  const labels = ['Tenant', 'Session', 'State', 'Memory', 'CPU', 'Network', 'Created', 'Idle'];
  function newRow(): Row {
    const cells = labels.map((l) => h('td', { 'data-label': l }));
    return { el: h('tr', null, cells), cells };
  }
  function update(row: Row, s: Session) {
    const t = s.tenant ?? '';
    if (row.el.dataset.tenant !== t) row.el.dataset.tenant = t;
    if (row.el.dataset.session !== s.name) row.el.dataset.session = s.name;
    const r = s.resources;
    const [tn, name, state, mem, cpu, net, created, idle] = row.cells;
    fill(tn, { class: 'mono' }, t === '' ? '(local)' : t);
    // Another tenant's session opens read-only: its page shows what this
    // listing gives (the operator's token acts only in its own tenant's
    // sessions).
    fill(name, null, h('a', { href: `#/session/${encodeURIComponent(s.id)}` }, s.name), h('span', { class: 'hint mono' }, ` ${s.id.slice(0, 8)}`));
    fill(state, null, h('span', { class: `state ${s.state === 'paused' ? 'paused' : s.busy ? 'busy' : 'alive'}` }, s.state ?? ''));
    fill(mem, { class: 'mono' }, r ? `${(r.memory_bytes / 1048576).toFixed(1)} MiB` : '—');
    fill(cpu, { class: 'mono' }, r ? `${r.cpu_seconds.toFixed(1)} s` : '—');
    fill(net, null, s.network);
    fill(created, { title: s.created_at }, ago(s.created_at));
    fill(idle, { title: s.last_used_at }, ago(s.last_used_at));
  }
  const rows = keyed(body, (s: Session) => s.id, newRow, update);

  // Refreshes overlap (the timer's and a change of tenant): only a list
  // newer than the one shown is drawn (see latest).
  const ticket = latest();
  let refreshes = 0;
  async function load() {
    const fresh = ticket();
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
    if (!fresh()) return;
    err.textContent = '';
    if (tenant.value === '*') {
      for (const s of list) {
        const t = s.tenant ?? '';
        if (known.has(t)) continue;
        known.add(t);
        tenant.append(h('option', { value: t }, t === '' ? '(local)' : t));
      }
    }
    rows.sync(list);
    count.textContent = `${list.length} session${list.length === 1 ? '' : 's'}`;
    // What a watcher (the browser test) waits on: a refresh has been drawn.
    el.dataset.refreshes = String(++refreshes);
  }
  const el = h('section', { id: 'operator' });
  tenant.addEventListener('change', load);
  el.append(
    h('h1', null, 'Operator: every tenant'),
    h('div', { class: 'row' }, h('label', null, 'Tenant ', tenant), count),
    err,
    h('table', { class: 'grid cards' }, h('thead', null, h('tr', null, labels.map((x) => h('th', null, x)))), body),
  );
  load();
  timer = setInterval(load, 5000);
  return { el, close: () => clearInterval(timer) };
}
