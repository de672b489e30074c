package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/browser"
	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/input"
	cdplog "github.com/chromedp/cdproto/log"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/cdproto/runtime"
	cdptarget "github.com/chromedp/cdproto/target"
	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/kb"
)

// chromium is the browser the UI's end-to-end test drives (Debian's
// chromium package; make test installs it).
const chromium = "/usr/bin/chromium"

// startWebTest is a browser test's start: it skips the test where there
// is no chromium, makes the folder for its screenshots ($QURO_E2E_OUT, or
// a temporary one) and starts a real quro serve.
func startWebTest(t *testing.T) (*server, string) {
	t.Helper()
	if _, err := os.Stat(chromium); err != nil {
		t.Skip("\n\n*** SKIPPED: the web UI's browser tests need " + chromium + " (apt-get install chromium).\n" +
			"*** make test installs it; without it the UI is not tested in a browser. ***\n\n")
	}
	out := os.Getenv("QURO_E2E_OUT")
	if out == "" {
		out = t.TempDir()
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		t.Fatal(err)
	}
	return startServer(t), out
}

// TestWebUI drives the web UI in headless Chromium (over the DevTools
// protocol, with chromedp: no node needed) against a real quro serve:
// sign in, create a session, type in its terminal and read the screen,
// reload and find the same terminal with its scrollback, run Python that
// prints and displays an HTML artifact in the sandboxed frame, an XSS
// attempt in program output that stays text, the audit log and the status
// page. The token is typed into the sign-in form; the test fails if it
// ever shows up in a URL the browser requests. Every wait is on the DOM
// (a mutation observer or a page event), never a fixed sleep; the time
// limits only bound a step that will never finish. Screenshots go to
// $QURO_E2E_OUT (docs/ui/ holds the ones docs/ui.md shows), and are taken
// only when it is set; a failed step's screenshot is always taken (into a
// temporary folder by default).
func TestWebUI(t *testing.T) {
	t.Parallel()
	srv, out := startWebTest(t)
	base, token := srv.url, srv.token
	e := newE2E(t, out)

	var (
		mu       sync.Mutex
		problems []string // things seen on the way that fail the run
		dialogs  []string
	)
	problem := func(format string, a ...any) {
		mu.Lock()
		problems = append(problems, fmt.Sprintf(format, a...))
		mu.Unlock()
	}
	// The page's last WebSocket frames (the terminal's, a run's), logged
	// when a step fails: whether the server sent the terminal's scrollback
	// and what it held, the resizes, and their order, as the page saw them.
	var (
		frames  []string
		resizes [][2]int // the sizes the page sent the terminal, in order
	)
	frame := func(dir string, ts cdp.MonotonicTime, r *network.WebSocketFrame) {
		p := string(r.PayloadData) // base64 for a binary frame
		if len(p) > 400 {
			p = p[:200] + "…" + p[len(p)-200:]
		}
		var m struct {
			Type       string
			Cols, Rows int
		}
		mu.Lock()
		if dir == "sent" && json.Unmarshal(r.PayloadData, &m) == nil && m.Type == "resize" {
			resizes = append(resizes, [2]int{m.Cols, m.Rows})
		}
		frames = append(frames, fmt.Sprintf("%.3f %s opcode %v, %d bytes: %q", float64(ts), dir, r.Opcode, len(r.PayloadData), p))
		if len(frames) > 100 {
			frames = frames[1:]
		}
		mu.Unlock()
	}
	e.diag = func() string {
		mu.Lock()
		defer mu.Unlock()
		return "the page's WebSocket frames:\n" + strings.Join(frames, "\n")
	}
	csp := regexp.MustCompile(`(?i)Content Security Policy|Refused to`)
	// uiConsole reports a CSP refusal on the UI's own pages. The artifact
	// frame's refusals (its fetch, below) are expected; its document is
	// written by frame.js, so its messages come without a URL.
	uiConsole := func(level, url, text string) {
		if url == "" || strings.HasSuffix(url, "/frame.html") {
			return
		}
		if level == "error" && csp.MatchString(text) {
			problem("CSP: %s", text)
		}
	}
	err := chromedp.Listen(e.ctx, func(ev any) {
		switch ev := ev.(type) {
		case *page.EventJavascriptDialogOpening:
			mu.Lock()
			dialogs = append(dialogs, fmt.Sprintf("%s: %s", ev.Type, ev.Message))
			mu.Unlock()
			// a listener must not call the browser itself
			go chromedp.Call(e.ctx, page.HandleJavaScriptDialog, page.HandleJavaScriptDialogParams{Accept: ev.Type == page.DialogTypeConfirm})
		case *runtime.EventExceptionThrown:
			d := ev.ExceptionDetails
			msg := d.Text
			if d.Exception != nil && d.Exception.Description != "" {
				msg = d.Exception.Description
			}
			problem("page error: %s", msg)
		case *runtime.EventConsoleAPICalled:
			url := ""
			if ev.StackTrace != nil && len(ev.StackTrace.CallFrames) > 0 {
				url = ev.StackTrace.CallFrames[0].URL
			}
			var text []string
			for _, a := range ev.Args {
				if a.Value != nil {
					var s string
					if json.Unmarshal(a.Value, &s) == nil {
						text = append(text, s)
						continue
					}
					text = append(text, string(a.Value))
				} else {
					text = append(text, a.Description)
				}
			}
			uiConsole(string(ev.Type), url, strings.Join(text, " "))
		case *cdplog.EventEntryAdded:
			uiConsole(string(ev.Entry.Level), ev.Entry.URL, ev.Entry.Text)
		case *network.EventRequestWillBeSent:
			if strings.Contains(ev.Request.URL, token) {
				problem("the token appeared in a URL: %s", strings.ReplaceAll(ev.Request.URL, token, "<token>"))
			}
		case *network.EventWebSocketFrameReceived:
			frame("received", ev.Timestamp, ev.Response)
		case *network.EventWebSocketFrameSent:
			frame("sent", ev.Timestamp, ev.Response)
		case *network.EventWebSocketCreated:
			if strings.Contains(ev.URL, token) {
				problem("the token appeared in a WebSocket URL: %s", strings.ReplaceAll(ev.URL, token, "<token>"))
			}
		}
	})
	if err != nil {
		t.Fatalf("start %s: %v", chromium, err)
	}
	seenDialogs := func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), dialogs...)
	}
	origin := strings.TrimSuffix(base, "/")
	for _, name := range []string{"clipboard-read", "clipboard-write"} {
		if _, err := chromedp.CallBrowser(e.ctx, browser.SetPermission, browser.SetPermissionParams{
			Permission: &browser.PermissionDescriptor{Name: name}, Setting: browser.PermissionSettingGranted, Origin: origin,
			BrowserContextID: e.bcid,
		}); err != nil {
			t.Fatalf("grant %s: %v", name, err)
		}
	}
	e.do("set the viewport", chromedp.EmulateViewport(1280, 800))

	e.step("security headers", func() {
		resp := run(e, "open /", chromedp.NavigateResponse(base+"/"))
		hdr := func(name string) string {
			for k, v := range resp.Headers {
				if strings.EqualFold(k, name) {
					s, _ := v.(string)
					return s
				}
			}
			return ""
		}
		policy := hdr("Content-Security-Policy")
		e.check(regexp.MustCompile(`script-src 'self'(;|$)`).MatchString(policy), "script-src 'self' only in %s", policy)
		e.check(strings.Contains(policy, "frame-ancestors 'none'"), "frame-ancestors none")
		e.check(hdr("X-Content-Type-Options") == "nosniff", "nosniff")
		inline := eval[int](e, `document.querySelectorAll('script:not([src])').length`)
		e.check(inline == 0, "no inline scripts")
	})

	e.step("sign in", func() {
		e.waitSel("#signin")
		e.fill("#token", "quro_wrong_token")
		e.click(chromedp.CSS("#signin button[type=submit]"))
		e.waitJS(`document.querySelector('#signin-error')?.textContent.includes('Not signed in')`)
		e.fill("#token", token)
		e.shot("1-signin")
		e.click(chromedp.CSS("#signin button[type=submit]"))
		e.waitSel(`#sessions tr[data-session="default"]`)
		e.check(!strings.Contains(e.url(), "token"), "no token in the URL")
		stored := eval[string](e, `sessionStorage.getItem('quro.token')`)
		e.check(stored == token, "token kept in sessionStorage")
	})

	e.step("create a session", func() {
		e.fill("#create-session input[name=name]", "e2e")
		e.click(chromedp.CSS("#create-session button[type=submit]"))
		e.waitSel(`#sessions tr[data-session="e2e"]`)
		e.shot("2-sessions")
	})

	e.step("a row's button keeps working across the list's refresh", func() {
		// The button as a click finds it, and then a refresh of the list
		// (the page counts them on #sessions): a table rebuilt on refresh
		// has replaced the node, and the click on it is lost ("Could not
		// find node with given id"); rows updated in place keep it.
		nodes := run(e, "find e2e's Make default", chromedp.Nodes(chromedp.Search(`//tr[@data-session="e2e"]//button[text()="Make default"]`)))
		refreshes := eval[int](e, `Number(document.querySelector('#sessions').dataset.refreshes ?? 0)`)
		e.waitJS(fmt.Sprintf(`Number(document.querySelector('#sessions').dataset.refreshes ?? 0) > %d`, refreshes))
		e.do("click e2e's Make default after a refresh", chromedp.MouseClickNode(nodes[0]))
		e.waitJS(`document.querySelector('#sessions tr[data-session="e2e"] .badge')?.textContent === 'default' &&
			document.querySelector('#sessions tr[data-session="default"] .badge') === null`)
		// and back, as the steps below expect
		e.click(chromedp.Search(`//tr[@data-session="default"]//button[text()="Make default"]`))
		e.waitJS(`document.querySelector('#sessions tr[data-session="default"] .badge')?.textContent === 'default' &&
			document.querySelector('#sessions tr[data-session="e2e"] .badge') === null`)
	})

	count := func(lines []string, s string) int {
		n := 0
		for _, l := range lines {
			if l == s {
				n++
			}
		}
		return n
	}
	ranCd := func(l []string) bool {
		for _, x := range l {
			if strings.HasSuffix(x, "cd /tmp && pwd") {
				return count(l, "/tmp") >= 1
			}
		}
		return false
	}

	e.step("terminal: cd /tmp && pwd", func() {
		e.click(chromedp.Search(`//tr[@data-session="e2e"]//a[contains(concat(" ", @class, " "), " button ") and text()="Terminal"]`))
		e.waitJS(`document.querySelector('#term-state')?.textContent === 'connected'`)
		// type once the shell is listening (keys typed before its prompt
		// are echoed by the terminal, then again by the shell)
		e.waitScreen(func(l []string) bool {
			for _, x := range l {
				if strings.HasSuffix(x, "$") {
					return true
				}
			}
			return false
		}, "the shell's prompt")
		e.click(chromedp.CSS("#terminal"))
		e.typeKeys("cd /tmp && pwd")
		e.press("\r")
		e.waitScreen(ranCd, `"/tmp" after the command`)
	})

	e.step("terminal: HTML in output stays text", func() {
		e.typeKeys(`printf '<img src=x onerror=alert(3)>\n'`)
		e.press("\r")
		e.waitScreen(func(l []string) bool { return count(l, "<img src=x onerror=alert(3)>") == 1 }, "the tag as text")
		imgs := eval[int](e, `document.querySelectorAll('#terminal img').length`)
		e.check(imgs == 0, "no <img> in the terminal")
		e.shot("3-terminal")
	})

	e.step("a moment's tiny layout leaves the shell's size alone", func() {
		// A screenshot beyond the viewport, under load, made the
		// terminal's box 12 px wide for a moment: the page fitted the
		// terminal to 2 columns and told the shell, and readline, redrawing
		// its prompt for 2 columns and then for the width again, cleared
		// the lines above it (in the scrollback too: a reload showed only
		// the prompt). Here the box is 12 px wide, then as it was; each
		// change is waited for with a ResizeObserver made after the page's,
		// which the browser calls after the page's in the same frame.
		mu.Lock()
		n := len(resizes)
		mu.Unlock()
		for _, width := range []string{"12px", ""} {
			run(e, "set the terminal's width to "+width, chromedp.Evaluate[bool](fmt.Sprintf(`new Promise((done) => {
				const box = document.querySelector('#terminal');
				box.style.width = %q;
				const ro = new ResizeObserver(() => { ro.disconnect(); done(true); });
				ro.observe(box);
			})`, width), chromedp.EvalAwaitPromise))
		}
		mu.Lock()
		sent := append([][2]int(nil), resizes[n:]...)
		mu.Unlock()
		for _, r := range sent {
			e.check(r[0] >= 20 && r[1] >= 5, "the page sent the shell a %dx%d terminal (sent: %v)", r[0], r[1], sent)
		}
		e.waitScreen(ranCd, "the output above the prompt")
	})

	e.step("reload reconnects to the same terminal with its scrollback", func() {
		url := e.url()
		e.do("reload", chromedp.Reload())
		e.waitJS(`document.querySelector('#term-state')?.textContent === 'connected'`)
		e.check(e.url() == url, "same page")
		// the scrollback repaints what was there...
		e.waitScreen(ranCd, "the scrollback")
		// ...and it is the same shell: its cwd is still /tmp
		before := count(e.screen(), "/tmp")
		e.click(chromedp.CSS("#terminal"))
		e.typeKeys("pwd")
		e.press("\r")
		e.waitScreen(func(l []string) bool { return count(l, "/tmp") == before+1 }, `a second "/tmp" from the same shell`)
		e.shot("4-terminal-reconnected")
	})

	e.step("playground: print and an HTML artifact", func() {
		e.click(chromedp.Search(`//header//a[text()="Playground"]`))
		e.waitJS(`Array.from(document.querySelectorAll('#play-session option')).some((o) => o.textContent === 'e2e')`)
		e.selectOption("#play-session", "label", "e2e")
		e.selectOption("#play-lang", "value", "python")
		e.fillEditor("#play-code", strings.Join([]string{
			`print("hello-from-e2e", 6 * 7)`,
			``,
			`class Page:`,
			`    def _repr_html_(self):`,
			`        return """<h1 id="art">Artifact 42</h1><p id="probe">waiting</p>`,
			`<script>`,
			`let escaped = "isolated";`,
			`try { parent.document.title; escaped = "ESCAPED"; } catch (e) {}`,
			`fetch("/v1/status").then(() => "fetched", () => "offline").then((n) => {`,
			`  document.getElementById("probe").textContent = escaped + " " + n;`,
			`});`,
			`</script>"""`,
			``,
			`class Chart:`,
			`    def _repr_svg_(self):`,
			`        bars = "".join(f'<rect x="{10 + i * 40}" y="{110 - v}" width="30" height="{v}" fill="teal"/>' for i, v in enumerate([30, 80, 55, 100]))`,
			`        return f'<svg xmlns="http://www.w3.org/2000/svg" width="180" height="120">{bars}</svg>'`,
			``,
			``,
			`class Notes:`,
			`    def _repr_markdown_(self): return "# *notes* <b>as text</b>"`,
			``,
			`import base64`,
			`jpeg = base64.b64decode("` + jpeg8x6 + `")`,
			`display(Page(), Chart(), Notes())`,
			`display(jpeg, mime="image/jpeg")`,
		}, "\n"))
		e.click(chromedp.CSS("#play-run"))
		e.waitJS(`/exit 0/.test(document.querySelector('#play-summary')?.textContent ?? '') &&
			(document.querySelector('#play-output')?.textContent ?? '').includes('hello-from-e2e')`)
		text := eval[string](e, `document.querySelector('#play-output').textContent`)
		e.check(strings.Contains(text, "hello-from-e2e 42"), "printed output, got %q", text)
		sandbox := eval[string](e, `document.querySelector('#play-artifacts iframe.artifact-frame')?.getAttribute('sandbox') ?? '(no frame)'`)
		e.check(sandbox == "allow-scripts", `sandbox="allow-scripts" only, got %q`, sandbox)
		// Inside the frame: its own process (a sandboxed frame has an
		// opaque origin) or the page's; the test reads it either way.
		e.waitFrameText("#art", "Artifact 42")
		// its script ran, could not reach the page, and had no network
		e.waitFrameText("#probe", "isolated offline")
		e.waitSel("#play-artifacts .artifact-svg img")
		// a JPEG (PIL's, 8×6) decodes as an image; markdown stays text
		e.waitJS(`document.querySelector('#play-artifacts .artifact-jpeg img')?.naturalWidth === 8`)
		md := eval[string](e, `document.querySelector('#play-artifacts .artifact-markdown pre')?.textContent ?? '(none)'`)
		e.check(md == "# *notes* <b>as text</b>", "markdown shown as text, got %q", md)
		e.check(eval[int](e, `document.querySelectorAll('#play-artifacts .artifact-markdown b').length`) == 0, "no element made from markdown")
		e.shot("5-playground")
	})

	e.step("playground: an XSS attempt in program output stays text", func() {
		e.fillEditor("#play-code", "print('<img src=x onerror=alert(1)>')\nprint('<script>alert(2)</script>')")
		// the click starts the run, which says "running…" at once
		e.click(chromedp.CSS("#play-run"))
		// The summary may still say the last run's "exit 0" for a moment
		// after the output was cleared: wait for this run's last line too.
		e.waitJS(`/exit 0/.test(document.querySelector('#play-summary')?.textContent ?? '') &&
			(document.querySelector('#play-output')?.textContent ?? '').includes('alert(2)')`)
		text := eval[string](e, `document.querySelector('#play-output').textContent`)
		e.check(strings.Contains(text, "<img src=x onerror=alert(1)>") && strings.Contains(text, "<script>alert(2)</script>"), "the tags shown as text, got %q", text)
		els := eval[int](e, `document.querySelectorAll('#play-output img, #play-output script').length`)
		e.check(els == 0, "no element made from the output")
		d := seenDialogs()
		e.check(len(d) == 0, "no dialog fired (%s)", strings.Join(d, "; "))
		e.shot("6-playground-xss")
	})

	e.step("audit log with a filter", func() {
		e.click(chromedp.Search(`//header//a[text()="Audit log"]`))
		e.waitJS(`document.querySelector('#audit-capability option[value="run_code"]') !== null`)
		e.selectOption("#audit-capability", "value", "run_code")
		e.waitJS(`(() => {
			const rows = Array.from(document.querySelectorAll('#audit tbody tr'));
			return rows.length >= 2 && rows.every((r) => r.children[4].textContent === 'run_code');
		})()`)
		e.selectOption("#audit-capability", "value", "")
		e.waitJS(`Array.from(document.querySelectorAll('#audit tbody tr td:nth-child(5)')).some((td) => td.textContent === 'create_session')`)
		e.shot("7-audit")
	})

	e.step("service status", func() {
		e.click(chromedp.Search(`//header//a[text()="Status"]`))
		e.waitSel("#engines tbody tr")
		e.waitSel("#isolation tbody tr")
		e.shot("8-status")
	})

	e.step("nothing went wrong on the way", func() {
		d := seenDialogs()
		e.check(len(d) == 0, "no dialogs: %s", strings.Join(d, "; "))
		mu.Lock()
		p := append([]string(nil), problems...)
		mu.Unlock()
		e.check(len(p) == 0, "%s", strings.Join(p, "\n"))
	})
	t.Logf("screenshots in %s", out)
}

