package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/chromedp/cdproto/browser"
	"github.com/chromedp/cdproto/input"
	cdplog "github.com/chromedp/cdproto/log"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"
)

// TestWebFiles drives the workspace browser (web/src/files.ts) in headless
// Chromium against a real quro serve: upload a binary file through the
// page's file input and download it through the page's button, both
// byte-exact; browse into a folder; preview text, an image and HTML (in
// the sandboxed frame); edit and save a file; download a folder as a
// .tar.gz and read it; follow a cut output's link from the playground;
// and no console error or page exception on the way.
func TestWebFiles(t *testing.T) {
	t.Parallel()
	srv, out := startWebTest(t)
	base := strings.TrimSuffix(srv.url, "/")
	auth := []string{"Authorization", "Bearer " + srv.token}
	call := func(method, path, body string) string {
		t.Helper()
		r := do(t, method, base+path, "application/json", body, auth...)
		if r.status >= 300 {
			t.Fatalf("%s %s: %d %s", method, path, r.status, r.body)
		}
		return r.body
	}
	var sess struct{ ID string }
	if err := json.Unmarshal([]byte(call("POST", "/v1/sessions", `{"name":"files"}`)), &sess); err != nil {
		t.Fatal(err)
	}
	sp := "/v1/sessions/" + sess.ID
	jpeg, _ := base64.StdEncoding.DecodeString(jpeg8x6)
	call("POST", sp+"/exec", `{"command":"mkdir -p d/sub && printf 'hello\\n' > d/note.txt && printf 'deep\\n' > d/sub/deep.txt && printf '<h1 id=t>framed</h1>' > d/page.html"}`)
	if r := do(t, "PUT", base+sp+"/files/d/pic.jpg", "application/octet-stream", string(jpeg), auth...); r.status != 200 {
		t.Fatalf("put the picture: %d %s", r.status, r.body)
	}

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
	downloads := make(chan string, 4) // the suggested names of completed downloads
	guids := map[string]string{}
	dir := t.TempDir()
	err := chromedp.Listen(e.ctx, func(ev any) {
		switch ev := ev.(type) {
		case *runtime.EventExceptionThrown:
			problem("page error: %s %v", ev.ExceptionDetails.Text, ev.ExceptionDetails.Exception)
		case *runtime.EventConsoleAPICalled:
			if ev.Type == "error" {
				problem("console error: %v", ev.Args)
			}
		case *cdplog.EventEntryAdded:
			if ev.Entry.Level == cdplog.EntryLevelError && !strings.HasSuffix(ev.Entry.URL, "/frame.html") {
				problem("console: %s %s", ev.Entry.URL, ev.Entry.Text)
			}
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	err = chromedp.ListenBrowser(e.ctx, func(ev any) {
		switch ev := ev.(type) {
		case *browser.EventDownloadWillBegin:
			mu.Lock()
			guids[ev.GUID] = ev.SuggestedFilename
			mu.Unlock()
		case *browser.EventDownloadProgress:
			if ev.State == browser.DownloadProgressStateCompleted {
				mu.Lock()
				name := guids[ev.GUID]
				mu.Unlock()
				downloads <- name
			}
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := chromedp.CallBrowser(e.ctx, browser.SetDownloadBehavior, browser.SetDownloadBehaviorParams{
		Behavior: browser.SetDownloadBehaviorBehaviorAllow, DownloadPath: dir, EventsEnabled: new(true),
		BrowserContextID: e.bcid, // the events are of this test's downloads only
	}); err != nil {
		t.Fatalf("allow downloads: %v", err)
	}
	// awaitDownload waits for the next completed download and returns its bytes.
	awaitDownload := func(want string) []byte {
		select {
		case name := <-downloads:
			e.check(name == want, "downloaded %q, want %q", name, want)
			b, err := os.ReadFile(filepath.Join(dir, name))
			e.check(err == nil, "read the download: %v", err)
			return b
		case <-e.sctx.Done():
			e.fail("no download of %s completed", want)
		}
		return nil
	}
	e.do("set the viewport", chromedp.EmulateViewport(1280, 800))

	e.step("sign in and open the files of a session", func() {
		e.do("open /", chromedp.Navigate(base+"/"))
		e.waitSel("#signin")
		e.fill("#token", srv.token)
		e.click(chromedp.CSS("#signin button[type=submit]"))
		e.waitSel(`#sessions tr[data-session="default"]`)
		e.do("open the files", chromedp.Navigate(base+"/#/files/"+sess.ID))
		e.waitJS(`document.querySelector('#files-tree [data-path="d"]') !== null`)
	})

	blob := make([]byte, 5<<20+777) // past one transfer chunk (4 MiB)
	rand.Read(blob)
	e.step("upload a binary file through the page, byte-exact", func() {
		local := filepath.Join(dir, "up.bin")
		e.check(os.WriteFile(local, blob, 0o644) == nil, "write the local file")
		e.do("choose the file", chromedp.SetUploadFiles(chromedp.CSS("#files-upload"), []string{local}))
		e.waitJS(`document.querySelector('#files-status')?.textContent === 'uploaded /home/user/up.bin'`)
		e.waitJS(`document.querySelector('#files-tree [data-path="up.bin"]') !== null`)
		r, err := http.NewRequest("GET", base+sp+"/download/up.bin", nil)
		e.check(err == nil, "request: %v", err)
		r.Header.Set(auth[0], auth[1])
		resp, err := http.DefaultClient.Do(r)
		e.check(err == nil, "download: %v", err)
		got, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		e.check(bytes.Equal(got, blob), "the server holds %d bytes, equal %v", len(got), bytes.Equal(got, blob))
	})

	e.step("drop a file on the page", func() {
		// A drop as the browser makes it: a DragEvent whose DataTransfer
		// holds a File (bytes 0..255), on the drop zone.
		e.do("drop", chromedp.Evaluate[chromedp.Void](`(() => {
			const dt = new DataTransfer();
			dt.items.add(new File([Uint8Array.from({ length: 256 }, (_, i) => i)], 'dropped.bin'));
			document.querySelector('#files-drop').dispatchEvent(new DragEvent('drop', { dataTransfer: dt, bubbles: true, cancelable: true }));
		})()`))
		e.waitJS(`document.querySelector('#files-status')?.textContent === 'uploaded /home/user/dropped.bin'`)
		// The page lists the directory again after an upload: until the
		// new row is drawn, a click meant for a row of the old tree can
		// land on the row that takes its place (dropped.bin sorts before
		// up.bin), or on a row that is then replaced.
		e.waitJS(`document.querySelector('#files-tree [data-path="dropped.bin"]') !== null`)
		r := do(t, "GET", base+sp+"/download/dropped.bin", "", "", auth...)
		want := make([]byte, 256)
		for i := range want {
			want[i] = byte(i)
		}
		e.check(r.status == 200 && r.body == string(want), "the dropped file: %d, %d bytes", r.status, len(r.body))
	})

	e.step("download it through the page, byte-exact", func() {
		e.click(chromedp.CSS(`#files-tree [data-path="up.bin"]`))
		e.waitSel("#files-download")
		e.click(chromedp.CSS("#files-download"))
		got := awaitDownload("up.bin")
		e.check(bytes.Equal(got, blob), "downloaded %d bytes, equal %v", len(got), bytes.Equal(got, blob))
	})

	e.step("browse, preview an image and HTML", func() {
		e.click(chromedp.CSS(`#files-tree [data-path="d"]`))
		e.waitJS(`document.querySelector('#files-tree [data-path="d/sub"]') !== null`)
		e.check(eval[string](e, `document.querySelector('#files-tree [data-path="d/note.txt"]').closest('.files-row').querySelector('.files-size').textContent`) == "6 B", "the size of d/note.txt")
		e.click(chromedp.CSS(`#files-tree [data-path="d/pic.jpg"]`))
		e.waitJS(`document.querySelector('#files-image')?.complete && document.querySelector('#files-image').naturalWidth === 8`)
		e.click(chromedp.CSS(`#files-tree [data-path="d/page.html"]`))
		e.waitJS(`document.querySelector('#files-html')?.getAttribute('sandbox') === 'allow-scripts'`)
		e.shot("files-1-browse")
	})

	e.step("edit and save a file", func() {
		e.click(chromedp.CSS(`#files-tree [data-path="d/note.txt"]`))
		e.waitJS(`document.querySelector('#files-open')?.textContent === '/home/user/d/note.txt' && document.querySelector('#files-text .cm-content')?.innerText.trim() === 'hello'`)
		e.fillEditor("#files-text", "edited in the browser\n")
		// The save lists the tree again: the open folder d stays open,
		// its rows and the root's are kept, and note.txt's size is
		// rewritten in its row.
		note := `#files-tree .files-row:has([data-path="d/note.txt"])`
		nodes := map[string]string{"folder d": `#files-tree .files-entry:has(> .files-row [data-path="d"])`, "d/note.txt": note, "its name": note + " .files-name", "up.bin": `#files-tree [data-path="up.bin"]`}
		e.mark(nodes)
		e.click(chromedp.CSS("#files-save"))
		e.waitJS(`document.querySelector('#files-status')?.textContent === 'saved /home/user/d/note.txt'`)
		// (or until the row has gone, as a rebuilt tree with d closed has it)
		e.waitJS(`document.querySelector('` + note + `')?.querySelector('.files-size').textContent !== '6 B'`)
		e.kept(nodes)
		e.check(eval[string](e, `document.querySelector('`+note+` .files-size').textContent`) == "22 B", "note.txt's size after the save")
		var c struct{ Content string }
		_ = json.Unmarshal([]byte(call("GET", sp+"/files/d/note.txt", "")), &c)
		e.check(c.Content == "edited in the browser\n", "the saved file holds %q", c.Content)
		e.shot("files-2-edit")
	})

	e.step("download a folder as a .tar.gz", func() {
		e.click(chromedp.CSS(`#files-tree [data-path="d"] ~ .files-dl, #files-tree .files-row:has([data-path="d"]) .files-dl`))
		got := awaitDownload("d.tar.gz")
		files := map[string]string{}
		zr, err := gzip.NewReader(bytes.NewReader(got))
		e.check(err == nil, "not gzip: %v", err)
		tr := tar.NewReader(zr)
		for {
			h, err := tr.Next()
			if errors.Is(err, io.EOF) {
				break
			}
			e.check(err == nil, "the archive: %v", err)
			b, _ := io.ReadAll(tr)
			files[h.Name] = string(b)
		}
		e.check(files["d/note.txt"] == "edited in the browser\n" && files["d/sub/deep.txt"] == "deep\n" && files["d/pic.jpg"] == string(jpeg),
			"the archive holds %d entries: %v", len(files), keys(files))
	})

	e.step("a cut output links to its file", func() {
		e.do("open the playground", chromedp.Navigate(base+"/#/play/"+sess.ID))
		e.waitJS(`document.querySelector('#play-session')?.value === ` + fmt.Sprintf("%q", sess.ID))
		e.selectOption("#play-lang", "value", "sh")
		e.fillEditor("#play-code", "seq 1 20000") // past the kept 32 KiB: cut, saved whole
		e.click(chromedp.CSS("#play-run"))
		e.waitSel("#play-summary a.play-full")
		href := eval[string](e, `document.querySelector('#play-summary a.play-full').getAttribute('href')`)
		e.check(strings.HasPrefix(href, "#/files/"+sess.ID+"/.quro/outputs/"), "the link is %q", href)
		e.click(chromedp.CSS("#play-summary a.play-full"))
		e.waitJS(`document.querySelector('#files-open')?.textContent.startsWith('/home/user/.quro/outputs/')`)
	})

	e.step("playground: two cells share the session's state", func() {
		e.do("open the playground", chromedp.Navigate(base+"/#/play/"+sess.ID))
		e.waitJS(`document.querySelector('#play-session')?.value === ` + fmt.Sprintf("%q", sess.ID) + ` && document.querySelector('#play-lang')?.value === 'python'`)
		e.fillEditor("#play-code", "x = 41")
		e.click(chromedp.CSS("#play-run"))
		e.waitJS(`/exit 0/.test(document.querySelector('#play-summary')?.textContent ?? '')`)
		// The history's runs are kept as the next run is added: the
		// buttons of the runs before it stay as they are.
		e.waitJS(`Array.from(document.querySelectorAll('#play-history button')).map((b) => b.title).join('|') === 'x = 41|seq 1 20000'`)
		runs := map[string]string{"the run x = 41": `#play-history button[title="x = 41"]`, "the run seq": `#play-history button[title="seq 1 20000"]`, "the heading": "#play-history h2"}
		e.mark(runs)
		e.click(chromedp.CSS("#play-add"))
		e.waitSel(".cell:nth-child(2) .editor")
		e.fillEditor(".cell:nth-child(2) .editor", "print(x + 1)")
		e.click(chromedp.CSS(".cell:nth-child(2) .play-run"))
		// The virtualised output may draw its lines a moment after the
		// summary says exit 0: wait for both.
		e.waitJS(`/exit 0/.test(document.querySelector('.cell:nth-child(2) .summary')?.textContent ?? '') &&
			(document.querySelector('.cell:nth-child(2) .vout')?.textContent ?? '').trim() !== ''`)
		got := eval[string](e, `document.querySelector('.cell:nth-child(2) .vout').textContent`)
		e.check(strings.TrimSpace(got) == "42", "the second cell printed %q, want 42", got)
		e.waitJS(`document.querySelector('#play-history button')?.title === 'print(x + 1)'`)
		e.kept(runs)
		e.shot("play-1-cells")
	})

	e.step("playground: the run history survives a reload", func() {
		e.do("reload", chromedp.Reload())
		e.waitJS(`Array.from(document.querySelectorAll('#play-history button')).map((b) => b.title).join('|') === 'print(x + 1)|x = 41|seq 1 20000'`) // latest first
		e.click(chromedp.CSS("#play-history button"))
		e.waitJS(`document.querySelectorAll('.cell').length === 2 && document.querySelector('.cell:nth-child(2) .cm-content').innerText.trim() === 'print(x + 1)'`)
	})

	e.step("playground: 100k lines of output settle", func() {
		e.fillEditor("#play-code", "for i in range(100000):\n    print(i)")
		e.do("listen for the settled output", chromedp.Evaluate[chromedp.Void](`window.__settled = null; document.addEventListener('quro-settled', (ev) => { window.__settled = ev.detail; }, { once: true })`))
		e.click(chromedp.CSS("#play-run"))
		e.waitJS(`window.__settled !== null`)
		lines := eval[int](e, `window.__settled.lines`)
		ms := eval[int](e, `window.__settled.ms`)
		rows := eval[int](e, `document.querySelectorAll('#play-output .vrow').length`)
		t.Logf("     %d lines settled %d ms after the click (run included), %d rows in the DOM", lines, ms, rows)
		e.check(lines >= 100000, "the view holds %d lines, want 100000", lines)
		e.check(rows < 1000, "%d rows in the DOM: the view is not virtualised", rows)
		last := eval[string](e, `Array.from(document.querySelectorAll('#play-output .vrow')).pop()?.textContent ?? ''`)
		e.check(strings.TrimSpace(last) == "99999", "the view follows the end: its last row is %q", last)
		e.shot("play-2-100k")
	})

	e.step("nothing went wrong on the way", func() {
		mu.Lock()
		defer mu.Unlock()
		e.check(len(problems) == 0, "%s", strings.Join(problems, "\n"))
	})
}

func keys(m map[string]string) []string {
	var k []string
	for n := range m {
		k = append(k, n)
	}
	return k
}

// fillEditor replaces the text of the CodeMirror editor in sel as a
// person would: focus it, select all (Ctrl+A), and type the value over it
// in one input (as a paste).
func (e *e2e) fillEditor(sel, value string) {
	content := sel + " .cm-content"
	e.do("focus "+content, chromedp.Focus(chromedp.CSS(content)))
	for _, t := range []input.DispatchKeyEventType{input.DispatchKeyEventTypeRawKeyDown, input.DispatchKeyEventTypeKeyUp} {
		if _, err := chromedp.Call(e.sctx, input.DispatchKeyEvent, input.DispatchKeyEventParams{
			Type: t, Modifiers: 2, Key: "a", Code: "KeyA", WindowsVirtualKeyCode: 65,
		}); err != nil {
			e.fail("select all in %s: %v", sel, err)
		}
	}
	if _, err := chromedp.Call(e.sctx, input.InsertText, input.InsertTextParams{Text: value}); err != nil {
		e.fail("type into %s: %v", sel, err)
	}
	// The editor draws lines as elements (a blank one as a <br>): its
	// text is compared without the whitespace that drawing changes.
	want, _ := json.Marshal(strings.Join(strings.Fields(value), ""))
	e.waitJS(fmt.Sprintf(`document.querySelector(%q)?.innerText.replace(/\s+/g, '') === %s`, content, want))
}
