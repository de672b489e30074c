// The artifact frame. frame.html is served with its own Content-Security-
// Policy (sandbox allow-scripts: an opaque origin, no access to the page,
// its storage or the API; no network: default-src 'none'). The page that
// embeds it posts one HTML artifact; the frame replaces its own document
// with it, so the artifact's inline scripts and styles run here, confined.
let done = false;
window.addEventListener('message', (e: MessageEvent) => {
  if (done || e.source !== window.parent) return;
  const html = (e.data as { html?: unknown } | null)?.html;
  if (typeof html !== 'string') return;
  done = true;
  document.open();
  document.write(html);
  document.close();
});
window.parent.postMessage({ type: 'quro-frame-ready' }, '*');