// stepTimeout bounds one step that will never finish (a selector that
// never appears); a passing step waits only on the page.
const stepTimeout = 60 * time.Second

// e2e is one headless Chromium tab and the test it reports to. Its
// helpers fail the test with what they waited for.
type e2e struct {
	t    *testing.T
	out  string
	ctx  context.Context // the browser's: lives as long as the test
	sctx context.Context // the current step's: bounded by stepTimeout
	name string
	bcid cdp.BrowserContextID // the test's browser context in the shared browser
	diag func() string        // what a failed step logs besides its screenshot (nil: nothing)
}

// newE2E opens a tab for t in a browser context of its own (cookies,
// storage, permissions and downloads apart, as an incognito window's) of
// the shared browser, closed when t ends.
func newE2E(t *testing.T, out string) *e2e {
	bctx := sharedBrowser.start(t)
	ctx, cancel := chromedp.NewContext(bctx, chromedp.WithNewBrowserContext())
	t.Cleanup(cancel)
	if err := chromedp.Do(ctx); err != nil { // makes the browser context and its tab
		t.Fatalf("open a tab of %s: %v", chromium, err)
	}
	return &e2e{t: t, out: out, ctx: ctx, sctx: ctx, bcid: chromedp.FromContext(ctx).BrowserContextID}
}

