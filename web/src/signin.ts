import { api, setToken } from './api';
import { h } from './dom';
import { Page } from './page';

// Sign-in: the token is checked against /v1/status, then kept in this
// tab's sessionStorage. The form never submits (no token in a URL).
export function signinPage(done: () => void): Page {
  const input = h('input', { id: 'token', type: 'password', name: 'token', autocomplete: 'current-password', placeholder: 'quro_…', required: true, size: 60 });
  const err = h('p', { class: 'error', id: 'signin-error', role: 'alert' });
  const form = h(
    'form',
    { id: 'signin', class: 'card' },
    h('h1', null, 'Sign in to Quro'),
    h('p', null, 'Paste an access token. The first ', h('code', null, 'quro serve'), ' printed an admin token and kept it in ', h('code', null, '<data>/admin.token'), '; ', h('code', null, 'quro token create'), ' makes more.'),
    h('label', null, 'Token ', input),
    h('button', { type: 'submit', class: 'primary' }, 'Sign in'),
    err,
    h('p', { class: 'hint' }, 'The token is kept in this tab only (sessionStorage) and sent as a bearer header.'),
  );
  form.addEventListener('submit', async (e) => {
    e.preventDefault();
    err.textContent = '';
    const t = input.value.trim();
    try {
      await api('GET', '/v1/status', undefined, t);
    } catch (x) {
      err.textContent = `Not signed in: ${(x as Error).message}`;
      return;
    }
    input.value = '';
    setToken(t);
    done();
  });
  queueMicrotask(() => input.focus());
  return { el: form };
}
