import { api, Status } from './api';
import { h } from './dom';
import { Page } from './page';

function duration(s: number): string {
  const d = Math.floor(s / 86400);
  const hh = Math.floor((s % 86400) / 3600);
  const m = Math.floor((s % 3600) / 60);
  return d ? `${d}d ${hh}h` : hh ? `${hh}h ${m}m` : `${m}m ${Math.floor(s % 60)}s`;
}

// Service status: the process, and the engines and isolation layers doctor reports.
export function statusPage(): Page {
  const el = h('section', { id: 'status' }, h('h1', null, 'Service status'), h('p', { class: 'hint' }, 'loading…'));
  api<Status>('GET', '/v1/status')
    .then((s) => {
      el.lastChild?.remove();
      el.append(
        h(
          'dl',
          { class: 'facts' },
          [
            ['Version', s.version],
            ['PID', s.pid],
            ['Up', duration(s.uptime_seconds)],
            ['Sessions', s.sessions],
            // The data directory: the operator's only.
            ...(s.data_dir ? [['Data', s.data_dir]] : []),
          ].flatMap(([k, v]) => [h("dt", null, k), h("dd", { class: "mono" }, v)]),
        ),
        h('h2', null, 'Isolation layers'),
        h(
          'table',
          { class: 'grid', id: 'isolation' },
          h('thead', null, h('tr', null, ['Layer', 'Available', 'Used', 'Detail'].map((t) => h('th', null, t)))),
          h(
            'tbody',
            null,
            (s.isolation ?? []).map((l) =>
              h('tr', null, h('td', { class: 'mono' }, l.name), h('td', { class: l.available ? 'ok' : 'bad' }, l.available ? 'yes' : 'no'), h('td', null, l.used ? 'yes' : 'no'), h('td', null, l.detail)),
            ),
          ),
        ),
        h('h2', null, 'Engines'),
        h(
          'table',
          { class: 'grid', id: 'engines' },
          h('thead', null, h('tr', null, ['Language', 'Tier', 'Engine', 'Available', 'Reason'].map((t) => h('th', null, t)))),
          h(
            'tbody',
            null,
            (s.engines ?? []).map((e) =>
              h('tr', null, h('td', { class: 'mono' }, e.lang), h('td', { class: 'num' }, e.tier), h('td', { class: 'mono' }, e.engine), h('td', { class: e.available ? 'ok' : 'bad' }, e.available ? 'yes' : 'no'), h('td', null, e.reason ?? '')),
            ),
          ),
        ),
      );
    })
    .catch((x) => {
      el.lastChild!.textContent = (x as Error).message;
    });
  return { el };
}