// sharedBrowser is the one headless Chromium of the test binary, started
// by the first browser test and stopped after the last (TestMain): a
// Chromium's start and its helper processes were about 2.5 CPU-s each
// time, for each of the four browser tests. Each test keeps its own quro
// serve (its sessions, tenants and audit log, whose page of 100 rows
// another test's calls would push a row off) and its own browser context.
var sharedBrowser browserOnce

type browserOnce struct {
	once sync.Once
	ctx  context.Context // the browser's first tab: what newE2E's contexts derive from
	stop func()
	err  error
}

func (b *browserOnce) start(t *testing.T) context.Context {
	t.Helper()
	b.once.Do(func() {
		opts := append(chromedp.DefaultExecAllocatorOptions[:],
			chromedp.ExecPath(chromium),
			chromedp.Flag("headless", "new"),
			chromedp.NoSandbox, // root in a container: Chromium's own sandbox cannot start
			chromedp.DisableGPU,
			chromedp.WindowSize(1280, 800),
		)
		actx, acancel := chromedp.NewExecAllocator(context.Background(), opts...)
		ctx, cancel := chromedp.NewContext(actx)
		b.ctx, b.stop = ctx, func() { cancel(); acancel() }
		b.err = chromedp.Do(ctx) // starts the browser, bound to ctx
	})
	if b.err != nil {
		t.Fatalf("start %s: %v", chromium, b.err)
	}
	return b.ctx
}

