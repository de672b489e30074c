// End-to-end test of the web UI in headless Chromium (playwright-core,
// the Debian chromium at /usr/bin/chromium). Run by cmd/quro's
// TestWebUI against a real `quro serve`; by hand:
//
//   QURO_URL=http://127.0.0.1:7070 QURO_TOKEN=$(cat data/admin.token) \
//   QURO_E2E_OUT=/tmp/shots node web/e2e/run.mjs
//
// The token comes from the environment and is typed into the sign-in
// form; the test fails if it ever shows up in a URL the browser requests.
// Every wait is on a selector or a page event, never a fixed sleep.
// Screenshots of each page go to $QURO_E2E_OUT. Exit 0 when every step
// passed; the last line of stdout is a JSON summary.
import { chromium } from 'playwright-core';
import { mkdirSync } from 'node:fs';
import { join } from 'node:path';

const base = process.env.QURO_URL;
const token = process.env.QURO_TOKEN;
const out = process.env.QURO_E2E_OUT || '.';
const executablePath = process.env.QURO_CHROMIUM || '/usr/bin/chromium';
if (!base || !token) {
  console.error('set QURO_URL and QURO_TOKEN');
  process.exit(2);
}
mkdirSync(out, { recursive: true });

const steps = [];
const problems = []; // things seen on the way that fail the run
const T = 20_000;

function check(cond, what) {
  if (!cond) throw new Error(`check failed: ${what}`);
}

const browser = await chromium.launch({
  executablePath,
  headless: true,
  args: ['--headless=new', '--no-sandbox', '--disable-gpu', '--disable-dev-shm-usage'],
});
const context = await browser.newContext({ viewport: { width: 1280, height: 800 } });
await context.grantPermissions(['clipboard-read', 'clipboard-write'], { origin: base });
const page = await context.newPage();
page.setDefaultTimeout(T);

const dialogs = [];
page.on('dialog', async (d) => {
  dialogs.push(`${d.type()}: ${d.message()}`);
  if (d.type() === 'confirm') await d.accept();
  else await d.dismiss();
});
page.on('pageerror', (e) => problems.push(`page error: ${e.message}`));
page.on('console', (m) => {
  // The artifact frame's own refusals (its fetch, below) are expected;
  // any on the UI's pages is a bug. The artifact's document was written
  // by frame.js, so its messages come without a URL.
  const at = m.location()?.url ?? '';
  if (at === '' || at.endsWith('/frame.html')) return;
  if (m.type() === 'error' && /Content Security Policy|Refused to/i.test(m.text())) problems.push(`CSP: ${m.text()}`);
});
page.on('request', (r) => {
  if (r.url().includes(token)) problems.push(`the token appeared in a URL: ${r.url().replace(token, '<token>')}`);
});

async function step(name, fn) {
  const t0 = Date.now();
  try {
    await fn();
    steps.push({ name, ok: true, ms: Date.now() - t0 });
    console.error(`ok   ${name} (${Date.now() - t0} ms)`);
  } catch (e) {
    steps.push({ name, ok: false, error: String(e?.message ?? e) });
    console.error(`FAIL ${name}: ${e?.stack ?? e}`);
    await page.screenshot({ path: join(out, `failed-${name.replace(/\W+/g, '-')}.png`) }).catch(() => {});
    throw e;
  }
}

async function shot(name) {
  await page.screenshot({ path: join(out, `${name}.png`), fullPage: true });
}

// screen is the text of the terminal's visible rows as xterm.js draws them.
async function screen() {
  return page.$eval('#terminal .xterm-rows', (el) => Array.from(el.children, (r) => r.textContent.replace(/\u00a0/g, ' ').trimEnd()));
}

async function waitScreen(pred, what) {
  const t0 = Date.now();
  let last = [];
  for (;;) {
    last = await screen();
    if (pred(last)) return last;
    if (Date.now() - t0 > T) throw new Error(`terminal never showed ${what}; screen:\n${last.filter(Boolean).join('\n')}`);
    await page.waitForFunction(
      (prev) => {
        const el = document.querySelector('#terminal .xterm-rows');
        return el && el.textContent !== prev;
      },
      last.join(''),
      { timeout: T, polling: 'mutation' },
    ).catch(() => {});
  }
}

