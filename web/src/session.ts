import { api, APIError, Session } from './api';
import { ago, fill, h, keyed, latest, Ticket } from './dom';
import { Page, flash } from './page';
import { mountAgentShell, mountTimeline } from './timeline';

// One session's page (#/session/<id>): its box's budgets (used of limit,
// refreshed live), state with pause/resume/snapshot/fork, lifetime, idle
// time, network policy and egress log, processes with their output,
// its listening ports with their preview URLs, rootfs and metadata. Every
// figure comes from a capability (get_session_status, list_processes,
// get_egress_log, list_ports, get_preview_url);
// the refreshes are marked background reads (see api's background flag),
// audited as such and hidden from the audit view by default.
//
// Its Live panel (#session-timeline) is the live view of timeline.ts
// mounted here: the agent's own shell, which a person may take over, and
// the session's timeline, opened with the session's recent calls
// replayed. #/live/<id> shows the same views on a page of their own; the
// workspace's files are #/files/<id>.

interface Proc {
  pid: number;
  tag?: string;
  config: { command?: string; args?: string[] | null; cwd?: string };
  pty?: boolean;
}

interface EgressEvent {
  Dest: string;
  Decision: string;
  Rule: string;
  Reason: string;
  BytesOut: number;
  BytesIn: number;
  Start: string;
}

function bytes(n: number): string {
  if (n < 1024) return `${n} B`;
  const u = ['KiB', 'MiB', 'GiB', 'TiB'];
  let v = n / 1024;
  let i = 0;
  while (v >= 1024 && i < u.length - 1) {
    v /= 1024;
    i++;
  }
  return `${v.toFixed(v < 10 ? 1 : 0)} ${u[i]}`;
}

// A meter is a labelled bar of used of limit (no bar without a limit),
// kept across refreshes: a refresh rewrites its figures, not its nodes.
interface MeterData {
  id: string;
  label: string;
  used: number;
  limit: number;
  text: string;
  data?: Record<string, string>;
}

interface Meter {
  el: HTMLElement;
  bar: HTMLElement;
  text: HTMLElement;
}

function newMeter(d: MeterData): Meter {
  const bar = h('div', { class: 'meter-bar' });
  const text = h('span', { class: 'mono' });
  const el = h('div', { class: 'meter', id: d.id }, h('div', { class: 'meter-label' }, h('span', null, d.label), text), h('div', { class: 'meter-track' }, bar));
  return { el, bar, text };
}

function drawMeter(m: Meter, d: MeterData) {
  const pct = d.limit > 0 ? Math.min(100, (d.used / d.limit) * 100) : 0;
  const width = `${pct.toFixed(1)}%`;
  if (m.bar.style.width !== width) m.bar.style.width = width;
  m.el.classList.toggle('hot', pct >= 90);
  for (const [k, v] of Object.entries({ used: String(d.used), limit: String(d.limit), ...d.data })) if (m.el.dataset[k] !== v) m.el.dataset[k] = v;
  fill(m.text, null, d.text);
}

// usage is a meter's figures: used of limit in fmt's unit.
function usage(id: string, label: string, used: number, limit: number, fmt: (n: number) => string): MeterData {
  return { id, label, used, limit, text: limit > 0 ? `${fmt(used)} of ${fmt(limit)}` : `${fmt(used)} (no limit)` };
}

// cpuUsage shows the CPU in use now (percent of one core since the last
// reading) against the session's ceiling, and the seconds used in all.
function cpuUsage(seconds: number, limit: number, now: number | undefined): MeterData {
  const pct = now === undefined ? 'measuring…' : `${now.toFixed(0)}% of a core now`;
  return {
    id: 'budget-cpu',
    label: 'CPU',
    used: now ?? 0,
    limit,
    text: `${pct}${limit ? `, at most ${limit}%` : ''} · ${seconds.toFixed(2)} s used`,
    data: { now: now === undefined ? '' : now.toFixed(1), seconds: String(seconds) },
  };
}