// close stops the browser, if one was started.
func (b *browserOnce) close() {
	if b.stop != nil {
		b.stop()
	}
}

// step runs fn as one named step; the first failing step ends the test
// after a screenshot of the page as it was.
func (e *e2e) step(name string, fn func()) {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(e.ctx, stepTimeout)
	defer cancel()
	e.sctx, e.name = ctx, name
	t0 := time.Now()
	var failed error
	func() {
		defer func() {
			if r := recover(); r != nil {
				f, ok := r.(stepFailure)
				if !ok {
					panic(r)
				}
				failed = f
			}
		}()
		fn()
	}()
	e.sctx = e.ctx
	if failed == nil {
		e.t.Logf("ok   %s (%d ms)", name, time.Since(t0).Milliseconds())
		return
	}
	shot := filepath.Join(e.out, "failed-"+regexp.MustCompile(`\W+`).ReplaceAllString(name, "-")+".png")
	if b, err := e.screenshot(e.ctx); err == nil {
		os.WriteFile(shot, b, 0o644)
	}
	if e.diag != nil {
		e.t.Log(e.diag())
	}
	e.t.Fatalf("FAIL %s: %v\n(the page as it was: %s)", name, failed, shot)
}

type stepFailure struct{ error }

func (e *e2e) fail(format string, a ...any) {
	panic(stepFailure{fmt.Errorf(format, a...)})
}