const count = (lines, s) => lines.filter((l) => l === s).length;

let failed = null;
try {
  await step('security headers', async () => {
    const resp = await page.goto(base + '/');
    const csp = resp.headers()['content-security-policy'] ?? '';
    check(/script-src 'self'(;|$)/.test(csp), `script-src 'self' only in ${csp}`);
    check(csp.includes("frame-ancestors 'none'"), 'frame-ancestors none');
    check(resp.headers()['x-content-type-options'] === 'nosniff', 'nosniff');
    const inline = await page.$$eval('script:not([src])', (s) => s.length);
    check(inline === 0, 'no inline scripts');
  });

  await step('sign in', async () => {
    await page.waitForSelector('#signin');
    await page.fill('#token', 'quro_wrong_token');
    await page.click('#signin button[type=submit]');
    await page.waitForFunction(() => document.querySelector('#signin-error')?.textContent.includes('Not signed in'));
    await page.fill('#token', token);
    await shot('1-signin');
    await page.click('#signin button[type=submit]');
    await page.waitForSelector('#sessions tr[data-session="default"]');
    check(!page.url().includes('token'), 'no token in the URL');
    const stored = await page.evaluate(() => sessionStorage.getItem('quro.token'));
    check(stored === token, 'token kept in sessionStorage');
  });

  await step('create a session', async () => {
    await page.fill('#create-session input[name=name]', 'e2e');
    await page.click('#create-session button[type=submit]');
    await page.waitForSelector('#sessions tr[data-session="e2e"]');
    await shot('2-sessions');
  });

  await step('terminal: cd /tmp && pwd', async () => {
    await page.click('#sessions tr[data-session="e2e"] a.button:text("Terminal")');
    await page.waitForFunction(() => document.querySelector('#term-state')?.textContent === 'connected');
    await page.click('#terminal');
    await page.keyboard.type('cd /tmp && pwd');
    await page.keyboard.press('Enter');
    await waitScreen((l) => l.some((x) => x.endsWith('cd /tmp && pwd')) && count(l, '/tmp') >= 1, '"/tmp" after the command');
  });

  await step('terminal: HTML in output stays text', async () => {
    await page.keyboard.type("printf '<img src=x onerror=alert(3)>\\n'");
    await page.keyboard.press('Enter');
    await waitScreen((l) => count(l, '<img src=x onerror=alert(3)>') === 1, 'the tag as text');
    const imgs = await page.$$eval('#terminal img', (x) => x.length);
    check(imgs === 0, 'no <img> in the terminal');
    await shot('3-terminal');
  });

  await step('reload reconnects to the same terminal with its scrollback', async () => {
    const url = page.url();
    await page.reload();
    await page.waitForFunction(() => document.querySelector('#term-state')?.textContent === 'connected');
    check(page.url() === url, 'same page');
    // the scrollback repaints what was there...
    await waitScreen((l) => l.some((x) => x.endsWith('cd /tmp && pwd')) && count(l, '/tmp') >= 1, 'the scrollback');
    // ...and it is the same shell: its cwd is still /tmp
    const before = count(await screen(), '/tmp');
    await page.click('#terminal');
    await page.keyboard.type('pwd');
    await page.keyboard.press('Enter');
    await waitScreen((l) => count(l, '/tmp') === before + 1, 'a second "/tmp" from the same shell');
    await shot('4-terminal-reconnected');
  });

  await step('playground: print and an HTML artifact', async () => {
    await page.click('header a:text("Playground")');
    await page.waitForSelector('#play-session option:text("e2e")', { state: 'attached' });
    await page.selectOption('#play-session', { label: 'e2e' });
    await page.selectOption('#play-lang', 'python');
    await page.fill(
      '#play-code',
      [
        'print("hello-from-e2e", 6 * 7)',
        '',
        'class Page:',
        '    def _repr_html_(self):',
        '        return """<h1 id="art">Artifact 42</h1><p id="probe">waiting</p>',
        '<script>',
        'let escaped = "isolated";',
        'try { parent.document.title; escaped = "ESCAPED"; } catch (e) {}',
        'fetch("/v1/status").then(() => "fetched", () => "offline").then((n) => {',
        '  document.getElementById("probe").textContent = escaped + " " + n;',
        '});',
        '</script>"""',
        '',
        'class Chart:',
        '    def _repr_svg_(self):',
        '        bars = "".join(f\'<rect x="{10 + i * 40}" y="{110 - v}" width="30" height="{v}" fill="teal"/>\' for i, v in enumerate([30, 80, 55, 100]))',
        '        return f\'<svg xmlns="http://www.w3.org/2000/svg" width="180" height="120">{bars}</svg>\'',
        '',
        'display(Page(), Chart())',
      ].join('\n'),
    );
    await page.click('#play-run');
    await page.waitForFunction(() => /exit 0/.test(document.querySelector('#play-summary')?.textContent ?? ''));
    const text = await page.textContent('#play-output');
    check(text.includes('hello-from-e2e 42'), `printed output, got ${JSON.stringify(text)}`);
    const frame = page.locator('#play-artifacts iframe.artifact-frame');
    check((await frame.getAttribute('sandbox')) === 'allow-scripts', 'sandbox="allow-scripts" only');
    const inner = page.frameLocator('#play-artifacts iframe.artifact-frame');
    await inner.locator('#art').waitFor();
    check((await inner.locator('#art').textContent()) === 'Artifact 42', 'the artifact rendered');
    // its script ran, could not reach the page, and had no network
    await inner.locator('#probe:text("isolated offline")').waitFor();
    await page.waitForSelector('#play-artifacts .artifact-svg img');
    await shot('5-playground');
  });

  await step('playground: an XSS attempt in program output stays text', async () => {
    await page.fill('#play-code', "print('<img src=x onerror=alert(1)>')\nprint('<script>alert(2)</script>')");
    await page.click('#play-run');
    await page.waitForFunction(() => /exit 0/.test(document.querySelector('#play-summary')?.textContent ?? ''));
    const text = await page.textContent('#play-output');
    check(text.includes('<img src=x onerror=alert(1)>') && text.includes('<script>alert(2)</script>'), 'the tags shown as text');
    const els = await page.$$eval('#play-output img, #play-output script', (x) => x.length);
    check(els === 0, 'no element made from the output');
    check(dialogs.length === 0, `no dialog fired (${dialogs.join('; ')})`);
    await shot('6-playground-xss');
  });

  await step('audit log with a filter', async () => {
    await page.click('header a:text("Audit log")');
    await page.waitForSelector('#audit-capability option[value="run_code"]', { state: 'attached' });
    await page.selectOption('#audit-capability', 'run_code');
    await page.waitForFunction(() => {
      const rows = Array.from(document.querySelectorAll('#audit tbody tr'));
      return rows.length >= 2 && rows.every((r) => r.children[4].textContent === 'run_code');
    });
    await page.selectOption('#audit-capability', '');
    await page.waitForFunction(() => Array.from(document.querySelectorAll('#audit tbody tr td:nth-child(5)')).some((td) => td.textContent === 'create_session'));
    await shot('7-audit');
  });

  await step('service status', async () => {
    await page.click('header a:text("Status")');
    await page.waitForSelector('#engines tbody tr');
    await page.waitForSelector('#isolation tbody tr');
    await shot('8-status');
  });

  await step('nothing went wrong on the way', async () => {
    check(dialogs.length === 0, `no dialogs: ${dialogs.join('; ')}`);
    check(problems.length === 0, problems.join('\n'));
  });
} catch (e) {
  failed = e;
}
await browser.close();
console.log(JSON.stringify({ ok: !failed, steps, problems, dialogs }));
process.exit(failed ? 1 : 0);
