package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	cdplog "github.com/chromedp/cdproto/log"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"
)

// TestWebLive drives the live view (#/live/<session>) in headless
// Chromium against a real quro serve while an agent — this test, over
// REST — works in the session: the page watches the agent's command
// stream its output into the timeline and into the agent's shell while it
// still runs; a person takes over, the agent's terminal_exec is refused
// with "a person holds this session", the person types a command into the
// same shell (it sees the variable the agent exported), hands back, and
// the agent's next command runs. No console error, no page error. Every
// wait is on the DOM or on the server's answer, never a sleep.
func TestWebLive(t *testing.T) {
	t.Parallel()
	srv, out := startWebTest(t)
	base, token := srv.url, srv.token
	e := newE2E(t, out)

	var (
		mu       sync.Mutex
		problems []string
	)
	problem := func(format string, a ...any) {
		mu.Lock()
		problems = append(problems, fmt.Sprintf(format, a...))
		mu.Unlock()
	}
	if err := chromedp.Listen(e.ctx, func(ev any) {
		switch ev := ev.(type) {
		case *runtime.EventExceptionThrown:
			problem("page error: %s", ev.ExceptionDetails.Text)
		case *runtime.EventConsoleAPICalled:
			if ev.Type == runtime.ConsoleAPICalledTypeError {
				problem("console error: %v", ev.Args)
			}
		case *cdplog.EventEntryAdded:
			if ev.Entry.Level == cdplog.EntryLevelError {
				problem("console: %s %s", ev.Entry.URL, ev.Entry.Text)
			}
		}
	}); err != nil {
		t.Fatal(err)
	}

	// agent is the agent's side: a REST call with the token, from any
	// goroutine; it returns the status and the body.
	client := &http.Client{Timeout: 5 * time.Minute}
	agent := func(method, path, body string) (int, string) {
		req, err := http.NewRequest(method, base+path, strings.NewReader(body))
		if err != nil {
			return 0, err.Error()
		}
		req.Header.Set("Authorization", "Bearer "+token)
		req.Header.Set("Content-Type", "application/json")
		resp, err := client.Do(req)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	exec := func(cmd string) (int, string) {
		b, _ := json.Marshal(map[string]any{"command": cmd, "timeout_ms": 120000})
		return agent("POST", "/v1/sessions/live/exec", string(b))
	}
	if st, body := agent("POST", "/v1/sessions", `{"name":"live"}`); st != http.StatusCreated {
		t.Fatalf("create the session: %d %s", st, body)
	}
	if st, body := exec("export FOO=from-the-agent"); st != 200 {
		t.Fatalf("agent's first command: %d %s", st, body)
	}

	// termHas is a JS test that the agent's shell view shows s.
	termHas := func(s string) string {
		return fmt.Sprintf(`(document.querySelector('#agent-terminal .xterm-rows')?.textContent ?? '').replace(/\u00a0/g, ' ').includes(%q)`, s)
	}
	e.step("sign in and open the live view", func() {
		e.do("open the UI", chromedp.Navigate(base+"/"))
		e.waitSel("#signin")
		e.fill("#token", token)
		e.click(chromedp.CSS("#signin button[type=submit]"))
		e.waitSel(`#sessions tr[data-session="live"]`)
		e.do("open #/live/live", chromedp.Navigate(base+"/#/live/live"))
		e.waitSel(`#timeline[data-connected="1"]`)
		e.waitSel(`#agent-terminal .xterm-rows`)
	})

	done := make(chan string, 1)
	e.step("the agent's command appears while it runs", func() {
		go func() {
			st, body := exec("echo agent-started; while [ ! -e release-me ]; do sleep 0.05; done; echo agent-finished")
			done <- fmt.Sprintf("%d %s", st, body)
		}()
		e.waitJS(`[...document.querySelectorAll('#timeline .tl-call')].some((li) => li.querySelector('.tl-out')?.textContent.includes('agent-started') && li.querySelector('.tl-end')?.textContent === 'running…')`)
		e.waitJS(termHas("agent-started"))
		e.check(eval[bool](e, termHas("while [ ! -e release-me ]")), "the shell view shows the agent's command line")
		e.shot("live-1-agent-running")
		// The agent writes a file (another call, another access path's
		// capability), which ends its own command.
		if st, body := agent("PUT", "/v1/sessions/live/files/release-me", "x"); st/100 != 2 {
			e.fail("write release-me: %d %s", st, body)
		}
		e.waitJS(termHas("agent-finished"))
		e.waitJS(`[...document.querySelectorAll('#timeline .tl-call')].some((li) => li.dataset.capability === 'write_file' && li.querySelector('.tl-input')?.textContent.includes('release-me'))`)
		r := <-done
		e.check(strings.HasPrefix(r, "200 ") && strings.Contains(r, "agent-finished"), "the agent's command: %s", r)
		e.waitJS(`[...document.querySelectorAll('#timeline .tl-end')].some((el) => el.textContent === 'ok · exit 0')`)
	})

	e.step("a person takes over and types into the agent's shell", func() {
		e.click(chromedp.CSS("#take-over"))
		e.waitJS(`document.querySelector('#hold-state')?.textContent.startsWith('you hold')`)
		st, body := exec("touch agent-was-here")
		e.check(st == http.StatusConflict || st == http.StatusTooManyRequests || st/100 == 4, "the agent's command while held: %d", st)
		e.check(strings.Contains(body, "a person holds this session") && strings.Contains(body, "hand it back"), "the refusal says why and what to do: %s", body)
		e.waitJS(`document.activeElement?.id === 'shell-line'`)
		e.fill("#shell-line", `echo "person-sees-$FOO"; ls agent-was-here 2>&1 | head -1`)
		e.press("\r")
		e.waitJS(termHas("person-sees-from-the-agent"))
		e.waitJS(termHas("No such file"))
		e.waitJS(`[...document.querySelectorAll('#timeline .tl-call')].at(-1)?.querySelector('.tl-end')?.textContent === 'ok · exit 0'`)
		e.waitJS(`document.querySelector('#shell-line')?.placeholder === 'a command for the shell'`)
		e.check(eval[bool](e, `[...document.querySelectorAll('#timeline .tl-path')].some((el) => el.textContent === 'person')`), "the timeline marks the person's call")
		e.shot("live-2-person-holds")
	})

	e.step("the person hands back and the agent's command runs", func() {
		e.click(chromedp.CSS("#hand-back"))
		e.waitJS(`document.querySelector('#hold-state')?.textContent === 'watching'`)
		st, body := exec("echo agent-again-$FOO")
		e.check(st == 200 && strings.Contains(body, "agent-again-from-the-agent"), "the agent's command after the hand back: %d %s", st, body)
		e.waitJS(termHas("agent-again-from-the-agent"))
		e.shot("live-3-handed-back")
	})

	// The session's page mounts the same live view. Opened after those
	// calls, it is sent the session's recent ones first (the server's
	// ring, marked replay); the agent's next command arrives live; a
	// person takes over there too. Its CPU meter shows the share of a
	// core in use now, from the cgroup's usage between two readings.
	sessTermHas := func(s string) string {
		return fmt.Sprintf(`(document.querySelector('#session-timeline #agent-terminal .xterm-rows')?.textContent ?? '').replace(/\u00a0/g, ' ').includes(%q)`, s)
	}
	e.step("the session page: the live view with what the agent already did", func() {
		e.do("open #/session/live", chromedp.Navigate(base+"/#/session/live"))
		e.waitSel(`#session-timeline #timeline[data-connected="1"]`)
		e.waitJS(`[...document.querySelectorAll('#session-timeline .tl-call[data-replay="1"]')].some((li) => li.querySelector('.tl-input')?.textContent === 'echo agent-again-$FOO' && li.querySelector('.tl-end')?.textContent === 'ok · exit 0')`)
		e.waitJS(sessTermHas("agent-again-from-the-agent"))
		e.check(eval[bool](e, `[...document.querySelectorAll('#session-timeline .tl-call[data-replay="1"]')].some((li) => li.querySelector('.tl-input')?.textContent === 'export FOO=from-the-agent')`),
			"the replay reaches back to the agent's first command")
		go func() {
			st, body := exec("echo cpu-busy; while [ ! -e stop-cpu ]; do :; done; echo cpu-done")
			done <- fmt.Sprintf("%d %s", st, body)
		}()
		e.waitJS(`[...document.querySelectorAll('#session-timeline .tl-call:not([data-replay])')].some((li) => li.querySelector('.tl-out')?.textContent.includes('cpu-busy'))`)
		// The busy loop shows in the CPU now (two readings apart).
		e.waitJS(`Number(document.querySelector('#budget-cpu')?.dataset.now || 0) > 1`)
		e.check(eval[bool](e, `document.querySelector('#budget-cpu .meter-label')?.textContent.includes('of a core now')`), "the CPU meter says the share of a core now")
		e.shot("session-live")
		if st, body := agent("PUT", "/v1/sessions/live/files/stop-cpu", "x"); st/100 != 2 {
			e.fail("write stop-cpu: %d %s", st, body)
		}
		r := <-done
		e.check(strings.HasPrefix(r, "200 ") && strings.Contains(r, "cpu-done"), "the agent's busy command: %s", r)
		e.waitJS(sessTermHas("cpu-done"))
		e.click(chromedp.CSS("#session-timeline #take-over"))
		e.waitJS(`document.querySelector('#session-timeline #hold-state')?.textContent.startsWith('you hold')`)
		st, body := exec("true")
		e.check(st/100 == 4 && strings.Contains(body, "a person holds this session"), "the agent's command while the page holds the shell: %d %s", st, body)
		e.click(chromedp.CSS("#session-timeline #hand-back"))
		e.waitJS(`document.querySelector('#session-timeline #hold-state')?.textContent === 'watching'`)
		st, body = exec("echo back-from-the-session-page")
		e.check(st == 200 && strings.Contains(body, "back-from-the-session-page"), "the agent after the hand back: %d %s", st, body)
	})

	e.step("nothing went wrong on the way", func() {
		mu.Lock()
		p := append([]string(nil), problems...)
		mu.Unlock()
		e.check(len(p) == 0, "%s", strings.Join(p, "\n"))
	})
}