func (e *e2e) check(cond bool, format string, a ...any) {
	if !cond {
		e.fail("check failed: "+format, a...)
	}
}

// run runs the action; what names it in the error.
func run[T any](e *e2e, what string, a chromedp.Action[T]) T {
	v, err := chromedp.Run(e.sctx, a)
	if err != nil {
		e.fail("%s: %v", what, err)
	}
	return v
}

func eval[T any](e *e2e, js string) T {
	return run(e, "evaluate "+js, chromedp.Evaluate[T](js))
}

func (e *e2e) do(what string, a chromedp.Action[chromedp.Void]) { run(e, what, a) }

func (e *e2e) url() string { return run(e, "read the location", chromedp.Location()) }

// waitSel waits until an element matches the CSS selector.
func (e *e2e) waitSel(sel string) {
	if err := chromedp.Do(e.sctx, chromedp.WaitReady(chromedp.CSS(sel))); err != nil {
		e.fail("waiting for %s: %v", sel, err)
	}
}

// waitJS waits, on every DOM mutation, until the expression is true.
func (e *e2e) waitJS(expr string) {
	_, err := chromedp.Run(e.sctx, chromedp.Poll[chromedp.Void](expr, chromedp.WithPollingMutation(), chromedp.WithPollingTimeout(0)))
	if err != nil {
		e.fail("waiting for %s: %v", expr, err)
	}
}

