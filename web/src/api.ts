// The REST and WebSocket client. The token lives in sessionStorage (this
// tab only, gone when it closes), travels as "Authorization: Bearer" on
// REST calls and as the quro.bearer.<token> subprotocol on WebSockets
// (browsers cannot set headers there) — never in a URL, never logged.

const KEY = 'quro.token';

export function token(): string | null {
  return sessionStorage.getItem(KEY);
}

export function setToken(t: string | null): void {
  if (t) sessionStorage.setItem(KEY, t);
  else sessionStorage.removeItem(KEY);
}

export class APIError extends Error {
  constructor(public status: number, public code: string, message: string) {
    super(message);
  }
}

// onUnauthenticated is called when the server refuses the token.
export let onUnauthenticated: () => void = () => {};
export function setOnUnauthenticated(f: () => void): void {
  onUnauthenticated = f;
}

// background marks a refresh the page makes by itself (not a person's
// action): the server audits it marked as such, and the audit view hides
// those by default.
export async function api<T = unknown>(method: string, path: string, body?: unknown, tok = token(), background = false): Promise<T> {
  const headers: Record<string, string> = { Accept: 'application/json' };
  if (tok) headers.Authorization = `Bearer ${tok}`;
  if (background) headers['Quro-Background'] = '1';
  if (body !== undefined) headers['Content-Type'] = 'application/json';
  const r = await fetch(path, {
    method,
    headers,
    body: body === undefined ? undefined : JSON.stringify(body),
    credentials: 'omit',
    cache: 'no-store',
  });
  const text = await r.text();
  let data: unknown = null;
  try {
    data = text ? JSON.parse(text) : null;
  } catch {
    /* not JSON: keep the text for the error */
  }
  if (!r.ok) {
    const e = (data as { error?: { code?: string; message?: string } } | null)?.error;
    // A refused stored token signs the tab out; a token being tried does not.
    if (r.status === 401 && tok !== null && tok === token()) onUnauthenticated();
    throw new APIError(r.status, e?.code ?? String(r.status), e?.message ?? (text || r.statusText));
  }
  return data as T;
}

export function wsURL(path: string): string {
  const u = new URL(path, location.href);
  u.protocol = u.protocol === 'https:' ? 'wss:' : 'ws:';
  return u.toString();
}

export function openSocket(path: string): WebSocket {
  const ws = new WebSocket(wsURL(path), ['quro.v1', `quro.bearer.${token() ?? ''}`]);
  ws.binaryType = 'arraybuffer';
  return ws;
}


export interface Artifact {
  kind: string;
  mime: string;
  name: string;
  data: string;
}

export interface RunResult {
  session: string;
  lang: string;
  engine: string;
  exit_code: number;
  stdout: string;
  stderr: string;
  error: string;
  timed_out: boolean;
  interrupted: boolean;
  truncated: boolean;
  duration_ms: number;
  artifacts: Artifact[] | null;
  stdout_file?: string;
  stderr_file?: string;
  notes?: string[];
}

// The API's types, generated from the server's OpenAPI document
// (web/src/api-types.ts; make web-types): the server is their source of
// truth, and make web-check fails when they drift.
import type { components } from './api-types';
export type Schemas = components['schemas'];
export type Session = Schemas['get_session_status.output'];
export type AuditEntry = Schemas['get_audit_log.output']['entries'][number];
export type Status = Schemas['get_service_status.output'];

// fetchRaw is a REST call whose body is bytes both ways (the file
// transfers: upload and download, streamed by the server); errors are
// APIErrors as api()'s.
export async function fetchRaw(method: string, path: string, body?: BodyInit): Promise<Response> {
  const headers: Record<string, string> = {};
  const tok = token();
  if (tok) headers.Authorization = `Bearer ${tok}`;
  if (body !== undefined) headers['Content-Type'] = 'application/octet-stream';
  const r = await fetch(path, { method, headers, body, credentials: 'omit', cache: 'no-store' });
  if (!r.ok) {
    const text = await r.text();
    let e: { code?: string; message?: string } | undefined;
    try {
      e = (JSON.parse(text) as { error?: { code?: string; message?: string } }).error;
    } catch {
      /* not JSON */
    }
    if (r.status === 401 && tok !== null) onUnauthenticated();
    throw new APIError(r.status, e?.code ?? String(r.status), e?.message ?? (text || r.statusText));
  }
  return r;
}

export interface FileEntry {
  name: string;
  path: string;
  type: string;
  size: number;
  mode: string;
  mtime: string;
  target?: string;
  target_type?: string;
}

export interface FileContent {
  path: string;
  encoding: string;
  content: string;
  size: number;
  complete: boolean;
  media_type?: string;
}
