import { Artifact } from './api';
import { h } from './dom';

// renderArtifact shows one run_code artifact:
//   html  in an iframe of /frame.html, sandbox="allow-scripts" without
//         allow-same-origin (an opaque origin) and under frame.html's own
//         strict CSP (no network); the page posts the HTML to it.
//   svg   as an <img> (an SVG image runs no script), png and jpeg as an
//         <img> of a data: URL of their base64 (other characters dropped),
//   json  as a collapsible tree, anything else (markdown, latex, text) as
//         text.
export function renderArtifact(a: Artifact): HTMLElement {
  const save = h('button', { type: 'button', class: 'artifact-download', title: 'download', 'aria-label': `download ${a.name}` }, '⤓');
  save.addEventListener('click', () => downloadArtifact(a));
  const head = h('div', { class: 'artifact-head' }, h('span', { class: 'badge' }, a.kind), ' ', h('span', { class: 'mono' }, a.name), ' ', save);
  let body: HTMLElement;
  switch (a.kind) {
    case 'html':
      body = htmlFrame(a.data);
      break;
    case 'svg':
      body = h('img', { class: 'artifact-img', alt: a.name, src: `data:image/svg+xml;charset=utf-8,${encodeURIComponent(a.data)}` });
      break;
    case 'png':
    case 'jpeg':
      body = h('img', { class: 'artifact-img', alt: a.name, src: `data:image/${a.kind};base64,${a.data.replace(/[^A-Za-z0-9+/=]/g, '')}` });
      break;
    case 'json':
      try {
        body = h('div', { class: 'json-tree mono' }, jsonTree(JSON.parse(a.data), null, 0));
      } catch {
        body = h('pre', null, a.data);
      }
      break;
    default:
      body = h('pre', null, a.data);
  }
  return h('div', { class: `artifact artifact-${a.kind}`, 'data-kind': a.kind }, head, body);
}

export function htmlFrame(html: string): HTMLIFrameElement {
  const frame = h('iframe', {
    class: 'artifact-frame',
    src: '/frame.html',
    sandbox: 'allow-scripts',
    referrerpolicy: 'no-referrer',
    title: 'HTML artifact (sandboxed)',
  });
  const onMessage = (e: MessageEvent) => {
    if (e.source !== frame.contentWindow || (e.data as { type?: string } | null)?.type !== 'quro-frame-ready') return;
    window.removeEventListener('message', onMessage);
    frame.contentWindow?.postMessage({ html }, '*'); // an opaque origin has no name but '*'
  };
  window.addEventListener('message', onMessage);
  return frame;
}

function jsonTree(v: unknown, key: string | null, depth: number): HTMLElement {
  const label = key === null ? null : h('span', { class: 'json-key' }, `${key}: `);
  if (v !== null && typeof v === 'object') {
    const arr = Array.isArray(v);
    const entries = arr ? (v as unknown[]).map((x, i) => [String(i), x] as const) : Object.entries(v as object);
    const sum = h('summary', null, label, arr ? `[${entries.length}]` : `{${entries.length}}`);
    const d = h('details', { open: depth < 2 }, sum);
    for (const [k, x] of entries) d.append(h('div', { class: 'json-child' }, jsonTree(x, k, depth + 1)));
    return d;
  }
  const cls = v === null ? 'null' : typeof v;
  return h('div', { class: 'json-leaf' }, label, h('span', { class: `json-${cls}` }, JSON.stringify(v)));
}

const EXT: Record<string, string> = { html: 'html', svg: 'svg', png: 'png', jpeg: 'jpg', json: 'json', markdown: 'md', latex: 'tex' };

// downloadArtifact saves an artifact as a file: png and jpeg as their
// bytes, the others as their text.
export function downloadArtifact(a: Artifact): void {
  let blob: Blob;
  if (a.kind === 'png' || a.kind === 'jpeg') {
    const bin = atob(a.data.replace(/[^A-Za-z0-9+/=]/g, ''));
    const bytes = new Uint8Array(bin.length);
    for (let i = 0; i < bin.length; i++) bytes[i] = bin.charCodeAt(i);
    blob = new Blob([bytes], { type: a.mime || `image/${a.kind}` });
  } else {
    blob = new Blob([a.data], { type: 'application/octet-stream' });
  }
  const ext = EXT[a.kind] ?? 'txt';
  const name = (a.name || 'artifact').replace(/[^\w.-]+/g, '_');
  const url = URL.createObjectURL(blob);
  const link = h('a', { href: url, download: name.includes('.') ? name : `${name}.${ext}`, hidden: true });
  document.body.append(link);
  link.click();
  link.remove();
  setTimeout(() => URL.revokeObjectURL(url), 60_000);
}