// mark keeps the nodes the selectors (by name) find now in the page, for
// kept: a page that redraws in place keeps them across its refreshes;
// one that rebuilds replaces them, and a click, the focus, a selection
// or a screen reader's place in them is lost.
func (e *e2e) mark(sels map[string]string) {
	b, _ := json.Marshal(sels)
	e.do("mark the nodes", chromedp.Evaluate[chromedp.Void](fmt.Sprintf(`window.__kept = Object.fromEntries(Object.entries(%s).map(([k, s]) => [k, document.querySelector(s)]))`, b)))
	missing := eval[[]string](e, `Object.entries(window.__kept).filter(([, n]) => !n).map(([k]) => k)`)
	e.check(len(missing) == 0, "nothing to mark: %v", missing)
}

// kept checks that the selectors find the nodes mark found.
func (e *e2e) kept(sels map[string]string) {
	b, _ := json.Marshal(sels)
	changed := eval[[]string](e, fmt.Sprintf(`Object.entries(%s).filter(([k, s]) => document.querySelector(s) !== window.__kept[k]).map(([k]) => k)`, b))
	e.check(len(changed) == 0, "replaced by a refresh, not kept: %v", changed)
}

// click clicks the middle of the first element the selector finds, as a
// mouse would.
func click[S chromedp.Selectable](e *e2e, sel S) {
	if err := chromedp.Do(e.sctx, chromedp.Click(sel)); err != nil {
		e.fail("click %v: %v", sel, err)
	}
}

func (e *e2e) click(sel any) {
	switch s := sel.(type) {
	case chromedp.CSS:
		click(e, s)
	case chromedp.Search:
		click(e, s)
	default:
		panic(fmt.Sprintf("click: selector %T", sel))
	}
}

// fill focuses the field, selects what is in it and types the value over
// it in one input event (as a paste would), so the page sees an edit.
func (e *e2e) fill(sel, value string) {
	e.do("focus "+sel, chromedp.Focus(chromedp.CSS(sel)))
	e.do("select the text of "+sel, chromedp.Evaluate[chromedp.Void](fmt.Sprintf(`document.querySelector(%q).select()`, sel)))
	if value == "" {
		e.press("\b")
		return
	}
	if _, err := chromedp.Call(e.sctx, input.InsertText, input.InsertTextParams{Text: value}); err != nil {
		e.fail("type into %s: %v", sel, err)
	}
	got := eval[string](e, fmt.Sprintf(`document.querySelector(%q).value`, sel))
	e.check(got == value, "%s holds %q, want %q", sel, got, value)
}

// typeKeys types text key by key into the focused element. Each key is
// a keydown that carries its text and a keyup, as a keyboard's: the page
// can cancel the keydown and so the character (xterm.js handles the
// keydown itself; a separate char event would type every key twice).
func (e *e2e) typeKeys(text string) {
	for _, r := range text {
		var down, up *input.DispatchKeyEventParams
		var chars string
		for _, k := range kb.Encode(r) {
			switch k.Type {
			case kb.KeyDown:
				down = k
			case kb.KeyUp:
				up = k
			case kb.KeyChar:
				chars = k.Text
			}
		}
		down.Text, down.UnmodifiedText = chars, chars
		for _, k := range []*input.DispatchKeyEventParams{down, up} {
			if _, err := chromedp.Call(e.sctx, input.DispatchKeyEvent, *k); err != nil {
				e.fail("type %q: %v", text, err)
			}
		}
	}
}

