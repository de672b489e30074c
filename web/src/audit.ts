import { api, AuditEntry } from './api';
import { clear, h } from './dom';
import { Page } from './page';

// The audit log with filters (capability, since, limit), newest first.
export function auditPage(): Page {
  const capability = h('select', { id: 'audit-capability', 'aria-label': 'capability' }, h('option', { value: '' }, 'every capability'));
  const since = h('input', { id: 'audit-since', placeholder: 'since: 15m, 2h or 2026-01-02T15:04:05Z', size: 28, autocomplete: 'off' });
  const limit = h('input', { id: 'audit-limit', type: 'number', min: 1, max: 1000, value: 100, 'aria-label': 'limit' });
  const errorsOnly = h('input', { id: 'audit-errors', type: 'checkbox' });
  const body = h('tbody');
  const err = h('p', { class: 'error', role: 'alert' });
  const count = h('span', { class: 'hint' });
  const form = h(
    'form',
    { class: 'row', id: 'audit-filters' },
    capability,
    since,
    h('label', null, 'limit ', limit),
    h('label', null, errorsOnly, ' errors only'),
    h('button', { type: 'submit' }, 'Apply'),
    count,
  );

  async function load() {
    err.textContent = '';
    const q = new URLSearchParams();
    q.set('limit', limit.value || '100');
    if (capability.value) q.set('capability', capability.value);
    if (since.value.trim()) q.set('since', since.value.trim());
    let entries: AuditEntry[];
    try {
      entries = (await api<{ entries: AuditEntry[] | null }>('GET', `/v1/audit?${q}`)).entries ?? [];
    } catch (x) {
      err.textContent = (x as Error).message;
      return;
    }
    entries = entries.slice().reverse(); // the server gives oldest first
    if (errorsOnly.checked) entries = entries.filter((e) => e.outcome !== 'ok');
    clear(body);
    for (const e of entries) {
      body.append(
        h(
          'tr',
          { class: e.outcome === 'ok' ? '' : 'failed' },
          h('td', { class: 'mono' }, e.seq),
          h('td', { class: 'mono', title: e.time }, new Date(e.time).toLocaleString()),
          h('td', null, e.path),
          h('td', { class: 'mono' }, e.token_id ?? ''),
          h('td', { class: 'mono' }, e.capability),
          h('td', { class: 'mono args', title: e.args }, e.args),
          h('td', { class: e.outcome === 'ok' ? 'ok' : 'bad', title: e.message ?? '' }, e.outcome, e.message ? `: ${e.message}` : ''),
          h('td', { class: 'mono num' }, e.duration_ms.toFixed(1)),
        ),
      );
    }
    count.textContent = `${entries.length} entr${entries.length === 1 ? 'y' : 'ies'}`;
  }
  form.addEventListener('submit', (e) => {
    e.preventDefault();
    load();
  });
  capability.addEventListener('change', load);
  errorsOnly.addEventListener('change', load);

  api<{ capabilities: { name: string }[] | null }>('GET', '/v1/capabilities')
    .then(({ capabilities }) => {
      for (const c of (capabilities ?? []).map((c) => c.name).sort()) capability.append(h('option', { value: c }, c));
    })
    .catch(() => {});
  load();

  const el = h(
    'section',
    { id: 'audit' },
    h('h1', null, 'Audit log'),
    form,
    err,
    h(
      'table',
      { class: 'grid' },
      h('thead', null, h('tr', null, ['#', 'Time', 'Path', 'Token', 'Capability', 'Arguments', 'Outcome', 'ms'].map((t) => h('th', null, t)))),
      body,
    ),
  );
  return { el };
}
