import { setOnUnauthenticated, setToken, token } from './api';
import { clear, h } from './dom';
import { Page } from './page';
import { signinPage } from './signin';
import { sessionsPage } from './sessions';
import { terminalPage } from './terminal';
import { playgroundPage } from './playground';
import { auditPage } from './audit';
import { statusPage } from './status';
import { sessionPage } from './session';
import { installLooks } from './looks';
import { operatorPage } from './operator';
import { livePage } from './timeline';
import { filesPage } from './files';

// xterm.js writes its measurements into <style> elements it creates; the
// page's CSP allows styles from 'self' and, for those, the per-response
// nonce the server put on this script tag. Nothing else creates styles.
const nonce = (document.currentScript as HTMLScriptElement | null)?.nonce ?? '';
const createElement = Document.prototype.createElement;
Document.prototype.createElement = function (this: Document, tag: string, opts?: ElementCreationOptions) {
  const el = createElement.call(this, tag, opts);
  if (nonce && tag.toLowerCase() === 'style') el.nonce = nonce;
  return el;
} as typeof Document.prototype.createElement;

const NAV: [string, string][] = [
  ['#/sessions', 'Sessions'],
  ['#/play', 'Playground'],
  ['#/audit', 'Audit log'],
  ['#/operator', 'Operator'],
  ['#/status', 'Status'],
];

let current: Page | null = null;

function route() {
  const app = document.getElementById('app')!;
  current?.close?.();
  current = null;
  clear(app);
  if (!token()) {
    current = signinPage(() => {
      if (!location.hash || location.hash === '#/') location.hash = '#/sessions';
      else route();
    });
    app.append(current.el);
    return;
  }
  const [, page, arg] = (location.hash || '#/sessions').split('/');
  const param = arg ? decodeURIComponent(arg) : undefined;
  switch (page) {
    case 'term':
      current = param ? terminalPage(param) : sessionsPage();
      break;
    case 'session':
      current = param ? sessionPage(param) : sessionsPage();
      break;
    case 'live':
      current = param ? livePage(param) : sessionsPage();
      break;
    case 'play':
      current = playgroundPage(param);
      break;
    case 'audit':
      current = auditPage();
      break;
    case 'operator':
      current = operatorPage();
      break;
    case 'status':
      current = statusPage();
      break;
    case 'files':
      // #/files/<session>/<workspace-relative path, may hold />
      current = param ? filesPage(param, location.hash.split('/').slice(3).map(decodeURIComponent).join('/')) : sessionsPage();
      break;
    default:
      current = sessionsPage();
  }
  const active = `#/${page === 'term' || page === 'session' || page === 'live' || page === 'files' ? 'sessions' : page}`;
  app.append(
    h(
      'header',
      null,
      h('a', { href: '#/sessions', class: 'brand' }, 'quro'),
      h('nav', null, NAV.map(([href, label]) => h('a', { href, class: href === active ? 'active' : '' }, label))),
      h('button', { type: 'button', id: 'theme-toggle', title: 'Light or dark (t)', 'aria-label': 'toggle dark mode' }, '◐'),
      h('button', { type: 'button', id: 'signout', onclick: signOut }, 'Sign out'),
    ),
    h('main', null, current.el),
  );
}

function signOut() {
  setToken(null);
  route();
}

setOnUnauthenticated(() => {
  setToken(null);
  route();
});
window.addEventListener('hashchange', route);
installLooks();
route();