// press presses one key ("\r" is Enter, "\b" Backspace).
func (e *e2e) press(key string) { e.typeKeys(key) }

// selectOption picks the option of a <select> whose value or label
// ("value", "label") is want, and fires the events a person's choice does.
func (e *e2e) selectOption(sel, by, want string) {
	ok := eval[bool](e, fmt.Sprintf(`(() => {
		const s = document.querySelector(%q);
		const o = s && Array.from(s.options).find((o) => (%q === 'label' ? o.label : o.value) === %q);
		if (!o) return false;
		s.value = o.value;
		s.dispatchEvent(new Event('input', { bubbles: true }));
		s.dispatchEvent(new Event('change', { bubbles: true }));
		return true;
	})()`, sel, by, want))
	e.check(ok, "%s has an option with %s %q", sel, by, want)
}

// screenRows is a page function that gives the text of the terminal's
// visible rows as xterm.js draws them (its spaces are no-break spaces;
// a row's trailing ones are cut). screen and waitScreen's wait for a
// redraw read the rows through it alike.
const screenRows = `() => Array.from(document.querySelector('#terminal .xterm-rows')?.children ?? [], (r) => r.textContent.replace(/\u00a0/g, ' ').trimEnd())`

// screen is the text of the terminal's visible rows.
func (e *e2e) screen() []string {
	return eval[[]string](e, "("+screenRows+")()")
}

// waitScreen waits until the terminal's rows satisfy pred, reading them
// again whenever xterm.js redraws.
func (e *e2e) waitScreen(pred func([]string) bool, what string) {
	for {
		last := e.screen()
		if pred(last) {
			return
		}
		// Wait for rows other than last: compared as screen reads them
		// (the rows' raw text, no-break spaces and all, never equals
		// what screen gave, and the wait became a busy loop of reads).
		_, err := chromedp.Run(e.sctx, chromedp.PollFunction[chromedp.Void](`(prev) => {
			const rows = (`+screenRows+`)();
			return rows.length !== prev.length || rows.some((r, i) => r !== prev[i]);
		}`, chromedp.WithPollingMutation(), chromedp.WithPollingTimeout(0), chromedp.WithPollingArgs(last)))
		if err != nil {
			var shown []string
			for _, l := range last {
				if l != "" {
					shown = append(shown, l)
				}
			}
			e.fail("terminal never showed %s (%v); screen:\n%s", what, err, strings.Join(shown, "\n"))
		}
	}
}

// waitFrameText waits until the element sel in the artifact frame has the
// text want. A sandboxed frame without allow-same-origin has an opaque
// origin, which Chromium may put in a process of its own: then it is a
// target of its own (listed once Chromium has made it: the wait is on the
// browser's target events) and is read through it; otherwise through the
// page.
func (e *e2e) waitFrameText(sel, want string) {
	pred := fmt.Sprintf(`document.querySelector(%q)?.textContent === %q`, sel, want)
	ctx, stop := context.WithCancel(e.sctx)
	defer stop()
	targets := make(chan struct{}, 1)
	err := chromedp.ListenBrowser(ctx, func(ev any) {
		switch ev.(type) {
		case *cdptarget.EventTargetCreated, *cdptarget.EventTargetInfoChanged, *cdptarget.EventAttachedToTarget:
			select {
			case targets <- struct{}{}:
			default:
			}
		}
	})
	if err != nil {
		e.fail("listen to the browser's targets: %v", err)
	}
	// A frame of the page whose document is there but whose script
	// context is not yet: wait for the page's next execution context.
	err = chromedp.Listen(ctx, func(ev any) {
		if _, ok := ev.(*runtime.EventExecutionContextCreated); ok {
			select {
			case targets <- struct{}{}:
			default:
			}
		}
	})
	if err != nil {
		e.fail("listen to the page's events: %v", err)
	}
	for {
		infos, err := chromedp.Targets(e.sctx)
		if err != nil {
			e.fail("list targets: %v", err)
		}
		for _, info := range infos {
			// The shared browser's other tests have artifact frames too.
			if info.Type == "iframe" && info.BrowserContextID == e.bcid && strings.Contains(info.URL, "/frame.html") {
				fctx, cancel := chromedp.NewContext(e.sctx, chromedp.WithTargetID(info.TargetID), chromedp.WithDetachOnCancel())
				_, err := chromedp.Run(fctx, chromedp.Poll[chromedp.Void](pred, chromedp.WithPollingMutation(), chromedp.WithPollingTimeout(0)))
				cancel()
				if err != nil {
					e.fail("artifact frame never showed %s = %q: %v", sel, want, err)
				}
				e.t.Logf("     the artifact frame (a process of its own) shows %s = %q", sel, want)
				return
			}
		}
		nodes := run(e, "find the artifact frame", chromedp.Nodes(chromedp.CSS("#play-artifacts iframe.artifact-frame")))
		if len(nodes) > 0 && nodes[0].ContentDocument != nil {
			_, err := chromedp.Run(e.sctx, chromedp.Poll[chromedp.Void](pred, chromedp.WithPollingMutation(), chromedp.WithPollingTimeout(0), chromedp.WithPollingInFrame(nodes[0])))
			if err == nil {
				e.t.Logf("     the artifact frame (in the page's process) shows %s = %q", sel, want)
				return
			}
			if !strings.Contains(err.Error(), "executionContextId") {
				e.fail("artifact frame never showed %s = %q: %v", sel, want, err)
			}
			// The frame's script context is not made yet: the select
			// below waits for it.
		}
		select {
		case <-targets:
		case <-e.sctx.Done():
			e.fail("the artifact frame never became a target nor a document of the page (%d frame nodes)", len(nodes))
		}
	}
}

