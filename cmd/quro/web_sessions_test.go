package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"image"
	"image/png"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/emulation"
	"github.com/chromedp/cdproto/fetch"
	cdplog "github.com/chromedp/cdproto/log"
	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"
)

// TestWebSessions drives the session pages, the operator view and the
// UI's looks in headless Chromium against a real quro serve: a session's
// page shows its box's budgets, pauses and resumes it from its buttons,
// draws no refresh's reply older than one it has drawn (a reply held back
// in the browser and let through last), says plainly when the session has
// ended and asks before destroying it (a refused confirm keeps it); the operator
// (the serve's admin token) sees two tenants' sessions and filters by
// tenant, while a tenant's token is refused (403, by the server); at
// 390 px nothing overflows sideways and Sign out is on screen; the
// colour scheme follows prefers-color-scheme and the toggle; an underscore
// is drawn in the terminal at device pixel ratio 1 and 2 (pixels of a
// screenshot of its row); and no error reaches the console. One server,
// one browser; every wait is on the page or the DOM.
func TestWebSessions(t *testing.T) {
	t.Parallel()
	srv, out := startWebTest(t)
	base, admin := srv.url, srv.token
	rest := func(tok, method, path string, body any) (int, map[string]any) {
		t.Helper()
		b, _ := json.Marshal(body)
		if body == nil {
			b = nil
		}
		r := do(t, method, base+path, "application/json", string(b), "Authorization", "Bearer "+tok)
		var m map[string]any
		_ = json.Unmarshal([]byte(r.body), &m)
		return r.status, m
	}
	// A second tenant with a session, and one of the operator's own with
	// a box (a command ran in it, so it has budgets in use).
	st, tk := rest(admin, "POST", "/v1/create_token", map[string]any{"tenant": "acme", "scopes": []string{"read", "exec"}})
	if st != 200 {
		t.Fatalf("create_token: %d %v", st, tk)
	}
	acme, _ := tk["token"].(string)
	st, acmeBox := rest(acme, "POST", "/v1/sessions", map[string]any{"name": "acme-box"})
	if st != http.StatusCreated {
		t.Fatalf("acme's session: %d %v", st, acmeBox)
	}
	acmeBoxID, _ := acmeBox["id"].(string)
	st, ops := rest(admin, "POST", "/v1/sessions", map[string]any{"name": "ops", "metadata": map[string]string{"team": "blue"}})
	if st != http.StatusCreated {
		t.Fatalf("ops session: %d %v", st, ops)
	}
	opsID, _ := ops["id"].(string)
	if st, m := rest(admin, "POST", "/v1/sessions/"+opsID+"/exec", map[string]any{"command": "echo warm"}); st != 200 {
		t.Fatalf("exec: %d %v", st, m)
	}
	// The server refuses the cross-tenant listing to a tenant's token.
	if st, m := rest(acme, "POST", "/v1/list_sessions", map[string]any{"tenant": "*"}); st != http.StatusForbidden {
		t.Fatalf("a tenant listed every tenant's sessions: %d %v", st, m)
	}

	e := newE2E(t, out)
	var (
		mu       sync.Mutex
		problems []string
		confirm  = true // the answer to the next confirm()
		dialogs  []string
	)
	problem := func(format string, a ...any) {
		mu.Lock()
		problems = append(problems, fmt.Sprintf(format, a...))
		mu.Unlock()
	}
	err := chromedp.Listen(e.ctx, func(ev any) {
		switch ev := ev.(type) {
		case *page.EventJavascriptDialogOpening:
			mu.Lock()
			dialogs = append(dialogs, ev.Message)
			accept := confirm
			mu.Unlock()
			go chromedp.Call(e.ctx, page.HandleJavaScriptDialog, page.HandleJavaScriptDialogParams{Accept: accept})
		case *runtime.EventExceptionThrown:
			problem("page error: %s", ev.ExceptionDetails.Text)
		case *runtime.EventConsoleAPICalled:
			if ev.Type == "error" {
				problem("console %s: %v", ev.Type, ev.Args)
			}
		case *cdplog.EventEntryAdded:
			// A refused request (the tenant's 403 below, asked for on
			// purpose) is the browser's network line, not the page's error.
			if ev.Entry.Level == cdplog.EntryLevelError && ev.Entry.Source != cdplog.EntrySourceNetwork {
				problem("console: %s %s", ev.Entry.Text, ev.Entry.URL)
			}
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	answer := func(v bool) {
		mu.Lock()
		confirm = v
		mu.Unlock()
	}
	// go opens a page of the UI by its hash (a same-document navigation).
	goTo := func(hash string) {
		e.do("open "+hash, chromedp.Evaluate[chromedp.Void](fmt.Sprintf(`location.hash = %q`, hash)))
	}
	signIn := func(tok string) {
		e.do("open the UI", chromedp.Navigate(base+"/"))
		e.do("store the token", chromedp.Evaluate[chromedp.Void](fmt.Sprintf(`sessionStorage.setItem('quro.token', %q)`, tok)))
		e.do("load signed in", chromedp.Reload())
	}
	e.do("set the viewport", chromedp.EmulateViewport(1280, 800))

	e.step("session page: budgets, facts, mount points", func() {
		signIn(admin)
		goTo("#/session/" + opsID)
		e.waitJS(`document.querySelector('#session-state')?.textContent === 'running'`)
		e.waitSel("#session-budgets #budget-memory")
		e.waitSel("#session-budgets #budget-disk")
		facts := eval[string](e, `document.querySelector('#session-facts').textContent`)
		e.check(strings.Contains(facts, "team=blue") && strings.Contains(facts, "Expires") && strings.Contains(facts, "host userland"), "facts: %q", facts)
		e.check(eval[bool](e, `!!document.querySelector('#session-timeline') && !!document.querySelector('#session-files')`), "mount points for the timeline and the files")
		e.check(!strings.Contains(eval[string](e, `document.body.textContent`), srv.data), "no host path on the page")
		e.shot("9-session")
	})

	e.step("session page: a refresh redraws the meters and facts in place", func() {
		// The box uses CPU; the refresh that shows it rewrites the CPU
		// meter's figures and keeps its nodes and the facts'.
		nodes := map[string]string{"cpu meter": "#budget-cpu", "its figures": "#budget-cpu .meter-label .mono", "the Id fact": "#session-facts dd"}
		e.mark(nodes)
		before := eval[float64](e, `Number(document.querySelector('#budget-cpu').dataset.seconds)`)
		if st, m := rest(admin, "POST", "/v1/sessions/"+opsID+"/exec", map[string]any{"command": "python3 -c 'sum(range(10**6))'"}); st != 200 {
			t.Fatalf("exec: %d %v", st, m)
		}
		e.waitJS(fmt.Sprintf(`Number(document.querySelector('#budget-cpu')?.dataset.seconds) > %v`, before))
		e.kept(nodes)
	})

	e.step("session page: pause and resume from the buttons", func() {
		e.click(chromedp.CSS("#session-pause"))
		e.waitJS(`document.querySelector('#session-state')?.textContent === 'paused'`)
		_, m := rest(admin, "GET", "/v1/sessions/"+opsID, nil)
		e.check(m["state"] == "paused", "the server says %v", m["state"])
		e.click(chromedp.CSS("#session-resume"))
		e.waitJS(`document.querySelector('#session-state')?.textContent === 'running'`)
		_, m = rest(admin, "GET", "/v1/sessions/"+opsID, nil)
		e.check(m["state"] == "running", "the server says %v", m["state"])
	})

	e.step("session page: a listening port appears with its preview link", func() {
		// A server in the box on 127.0.0.1:8123; the page's refresh
		// (list_ports) shows it, and its button gives a signed link that
		// opens the box's page with no token.
		if st, m := rest(admin, "POST", "/v1/start_process", map[string]any{"session": opsID, "tag": "web",
			"command": "python3 -m http.server 8123 --bind 127.0.0.1", "background": true}); st != 200 {
			t.Fatalf("start_process: %d %v", st, m)
		}
		e.waitSel(`#session-ports li[data-port="8123"] button.preview-port`)
		e.check(strings.Contains(eval[string](e, `document.querySelector('#session-ports li[data-port="8123"]').textContent`), "127.0.0.1"), "the port's address")
		e.click(chromedp.CSS(`#session-ports li[data-port="8123"] button.preview-port`))
		e.waitSel(`#session-ports li[data-port="8123"] a.preview-link`)
		href := eval[string](e, `document.querySelector('#session-ports li[data-port="8123"] a.preview-link').getAttribute('href')`)
		e.check(strings.Contains(href, "/ports/8123/") && strings.Contains(href, "quro_preview="), "the preview link: %q", href)
		if strings.HasPrefix(href, "/") {
			r := do(t, "GET", base+href, "", "")
			e.check(r.status == 200 && strings.Contains(r.body, "Directory listing"), "the link opens the box's page: %d %.200s", r.status, r.body)
		}
		e.shot("9-session-ports")
		// A second server: its port and its process are added to the
		// lists, and the first port's row, with the link asked for, and
		// its process's row stay as they are.
		nodes := map[string]string{"port 8123": `#session-ports li[data-port="8123"]`, "its link": `#session-ports li[data-port="8123"] a.preview-link`, "its process": "#session-processes tbody tr"}
		e.mark(nodes)
		if st, m := rest(admin, "POST", "/v1/start_process", map[string]any{"session": opsID, "tag": "web2",
			"command": "python3 -m http.server 8124 --bind 127.0.0.1", "background": true}); st != 200 {
			t.Fatalf("start_process: %d %v", st, m)
		}
		e.waitSel(`#session-ports li[data-port="8124"] button.preview-port`)
		e.waitJS(`document.querySelectorAll('#session-processes tbody tr').length === 2`)
		e.kept(nodes)
		for _, tag := range []string{"web", "web2"} {
			if st, m := rest(admin, "POST", "/v1/signal_process", map[string]any{"session": opsID, "tag": tag, "signal": "SIGKILL"}); st != 200 {
				t.Errorf("signal_process %s: %d %v", tag, st, m)
			}
		}
		e.waitJS(`!document.querySelector('#session-ports li[data-port="8123"]') && !document.querySelector('#session-ports li[data-port="8124"]')`)
	})

	e.step("operator view: two tenants, filtered by tenant", func() {
		goTo("#/operator")
		e.waitSel(`#operator tr[data-tenant="acme"][data-session="acme-box"]`)
		e.waitSel(`#operator tr[data-tenant=""][data-session="ops"]`)
		// acme's box spends 0.3 s of CPU (its CPU cell, in tenths, moves)
		// and acme gets a second session; the refresh that shows them
		// adds the new row and keeps the box's row, its link and the
		// other rows; the second session's end removes its row.
		row := `#operator tr[data-session="acme-box"]`
		nodes := map[string]string{"acme-box's row": row, "its link": row + " a", "ops's row": `#operator tr[data-session="ops"]`}
		cpu := eval[string](e, `document.querySelector('`+row+` td[data-label="CPU"]').textContent`)
		e.mark(nodes)
		if st, m := rest(acme, "POST", "/v1/sessions/"+acmeBoxID+"/exec", map[string]any{"command": "python3 -c \"exec('import time\\nwhile time.process_time() < 0.3: pass')\""}); st != 200 || m["exit_code"] != 0.0 {
			t.Fatalf("exec in acme-box: %d %v", st, m)
		}
		st, two := rest(acme, "POST", "/v1/sessions", map[string]any{"name": "acme-two"})
		if st != http.StatusCreated {
			t.Fatalf("acme's second session: %d %v", st, two)
		}
		e.waitJS(fmt.Sprintf(`document.querySelector('#operator tr[data-session="acme-two"]') !== null && document.querySelector('%s td[data-label="CPU"]').textContent !== %q`, row, cpu))
		e.kept(nodes)
		twoID, _ := two["id"].(string)
		if st, m := rest(acme, "DELETE", "/v1/sessions/"+twoID, nil); st != http.StatusNoContent && st != 200 {
			t.Fatalf("destroy acme-two: %d %v", st, m)
		}
		e.waitJS(`document.querySelector('#operator tr[data-session="acme-two"]') === null`)
		e.kept(nodes)
		e.selectOption("#operator-tenant", "value", "acme")
		e.waitJS(`(() => { const r = [...document.querySelectorAll('#operator tbody tr')]; return r.length === 1 && r[0].dataset.tenant === 'acme'; })()`)
		e.shot("10-operator")
	})

	e.step("operator view: another tenant's session opens read-only", func() {
		e.click(chromedp.CSS(`#operator tr[data-tenant="acme"] a`))
		e.waitJS(`!document.querySelector('#session-readonly')?.hidden && /acme/.test(document.querySelector('#session-readonly')?.textContent ?? '')`)
		e.waitJS(`[...document.querySelectorAll('#session-facts dd')].some((d) => d.textContent === 'acme')`)
		e.check(eval[bool](e, `document.querySelector('#session-actions').hidden && !document.querySelector('#session-timeline #agent-terminal') && document.querySelector('#session-processes').hidden`),
			"another tenant's session page has no actions, no live view, no processes")
		e.check(eval[string](e, `document.querySelector('h1 .mono')?.textContent ?? ''`) == "acme-box", "the page names the session")
	})

	e.step("operator view: a tenant's token is refused", func() {
		signIn(acme)
		goTo("#/operator")
		e.waitJS(`/operator/.test(document.querySelector('#operator-error')?.textContent ?? '')`)
		e.check(eval[int](e, `document.querySelectorAll('#operator tbody tr').length`) == 0, "no rows for a tenant")
	})

	e.step("phone: 390 px, cards, Sign out on screen, the terminal's keys", func() {
		signIn(admin)
		e.do("a phone's viewport", chromedp.EmulateViewport(390, 844, chromedp.EmulateMobile))
		goTo("#/sessions")
		e.waitSel(`#sessions tr[data-session="ops"]`)
		fits := func() {
			w := eval[int](e, `document.documentElement.scrollWidth`)
			e.check(w <= 390, "the page is %d px wide at 390", w)
			r := eval[map[string]float64](e, `(() => { const r = document.querySelector('#signout').getBoundingClientRect(); return { l: r.left, r: r.right, t: r.top, b: r.bottom, w: r.width }; })()`)
			e.check(r["w"] > 0 && r["l"] >= 0 && r["r"] <= 390 && r["t"] >= 0 && r["b"] <= 844, "Sign out at %v", r)
		}
		fits()
		e.check(eval[string](e, `getComputedStyle(document.querySelector('#sessions thead')).display`) == "none", "cards, not a table")
		e.shot("11-phone-sessions")
		goTo("#/session/" + opsID)
		e.waitSel("#session-budgets #budget-memory")
		fits()
		goTo("#/term/" + opsID)
		e.waitJS(`document.querySelector('#term-state')?.textContent === 'connected'`)
		keys := eval[[]string](e, `[...document.querySelectorAll('#term-keys button')].map((b) => b.textContent)`)
		e.check(strings.Join(keys, " ") == "Esc Tab Ctrl ← ↑ ↓ →", "extra keys: %v", keys)
		fits()
		e.shot("12-phone-terminal")
		e.do("back to a desktop", chromedp.EmulateViewport(1280, 800))
	})

	e.step("dark mode: prefers-color-scheme and the toggle", func() {
		prefer := func(scheme string) {
			if _, err := chromedp.Call(e.sctx, emulation.SetEmulatedMedia, emulation.SetEmulatedMediaParams{
				Features: []*emulation.MediaFeature{{Name: "prefers-color-scheme", Value: scheme}},
			}); err != nil {
				e.fail("prefer %s: %v", scheme, err)
			}
		}
		bg := func() string { return eval[string](e, `getComputedStyle(document.body).backgroundColor`) }
		dark := func(c string) bool {
			var r, g, b int
			fmt.Sscanf(c, "rgb(%d, %d, %d)", &r, &g, &b)
			return r+g+b < 3*80
		}
		prefer("dark")
		goTo("#/session/" + opsID)
		e.waitSel("#session-budgets #budget-memory")
		e.check(dark(bg()), "dark background under prefers dark: %s", bg())
		e.shot("13-dark")
		e.click(chromedp.CSS("#theme-toggle"))
		e.check(!dark(bg()), "the toggle made it light: %s", bg())
		e.click(chromedp.CSS("#theme-toggle"))
		e.check(dark(bg()), "and dark again: %s", bg())
		prefer("light")
		e.check(!dark(bg()), "light under prefers light: %s", bg())
	})

	e.step("keyboard shortcuts on ?", func() {
		e.click(chromedp.CSS("h1"))
		e.press("?")
		e.waitJS(`document.querySelector('#shortcuts')?.open === true`)
		e.check(strings.Contains(eval[string](e, `document.querySelector('#shortcuts').textContent`), "go to Sessions"), "the list names the shortcuts")
		e.press("\x1b")
		e.waitJS(`document.querySelector('#shortcuts')?.open === false`)
	})

	for _, dpr := range []float64{1, 2} {
		e.step(fmt.Sprintf("terminal draws an underscore at DPR %g", dpr), func() {
			if _, err := chromedp.Call(e.sctx, emulation.SetDeviceMetricsOverride, emulation.SetDeviceMetricsOverrideParams{Width: 1280, Height: 800, DeviceScaleFactor: dpr}); err != nil {
				e.fail("device pixel ratio %g: %v", dpr, err)
			}
			goTo("#/term/" + opsID)
			e.waitJS(`document.querySelector('#term-state')?.textContent === 'connected'`)
			e.click(chromedp.CSS("#terminal"))
			e.typeKeys("clear; echo ________")
			e.press("\r")
			e.waitScreen(func(l []string) bool {
				for _, x := range l {
					if x == "________" {
						return true
					}
				}
				return false
			}, "a row of underscores")
			// The row's box, and the part of it the text takes.
			r := eval[map[string]float64](e, `(() => {
				const row = [...document.querySelectorAll('#terminal .xterm-rows > div')].find((d) => d.textContent.replace(/\u00a0/g, ' ').trimEnd() === '________');
				const b = row.getBoundingClientRect();
				const range = document.createRange(); range.selectNodeContents(row);
				const t = range.getBoundingClientRect();
				return { x: b.left, y: b.top, w: Math.min(b.width, t.width || b.width), h: b.height };
			})()`)
			shot, err := chromedp.Call(e.sctx, page.CaptureScreenshot, page.CaptureScreenshotParams{
				Format: page.CaptureScreenshotFormatPng,
				Clip:   &page.Viewport{X: r["x"], Y: r["y"], Width: r["w"], Height: r["h"], Scale: 1},
			})
			if err != nil {
				e.fail("screenshot the row: %v", err)
			}
			img, err := png.Decode(bytes.NewReader(shot.Data))
			if err != nil {
				e.fail("decode: %v", err)
			}
			lit := litPixels(img)
			e.t.Logf("     DPR %g: the underscore row (%.0f×%.0f CSS px) has %d lit pixels", dpr, r["w"], r["h"], lit)
			// Eight underscores at 14 px are at least a line of pixels each.
			e.check(lit >= int(8*4*dpr), "the underscores drew %d lit pixels", lit)
			if dpr == 2 {
				os.WriteFile(out+"/14-underscore-dpr2.png", shot.Data, 0o644)
			}
		})
	}
	if _, err := chromedp.Call(e.ctx, emulation.ClearDeviceMetricsOverride, cdp.Empty{}); err != nil {
		t.Fatal(err)
	}

	e.step("audit: session column, outcome filter, background reads hidden, a row opens", func() {
		if st, _ := rest(admin, "GET", "/v1/sessions/no-such-session", nil); st != http.StatusNotFound {
			e.fail("a missing session: %d", st)
		}
		goTo("#/audit")
		// The session page's refreshes (get_session_status every few
		// seconds, marked background) are not in the default view.
		e.waitJS(`[...document.querySelectorAll('#audit tbody tr')].some((r) => r.children[4].textContent === 'pause_session' && r.children[5].textContent === 'ops')`)
		e.check(eval[int](e, `[...document.querySelectorAll('#audit tbody tr')].filter((r) => r.children[4].textContent === 'get_session_status' && r.querySelector('.badge')).length`) == 0, "background reads hidden")
		e.click(chromedp.CSS("#audit-background"))
		e.waitJS(`[...document.querySelectorAll('#audit tbody tr')].some((r) => r.children[4].textContent === 'get_session_status' && r.querySelector('.badge')?.textContent === 'background')`)
		e.click(chromedp.CSS("#audit-background"))
		e.selectOption("#audit-outcome", "value", "failed")
		e.waitJS(`(() => { const r = [...document.querySelectorAll('#audit tbody tr')]; return r.length >= 1 && r.every((x) => !x.children[7].textContent.startsWith('ok')) && r.some((x) => x.children[7].textContent.startsWith('not_found')); })()`)
		e.click(chromedp.CSS("#audit tbody tr"))
		e.waitJS(`document.querySelector('#audit tbody tr.open .audit-detail:not([hidden])')?.textContent.includes('Arguments') === true`)
		e.shot("15-audit")
		// Another filter that still lists the opened entry keeps its row
		// as it is, open.
		nodes := map[string]string{"the opened row": "#audit tbody tr.open"}
		e.mark(nodes)
		loads := eval[int](e, `Number(document.querySelector('#audit').dataset.refreshes)`)
		e.click(chromedp.CSS("#audit-background"))
		e.waitJS(fmt.Sprintf(`Number(document.querySelector('#audit').dataset.refreshes) > %d`, loads))
		e.kept(nodes)
		e.click(chromedp.CSS("#audit-background"))
		e.selectOption("#audit-outcome", "value", "")
	})

	// A session of its own for the race and its end, paused as the page
	// opens.
	var raceID string
	e.step("session page: an older refresh's reply, landing last, is not drawn", func() {
		st, race := rest(admin, "POST", "/v1/sessions", map[string]any{"name": "race"})
		if st != http.StatusCreated {
			t.Fatalf("race session: %d %v", st, race)
		}
		raceID, _ = race["id"].(string)
		if st, m := rest(admin, "POST", "/v1/sessions/"+raceID+"/exec", map[string]any{"command": "echo warm"}); st != 200 {
			t.Fatalf("exec: %d %v", st, m)
		}
		if st, m := rest(admin, "POST", "/v1/pause_session", map[string]any{"session": raceID}); st != 200 {
			t.Fatalf("pause: %d %v", st, m)
		}
		goTo("#/session/" + raceID)
		e.waitJS(`document.querySelector('#session-state')?.textContent === 'paused'`)
		// Every reply to the page's reading of the session (GET
		// /v1/sessions/ID) now stops in the browser before the page gets
		// it. The first, a timer's refresh asked while the session is
		// paused, is held back; after Resume, the first reply that says
		// running is let through; every other is held until the step
		// ends. So the timer's reply, older than Resume's, lands last.
		type reply struct {
			id    fetch.RequestID
			state string
		}
		evs := make(chan *fetch.EventRequestPaused, 256)
		replies := make(chan reply, 256)
		lctx, stop := context.WithCancel(e.ctx)
		defer stop()
		if err := chromedp.Listen(lctx, func(ev any) {
			if ev, ok := ev.(*fetch.EventRequestPaused); ok {
				select {
				case evs <- ev:
				default:
				}
			}
		}); err != nil {
			t.Fatal(err)
		}
		go func() {
			for {
				select {
				case ev := <-evs:
					var body struct {
						State string `json:"state"`
					}
					if b, err := chromedp.Call(lctx, fetch.GetResponseBody, fetch.GetResponseBodyParams{RequestID: ev.RequestID}); err == nil {
						_ = json.Unmarshal(b.Body, &body)
					}
					replies <- reply{ev.RequestID, body.State}
				case <-lctx.Done():
					return
				}
			}
		}()
		release := func(id fetch.RequestID) {
			if _, err := chromedp.Call(e.ctx, fetch.ContinueRequest, fetch.ContinueRequestParams{RequestID: id}); err != nil {
				t.Logf("continue a held reply: %v", err)
			}
		}
		next := func() reply {
			select {
			case r := <-replies:
				return r
			case <-e.sctx.Done():
				e.fail("no reply to the page's reading of the session: %v", e.sctx.Err())
				return reply{}
			}
		}
		var (
			hmu     sync.Mutex
			held    []fetch.RequestID
			letting bool // the step ends: every reply goes through
		)
		hold := func(id fetch.RequestID) {
			hmu.Lock()
			defer hmu.Unlock()
			if letting {
				release(id)
				return
			}
			held = append(held, id)
		}
		defer func() {
			hmu.Lock()
			letting = true
			ids := held
			held = nil
			hmu.Unlock()
			for _, id := range ids {
				release(id)
			}
			_, _ = chromedp.Call(e.ctx, fetch.Disable, cdp.Empty{})
		}()
		if _, err := chromedp.Call(e.sctx, fetch.Enable, fetch.EnableParams{Patterns: []*fetch.RequestPattern{{URLPattern: "*/v1/sessions/" + raceID, RequestStage: fetch.RequestStageResponse}}}); err != nil {
			e.fail("hold the session's replies: %v", err)
		}
		old := next()
		e.check(old.state == "paused", "the held reply says %q", old.state)
		refreshes := func() int { return eval[int](e, `Number(document.querySelector('#session-page').dataset.refreshes)`) }
		r := refreshes()
		e.click(chromedp.CSS("#session-resume"))
		for {
			p := next()
			if p.state == "running" {
				release(p.id)
				break
			}
			hold(p.id)
		}
		go func() {
			for {
				select {
				case p := <-replies:
					hold(p.id)
				case <-lctx.Done():
					return
				}
			}
		}()
		// Resume's refresh is drawn (every other one waits on its reply).
		e.waitJS(fmt.Sprintf(`document.querySelector('#session-state')?.textContent === 'running' && Number(document.querySelector('#session-page').dataset.refreshes) > %d`, r))
		r = refreshes()
		release(old.id)
		// The held refresh is over: it is the only one that can end now.
		e.waitJS(fmt.Sprintf(`Number(document.querySelector('#session-page').dataset.refreshes) > %d`, r))
		e.check(eval[string](e, `document.querySelector('#session-state').textContent`) == "running", "an older reply was drawn over a newer one: the page says %q after Resume",
			eval[string](e, `document.querySelector('#session-state').textContent`))
		e.check(eval[bool](e, `document.querySelector('#session-resume').disabled && !document.querySelector('#session-pause').disabled`), "the buttons are a paused session's")
	})

	e.step("session page: an ended session says so", func() {
		e.waitJS(`document.querySelector('#session-state')?.textContent === 'running' && document.querySelectorAll('#session-facts dd').length > 0`)
		if st, m := rest(admin, "DELETE", "/v1/sessions/"+raceID, nil); st != http.StatusNoContent && st != 200 {
			t.Fatalf("destroy race: %d %v", st, m)
		}
		e.waitSel("#session-page[data-ended]")
		e.check(eval[bool](e, `!document.querySelector('#session-ended').hidden && /has ended/.test(document.querySelector('#session-ended').textContent)`), "the page says the session has ended")
		e.check(eval[string](e, `document.querySelector('#session-state').textContent`) == "ended", "the state badge says %q", eval[string](e, `document.querySelector('#session-state').textContent`))
		e.check(eval[bool](e, `[...document.querySelectorAll('#session-actions button, #preview-form button')].every((b) => b.disabled) && [...document.querySelectorAll('#session-actions a')].every((a) => !a.hasAttribute('href'))`),
			"the actions are disabled")
		e.check(eval[bool](e, `[...document.querySelectorAll('#session-facts dd')].some((d) => d.textContent === '`+raceID+`') && document.querySelector('#session-page').classList.contains('ended')`), "the last facts are still shown, marked")
		e.check(eval[bool](e, `[...document.querySelectorAll('#session-page h2')].filter((x) => x.textContent.includes('(last figures)')).length >= 2`), "the figures' headings say they are the last")
		e.shot("9-session-ended")
	})

	e.step("destroy asks first", func() {
		goTo("#/session/" + opsID)
		e.waitJS(`document.querySelector('#session-state')?.textContent === 'running'`)
		answer(false)
		e.click(chromedp.CSS("#session-destroy"))
		e.waitJS(`document.querySelector('#session-page') !== null`)
		if st, _ := rest(admin, "GET", "/v1/sessions/"+opsID, nil); st != 200 {
			e.fail("a refused confirm destroyed the session: %d", st)
		}
		answer(true)
		e.click(chromedp.CSS("#session-destroy"))
		e.waitJS(`location.hash === '#/sessions'`)
		st, _ := rest(admin, "GET", "/v1/sessions/"+opsID, nil)
		e.check(st == http.StatusNotFound, "destroyed: %d", st)
		mu.Lock()
		d := append([]string(nil), dialogs...)
		mu.Unlock()
		e.check(len(d) == 2 && strings.Contains(d[0], "Destroy session ops"), "two confirms: %q", d)
	})

	e.step("the playground's languages are the server's", func() {
		_, st := rest(admin, "GET", "/v1/status", nil)
		var want []string
		seen := map[string]bool{}
		engines, _ := st["engines"].([]any)
		for _, x := range engines {
			en, _ := x.(map[string]any)
			if l, _ := en["lang"].(string); en["available"] == true && !seen[l] {
				seen[l] = true
				want = append(want, l)
			}
		}
		goTo("#/play")
		e.waitJS(fmt.Sprintf(`document.querySelectorAll('#play-lang option').length === %d`, len(want)))
		got := eval[[]string](e, `[...document.querySelectorAll('#play-lang option')].map((o) => o.value)`)
		e.check(len(want) > 1 && strings.Join(got, " ") == strings.Join(want, " "), "languages %v, the server's %v", got, want)
		e.t.Logf("     the server's languages: %s", strings.Join(got, " "))
	})

	e.step("no console errors", func() {
		mu.Lock()
		p := append([]string(nil), problems...)
		mu.Unlock()
		e.check(len(p) == 0, "%s", strings.Join(p, "\n"))
	})
}

// litPixels counts the pixels of img much brighter than the terminal's
// background (#111417): the glyphs' ink.
func litPixels(img image.Image) int {
	n := 0
	b := img.Bounds()
	for y := b.Min.Y; y < b.Max.Y; y++ {
		for x := b.Min.X; x < b.Max.X; x++ {
			r, g, bl, _ := img.At(x, y).RGBA()
			if (r>>8)+(g>>8)+(bl>>8) > 3*100 {
				n++
			}
		}
	}
	return n
}
