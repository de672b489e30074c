import { api, AuditEntry } from './api';
import { fill, h, keyed, latest } from './dom';
import { Page } from './page';

// The audit log with filters (capability, outcome, session, since, limit;
// all on the server's side), newest first; the UI's own background reads
// are left out unless asked for. A row opens to its whole entry.
export function auditPage(): Page {
  const capability = h('select', { id: 'audit-capability', 'aria-label': 'capability' }, h('option', { value: '' }, 'every capability'));
  const since = h('input', { id: 'audit-since', placeholder: 'since: 15m, 2h or 2026-01-02T15:04:05Z', size: 28, autocomplete: 'off' });
  const limit = h('input', { id: 'audit-limit', type: 'number', min: 1, max: 1000, value: 100, 'aria-label': 'limit' });
  const outcome = h(
    'select',
    { id: 'audit-outcome', 'aria-label': 'outcome' },
    h('option', { value: '' }, 'every outcome'),
    h('option', { value: 'ok' }, 'ok'),
    h('option', { value: 'failed' }, 'failed (not ok)'),
    ['timeout', 'canceled', 'invalid_argument', 'not_found', 'permission_denied', 'busy', 'resource_exhausted', 'unavailable', 'internal'].map((o) => h('option', { value: o }, o)),
  );
  const sessionSel = h('select', { id: 'audit-session', 'aria-label': 'session' }, h('option', { value: '' }, 'every session'));
  const background = h('input', { id: 'audit-background', type: 'checkbox' });
  const names = new Map<string, string>(); // session id → name
  const body = h('tbody');
  const err = h('p', { class: 'error', role: 'alert' });
  const count = h('span', { class: 'hint' });
  const form = h(
    'form',
    { class: 'row', id: 'audit-filters' },
    capability,
    since,
    h('label', null, 'limit ', limit),
    outcome,
    sessionSel,
    h('label', { title: "reads a page made by itself to refresh what it shows (this UI's polling)" }, background, ' background reads'),
    h('button', { type: 'submit' }, 'Apply'),
    count,
  );

  // The rows, keyed by the entry's sequence number, are kept when a
  // filter changes: an entry still listed keeps its row, opened or not,
  // and the focus in it (an entry never changes once logged).
  const rows = keyed(
    body,
    (e: AuditEntry) => String(e.seq),
    (e: AuditEntry) => {
      // A click on a row opens its whole entry below it (the arguments as
      // the log keeps them: code and commands by their first line).
      const detail = h(
        'dl',
        { class: 'facts audit-detail', hidden: true },
        [
          ['Arguments', e.args || '(none)'],
          ['Outcome', e.outcome + (e.message ? `: ${e.message}` : '')],
          ['Session', e.session ?? '—'],
          ['Token', e.token_id ?? '—'],
          ['Access path', e.path + (e.background ? ' (background read)' : '')],
          ['Time', e.time],
        ].flatMap(([k, v]) => [h('dt', null, k), h('dd', { class: 'mono' }, v)]),
      );
      const row = h(
        'tr',
        { class: `${e.outcome === 'ok' ? '' : 'failed'} expandable`, 'data-seq': e.seq, tabindex: 0, 'aria-expanded': 'false' },
        h('td', { class: 'mono' }, e.seq),
        h('td', { class: 'mono', title: e.time }, new Date(e.time).toLocaleString()),
        h('td', null, e.path, e.background ? h('span', { class: 'badge' }, 'background') : null),
        h('td', { class: 'mono' }, e.token_id ?? ''),
        h('td', { class: 'mono' }, e.capability),
        h('td', { class: 'mono audit-session', title: e.session ?? '' }, e.session ? names.get(e.session) ?? e.session.slice(0, 8) : ''),
        h('td', { class: 'mono args', title: e.args }, h('span', { class: 'args-line' }, e.args), detail),
        h('td', { class: e.outcome === 'ok' ? 'ok' : 'bad', title: e.message ?? '' }, e.outcome, e.message ? `: ${e.message}` : ''),
        h('td', { class: 'mono num' }, e.duration_ms.toFixed(1)),
      );
      const toggle = () => {
        detail.hidden = !detail.hidden;
        row.classList.toggle('open', !detail.hidden);
        row.setAttribute('aria-expanded', String(!detail.hidden));
      };
      row.addEventListener('click', toggle);
      row.addEventListener('keydown', (k) => {
        if (k.key === 'Enter' || k.key === ' ') {
          k.preventDefault();
          toggle();
        }
      });
      return { el: row };
    },
    () => {},
  );

  // Loads overlap (a filter changed while one was on its way): only an
  // answer newer than the one shown is drawn (see latest).
  const ticket = latest();
  let refreshes = 0;
  async function load() {
    const fresh = ticket();
    err.textContent = '';
    const q = new URLSearchParams();
    q.set('limit', limit.value || '100');
    if (capability.value) q.set('capability', capability.value);
    if (since.value.trim()) q.set('since', since.value.trim());
    if (outcome.value) q.set('outcome', outcome.value);
    if (sessionSel.value) q.set('session', sessionSel.value);
    if (background.checked) q.set('include_background', 'true');
    let entries: AuditEntry[];
    try {
      entries = (await api<{ entries: AuditEntry[] | null }>('GET', `/v1/audit?${q}`)).entries ?? [];
    } catch (x) {
      err.textContent = (x as Error).message;
      return;
    }
    if (!fresh()) return;
    entries = entries.slice().reverse(); // the server gives oldest first
    rows.sync(entries);
    fill(count, null, `${entries.length} entr${entries.length === 1 ? 'y' : 'ies'}`);
    // What a watcher (the browser test) waits on: a load has been drawn.
    el.dataset.refreshes = String(++refreshes);
  }
  form.addEventListener('submit', (e) => {
    e.preventDefault();
    load();
  });
  capability.addEventListener('change', load);
  outcome.addEventListener('change', load);
  sessionSel.addEventListener('change', load);
  background.addEventListener('change', load);
  api<{ sessions: { id: string; name: string }[] | null }>('GET', '/v1/sessions', undefined, undefined, true)
    .then(({ sessions }) => {
      for (const s of sessions ?? []) {
        names.set(s.id, s.name);
        sessionSel.append(h('option', { value: s.id }, s.name));
      }
    })
    .catch(() => {})
    .then(load); // once the names are known, so that the session column shows them

  api<{ capabilities: { name: string }[] | null }>('GET', '/v1/capabilities', undefined, undefined, true)
    .then(({ capabilities }) => {
      for (const c of (capabilities ?? []).map((c) => c.name).sort()) capability.append(h('option', { value: c }, c));
    })
    .catch(() => {});

  const el = h(
    'section',
    { id: 'audit' },
    h('h1', null, 'Audit log'),
    form,
    err,
    h(
      'table',
      { class: 'grid' },
      h('thead', null, h('tr', null, ['#', 'Time', 'Path', 'Token', 'Capability', 'Session', 'Arguments', 'Outcome', 'ms'].map((t) => h('th', null, t)))),
      body,
    ),
  );
  return { el };
}