// shot saves a screenshot of the whole page (not only the viewport) as
// NAME.png in $QURO_E2E_OUT, and does nothing when it is not set: the
// pictures are docs/ui.md's, which no check reads, and their 26 full-page
// PNGs were about 6 of the browser tests' 63 CPU-s in make test, written
// to temporary folders nobody opened (docs/RATIONALE.md).
func (e *e2e) shot(name string) {
	if os.Getenv("QURO_E2E_OUT") == "" {
		return
	}
	b, err := e.screenshot(e.sctx)
	if err != nil {
		e.fail("screenshot %s: %v", name, err)
	}
	if err := os.WriteFile(filepath.Join(e.out, name+".png"), b, 0o644); err != nil {
		e.fail("%v", err)
	}
}

func (e *e2e) screenshot(ctx context.Context) ([]byte, error) {
	m, err := chromedp.Call(ctx, page.GetLayoutMetrics, cdp.Empty{})
	if err != nil {
		return nil, err
	}
	w, h := 1280.0, 800.0
	if c := m.CSSContentSize; c != nil {
		w, h = max(w, c.Width), max(h, c.Height)
	}
	r, err := chromedp.Call(ctx, page.CaptureScreenshot, page.CaptureScreenshotParams{
		Format:                page.CaptureScreenshotFormatPng,
		Clip:                  &page.Viewport{Width: w, Height: h, Scale: 1},
		CaptureBeyondViewport: new(true),
		FromSurface:           new(true),
	})
	if err != nil {
		return nil, err
	}
	return r.Data, nil
}

// jpeg8x6 is an 8×6 orange JPEG saved by Pillow (quality 50).
const jpeg8x6 = "/9j/4AAQSkZJRgABAQAAAQABAAD/2wBDABALDA4MChAODQ4SERATGCgaGBYWGDEjJR0oOjM9PDkzODdASFxOQERXRTc4UG1RV19iZ2hnPk1xeXBkeFxlZ2P/2wBDARESEhgVGC8aGi9jQjhCY2NjY2NjY2NjY2NjY2NjY2NjY2NjY2NjY2NjY2NjY2NjY2NjY2NjY2NjY2NjY2NjY2P/wAARCAAGAAgDASIAAhEBAxEB/8QAHwAAAQUBAQEBAQEAAAAAAAAAAAECAwQFBgcICQoL/8QAtRAAAgEDAwIEAwUFBAQAAAF9AQIDAAQRBRIhMUEGE1FhByJxFDKBkaEII0KxwRVS0fAkM2JyggkKFhcYGRolJicoKSo0NTY3ODk6Q0RFRkdISUpTVFVWV1hZWmNkZWZnaGlqc3R1dnd4eXqDhIWGh4iJipKTlJWWl5iZmqKjpKWmp6ipqrKztLW2t7i5usLDxMXGx8jJytLT1NXW19jZ2uHi4+Tl5ufo6erx8vP09fb3+Pn6/8QAHwEAAwEBAQEBAQEBAQAAAAAAAAECAwQFBgcICQoL/8QAtREAAgECBAQDBAcFBAQAAQJ3AAECAxEEBSExBhJBUQdhcRMiMoEIFEKRobHBCSMzUvAVYnLRChYkNOEl8RcYGRomJygpKjU2Nzg5OkNERUZHSElKU1RVVldYWVpjZGVmZ2hpanN0dXZ3eHl6goOEhYaHiImKkpOUlZaXmJmaoqOkpaanqKmqsrO0tba3uLm6wsPExcbHyMnK0tPU1dbX2Nna4uPk5ebn6Onq8vP09fb3+Pn6/9oADAMBAAIRAxEAPwC5RRRXy59Gf//Z"