export function sessionPage(id: string): Page {
  const enc = encodeURIComponent(id);
  const title = h('span', { class: 'mono' }, id);
  const stateBadge = h('span', { class: 'state', id: 'session-state' });
  const err = h('p', { class: 'error', role: 'alert' });
  const facts = h('dl', { class: 'facts', id: 'session-facts' });
  const noBudgets = h('p', { class: 'hint' }, 'nothing of the session runs: no budgets in use');
  const budgets = h('div', { class: 'meters', id: 'session-budgets' }, noBudgets);
  const pauseBtn = h('button', { type: 'button', id: 'session-pause' }, 'Pause');
  const resumeBtn = h('button', { type: 'button', id: 'session-resume' }, 'Resume');
  const snapBtn = h('button', { type: 'button', id: 'session-snapshot' }, 'Snapshot');
  const forkBtn = h('button', { type: 'button', id: 'session-fork' }, 'Fork');
  const destroyBtn = h('button', { type: 'button', id: 'session-destroy', class: 'danger' }, 'Destroy');
  const procs = h('tbody');
  const procOut = h('pre', { class: 'output', id: 'session-proc-output', hidden: true });
  const egress = h('tbody');
  const port = h('input', { id: 'preview-port', type: 'number', min: 1, max: 65535, placeholder: 'port', 'aria-label': 'port' });
  const previews = h('ul', { id: 'session-previews', class: 'links' });
  const previewForm = h('form', { class: 'row', id: 'preview-form' }, port, h('button', { type: 'submit' }, 'Preview URL'));
  // The ports the session's code listens on (list_ports), each with a
  // button for its preview URL; redrawn only when the set changes, so a
  // link asked for stays while its port listens.
  const noPorts = h('li', { class: 'hint' }, 'no port listens in the session');
  const morePorts = h('li', { class: 'hint' }, 'more ports listen than are shown');
  const listening = h('ul', { id: 'session-ports', class: 'links' }, noPorts);
  let session: Session | null = null;
  let timer: ReturnType<typeof setInterval> | undefined;
  let gone = false;
  let closed = false;
  // The live panel, mounted once the session's id is known (the route may
  // name it), and the previous CPU reading, for the CPU in use now.
  const liveShell = h('div', { class: 'live-shell' });
  const liveTimeline = h('div', { class: 'live-timeline' });
  let liveStops: (() => void)[] | null = null;
  let lastCPU: { seconds: number; at: number } | null = null;
  // foreign is the tenant of another tenant's session the operator opened
  // from the operator view (null: the caller's own). Such a page is
  // read-only and shows what the operator's listing gives (list_sessions
  // with the tenant): no actions, no live view, no processes or egress,
  // which act as, or enter the session as, its tenant.
  let foreign: string | null = null;
  const actions = h('div', { class: 'row', id: 'session-actions' });
  const readOnly = h('p', { class: 'hint', id: 'session-readonly', hidden: true });
  const endedNote = h('p', { class: 'ended-note', id: 'session-ended', role: 'status', hidden: true });
  let lastSeen: Date | null = null;
  const liveHead = h('h2', null, 'Live: the agent’s shell and its calls');

  async function act(label: string, what: () => Promise<unknown>) {
    err.textContent = '';
    try {
      await what();
      flash(label);
    } catch (x) {
      err.textContent = (x as Error).message;
    }
    await load();
  }

  pauseBtn.addEventListener('click', () => act('Paused', () => api('POST', '/v1/pause_session', { session: id })));
  resumeBtn.addEventListener('click', () => act('Resumed', () => api('POST', '/v1/resume_session', { session: id })));
  snapBtn.addEventListener('click', () =>
    act('Snapshot taken', async () => {
      const r = await api<{ name?: string; id?: string }>('POST', `/v1/sessions/${enc}/snapshots`, {});
      flash(`Snapshot ${r.name ?? r.id ?? ''} taken`);
    }),
  );
  forkBtn.addEventListener('click', () =>
    act('Forked', async () => {
      const r = await api<{ sessions?: { id: string; name: string }[] }>('POST', '/v1/fork_session', { session: id });
      const s = r.sessions?.[0];
      if (s) location.hash = `#/session/${encodeURIComponent(s.id)}`;
    }),
  );
  destroyBtn.addEventListener('click', async () => {
    if (!confirm(`Destroy session ${session?.name ?? id}? Every process it started ends and its workspace is deleted.`)) return;
    try {
      await api('DELETE', `/v1/sessions/${enc}`);
      flash(`Destroyed session ${session?.name ?? id}`);
      location.hash = '#/sessions';
    } catch (x) {
      err.textContent = (x as Error).message;
    }
  });
  // previewLink asks get_preview_url for port's signed URL: a link that
  // opens in a new tab, good until its expiry.
  async function previewLink(n: number): Promise<HTMLElement | null> {
    err.textContent = '';
    try {
      const p = await api<{ port: number; signed_url: string; signed_host_url?: string; expires_at: string }>('POST', '/v1/get_preview_url', { session: id, port: n });
      const href = p.signed_host_url || p.signed_url;
      return h('span', null, h('a', { href, target: '_blank', rel: 'noopener noreferrer', class: 'preview-link' }, `port ${p.port}`), h('span', { class: 'hint' }, ` until ${new Date(p.expires_at).toLocaleTimeString()}`));
    } catch (x) {
      err.textContent = (x as Error).message;
      return null;
    }
  }
  previewForm.addEventListener('submit', async (e) => {
    e.preventDefault();
    const link = await previewLink(Number(port.value));
    if (link) previews.append(h('li', null, link));
  });

  // The listening ports, each with its preview button, kept by address
  // and port across refreshes: a link asked for stays while its port
  // listens, whatever other ports come and go.
  type Port = { port: number; addr: string };
  const ports = keyed(
    listening,
    (p: Port) => `${p.addr}:${p.port}`,
    (p) => {
      const btn = h('button', { type: 'button', class: 'preview-port' }, 'Preview URL');
      btn.addEventListener('click', async () => {
        const link = await previewLink(p.port);
        if (link) btn.replaceWith(link);
      });
      return { el: h('li', { 'data-port': String(p.port) }, h('span', { class: 'mono' }, `${p.port}`), h('span', { class: 'hint' }, ` on ${p.addr} `), btn) };
    },
    () => {},
  );

  async function showOutput(pid: number) {
    procOut.hidden = false;
    procOut.textContent = 'reading…';
    try {
      const r = await api<{ output?: string; stdout?: string; stderr?: string }>('POST', '/v1/read_process_output', { session: id, pid });
      procOut.textContent = r.output ?? [r.stdout, r.stderr].filter(Boolean).join('') ?? '';
    } catch (x) {
      procOut.textContent = (x as Error).message;
    }
  }

  // cpuNow is the share of a core the session used since the last
  // reading (the cgroup's usage, read by the server, over the wall time
  // between the two answers), or undefined on the first.
  function cpuNow(seconds: number): number | undefined {
    const at = performance.now();
    const prev = lastCPU;
    lastCPU = { seconds, at };
    if (!prev || at - prev.at < 500 || seconds < prev.seconds) return undefined;
    return Math.max(0, ((seconds - prev.seconds) / ((at - prev.at) / 1000)) * 100);
  }

  // The facts, a term and its value each (in a div, which a dl allows
  // and the grid's display: contents keeps in its columns), and the
  // budgets' meters, kept across refreshes: only what changed is redrawn.
  const factRows = keyed(
    facts,
    ([k]: [string, string]) => k,
    ([k]) => {
      const dd = h('dd', { class: 'mono' });
      return { el: h('div', null, h('dt', null, k), dd), dd };
    },
    (f, [, v]) => fill(f.dd, null, v),
  );
  const meters = keyed(budgets, (d: MeterData) => d.id, newMeter, drawMeter);

  function render(s: Session) {
    session = s;
    lastSeen = new Date();
    if (!liveStops && !closed && foreign === null) liveStops = [mountAgentShell(liveShell, s.id), mountTimeline(liveTimeline, s.id)];
    title.textContent = s.name;
    title.title = s.id;
    const paused = s.state === 'paused';
    stateBadge.textContent = s.state ?? '';
    stateBadge.className = `state ${paused ? 'paused' : s.busy ? 'busy' : 'alive'}`;
    stateBadge.title = s.busy ? 'running a call' : s.alive ? 'its shell is alive' : 'no shell yet';
    pauseBtn.disabled = paused;
    resumeBtn.disabled = !paused;
    const rows: [string, string][] = [
      ['Id', s.id],
      ...(s.tenant !== undefined ? [['Tenant', s.tenant || '(local)'] as [string, string]] : []),
      ['State', s.state ?? ''],
      ['Created', new Date(s.created_at).toLocaleString()],
      ['Idle', ago(s.last_used_at)],
      ['Expires', s.expires_at ? `${new Date(s.expires_at).toLocaleString()} (then ${s.on_timeout ?? 'destroy'})` : 'never'],
      ['Network', s.network + (s.network_rules ? ` (allow ${(s.network_rules.allow ?? []).join(', ') || '—'}; deny ${(s.network_rules.deny ?? []).join(', ') || '—'})` : '')],
      ['Rootfs', s.rootfs || 'host userland'],
      ['Shell', `${s.mode}, cwd ${s.cwd}, last exit ${s.last_exit}`],
      ['Metadata', Object.entries(s.metadata ?? {}).map(([k, v]) => `${k}=${v}`).join('  ') || '—'],
    ];
    factRows.sync(rows);
    const r = s.resources;
    if (!r) {
      meters.sync([], noBudgets);
      return;
    }
    meters.sync([
      usage('budget-memory', 'Memory', r.memory_bytes, r.memory_limit, bytes),
      usage('budget-tasks', 'Tasks', r.tasks, r.tasks_limit, String),
      cpuUsage(r.cpu_seconds, r.cpu_percent_limit, cpuNow(r.cpu_seconds)),
      usage('budget-disk', 'Disk', r.disk_bytes ?? 0, r.disk_limit ?? 0, bytes),
    ]);
  }

  // fromListing finds the session by id in the operator's listing of
  // tenant t ("*": every tenant); null when it is not there or the caller
  // is no operator (403).
  async function fromListing(t: string): Promise<Session | null> {
    try {
      const r = await api<{ sessions: Session[] | null }>('POST', '/v1/list_sessions', { tenant: t }, undefined, true);
      return (r.sessions ?? []).find((x) => x.id === id) ?? null;
    } catch {
      return null;
    }
  }

  // The background processes by pid and the egress log's connections,
  // kept across refreshes like the rest.
  const noProcs = h('tr', null, h('td', { colspan: 4, class: 'hint' }, 'no background processes'));
  const procRows = keyed(
    procs,
    (p: Proc) => String(p.pid),
    (p) => {
      const cells = [h('td', { class: 'mono' }, p.pid), h('td', { class: 'mono' }), h('td', { class: 'mono args' })];
      return { el: h('tr', null, cells, h('td', null, h('button', { type: 'button', onclick: () => showOutput(p.pid) }, 'Output'))), cells };
    },
    (r, p) => {
      const cmd = [p.config.command ?? '', ...(p.config.args ?? [])].join(' ');
      fill(r.cells[1], null, p.tag ?? '');
      fill(r.cells[2], { title: cmd }, cmd);
    },
  );
  const egressNone = h('tr', null, h('td', { colspan: 4, class: 'hint' }, 'network none: loopback only, nothing leaves the box'));
  const egressEmpty = h('tr', null, h('td', { colspan: 4, class: 'hint' }, 'no connections yet'));
  // A connection has no id: its key is what it is, and the how-many-th
  // of its like, oldest first (two to one place at one instant are two
  // rows, and a newer one does not renumber the older).
  type Conn = { e: EgressEvent; key: string };
  const connRows = keyed(
    egress,
    (c: Conn) => c.key,
    () => {
      const cells = [h('td'), h('td', { class: 'mono' }), h('td'), h('td', { class: 'mono num' })];
      return { el: h('tr', null, cells), cells };
    },
    (r, { e }) => {
      const denied = e.Decision === 'denied';
      r.el.className = denied ? 'failed' : '';
      fill(r.cells[0], { title: e.Start }, ago(e.Start));
      fill(r.cells[1], null, e.Dest);
      fill(r.cells[2], { class: denied ? 'bad' : 'ok', title: e.Reason }, e.Decision);
      fill(r.cells[3], null, `${bytes(e.BytesOut)} / ${bytes(e.BytesIn)}`);
    },
  );
  function conns(entries: EgressEvent[]): Conn[] {
    const n = new Map<string, number>();
    return entries.map((e) => {
      const k = JSON.stringify([e.Start, e.Dest, e.Decision, e.Rule]);
      const i = (n.get(k) ?? 0) + 1;
      n.set(k, i);
      return { e, key: `${k}#${i}` };
    });
  }

  // ended shows that the session is gone (destroyed, or its lifetime is
  // over): the refreshes stop, the page says so where the actions were,
  // the figures still shown are marked as the last ones (as of the last
  // refresh that found the session) and the actions that act on the
  // session are disabled. The page keeps data-ended for a watcher.
  function ended() {
    if (gone) return;
    gone = true;
    clearInterval(timer);
    err.textContent = '';
    const at = lastSeen ? ` Its last figures, as of ${lastSeen.toLocaleTimeString()}, are below.` : '';
    endedNote.textContent = `This session has ended: it was destroyed or its lifetime is over.${at}`;
    endedNote.hidden = false;
    stateBadge.textContent = 'ended';
    stateBadge.className = 'state ended';
    stateBadge.title = lastSeen ? `last seen ${lastSeen.toLocaleString()}` : 'not found';
    for (const b of [pauseBtn, resumeBtn, snapBtn, forkBtn, destroyBtn, ...previewForm.querySelectorAll('button'), ...listening.querySelectorAll('button')]) b.disabled = true;
    port.disabled = true;
    // The links to the session's live view, files, terminal and
    // playground lead nowhere now: no longer links.
    for (const a of actions.querySelectorAll('a')) {
      a.removeAttribute('href');
      a.setAttribute('aria-disabled', 'true');
    }
    for (const hd of lastHeads) hd.append(h('span', { class: 'hint last' }, ' (last figures)'));
    el.classList.add('ended');
    el.dataset.ended = lastSeen ? lastSeen.toISOString() : '';
  }

  // Refreshes overlap (the timer's and an action's): a step of one is
  // drawn only when no refresh asked later has drawn (see latest).
  const ticket = latest();
  // What a watcher (the browser test) waits on: a refresh has been drawn
  // (or found a newer one drawn and left it).
  let refreshes = 0;
  async function load() {
    await draw(ticket());
    el.dataset.refreshes = String(++refreshes);
  }

  async function draw(fresh: Ticket) {
    if (gone) return;
    let s: Session | null;
    if (foreign !== null) {
      s = await fromListing(foreign);
      if (gone || !fresh()) return;
      if (!s) ended();
      else render(s);
      return;
    }
    try {
      s = await api<Session>('GET', `/v1/sessions/${enc}`, undefined, undefined, true);
    } catch (x) {
      if (x instanceof APIError && x.status === 404) {
        // Another tenant's session, opened by the operator: read-only.
        const other = await fromListing('*');
        if (gone || !fresh()) return;
        if (other && other.tenant !== undefined && other.tenant !== '') {
          foreign = other.tenant;
          actions.hidden = true;
          liveHead.hidden = true;
          readOnly.hidden = false;
          readOnly.textContent = `Tenant ${foreign}'s session, seen by the operator: read-only. Its actions, live view, processes and egress log are its tenant's.`;
          for (const t of [procsTable, egressTable, procsHead, egressHead, previewHead, previewForm, listening, portsHint]) t.hidden = true;
          render(other);
          return;
        }
        ended();
      } else if (!(x instanceof APIError && x.status === 401) && fresh()) err.textContent = (x as Error).message;
      return;
    }
    if (gone || !fresh()) return;
    render(s);
    try {
      const pl = await api<{ processes: Proc[] | null }>('POST', '/v1/list_processes', { session: id }, undefined, true);
      if (gone || !fresh()) return;
      procRows.sync(pl.processes ?? [], !pl.processes?.length && noProcs);
    } catch {
      /* a session with no process table: nothing to list */
    }
    if (s.network !== 'host') {
      try {
        const lp = await api<{ ports: { port: number; addr: string }[] | null; truncated?: boolean }>('POST', '/v1/list_ports', { session: id }, undefined, true);
        if (gone || !fresh()) return;
        const list = lp.ports ?? [];
        ports.sync(list, lp.truncated && morePorts, !list.length && noPorts);
      } catch {
        /* a server that cannot read the box's sockets: the form below stays */
      }
    } else {
      listening.hidden = true;
      portsHint.textContent = 'network host: the session’s ports are the host’s, not proxied';
    }
    if (s.network === 'none') {
      connRows.sync([], egressNone);
      return;
    }
    try {
      const eg = await api<{ entries: EgressEvent[] | null }>('POST', '/v1/get_egress_log', { session: id, limit: 50 }, undefined, true);
      if (gone || !fresh()) return;
      const list = conns(eg.entries ?? []).reverse();
      connRows.sync(list, !list.length && egressEmpty);
    } catch {
      /* no egress log (the server runs none): the policy above says it */
    }
  }

  actions.append(
      pauseBtn,
      resumeBtn,
      snapBtn,
      forkBtn,
      h('a', { href: `#/live/${enc}`, class: 'button', id: 'session-live' }, 'Live'),
      h('a', { href: `#/files/${enc}`, class: 'button', id: 'session-files-link' }, 'Files'),
      h('a', { href: `#/term/${enc}`, class: 'button' }, 'Terminal'),
      h('a', { href: `#/play/${enc}`, class: 'button' }, 'Run code'),
      destroyBtn,
  );
  const procsHead = h('h2', null, 'Processes');
  const procsTable = h('table', { class: 'grid', id: 'session-processes' }, h('thead', null, h('tr', null, ['PID', 'Tag', 'Command', ''].map((t) => h('th', null, t)))), procs);
  const egressHead = h('h2', null, 'Network: egress log');
  const egressTable = h('table', { class: 'grid', id: 'session-egress' }, h('thead', null, h('tr', null, ['When', 'Destination', 'Decision', 'Out / in'].map((t) => h('th', null, t)))), egress);
  const previewHead = h('h2', null, 'Ports and preview URLs');
  const budgetsHead = h('h2', null, 'Budgets');
  const factsHead = h('h2', null, 'Facts');
  // The headings of what an ended session's page still shows: marked as
  // its last figures.
  const lastHeads = [budgetsHead, factsHead, procsHead, egressHead];
  const portsHint = h('p', { class: 'hint' }, 'The ports the session’s code listens on, refreshed with the page; another port by number:');
  const el = h(
    'section',
    { id: 'session-page', 'data-session': id },
    h('h1', null, 'Session ', title, ' ', stateBadge),
    actions,
    readOnly,
    endedNote,
    err,
    h('div', { class: 'split' }, h('div', null, budgetsHead, budgets), h('div', null, factsHead, facts)),
    // The live view: the agent's shell (take over, hand back) beside the timeline.
    liveHead,
    h('div', { id: 'session-timeline', class: 'mount live' }, liveShell, liveTimeline),
    h('div', { id: 'session-files', class: 'mount' }),
    procsHead,
    procsTable,
    procOut,
    egressHead,
    egressTable,
    previewHead,
    listening,
    portsHint,
    previewForm,
    previews,
  );
  load();
  timer = setInterval(load, 3000);
  return {
    el,
    close: () => {
      closed = true;
      clearInterval(timer);
      for (const stop of liveStops ?? []) stop();
    },
  };
}
