package e2b_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"github.com/quro-dev/quro/internal/session"
	"io"
	"maps"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/quro-dev/quro/internal/api/e2b/gen/process"
	"github.com/quro-dev/quro/internal/app"
	"github.com/quro-dev/quro/internal/capability"
	"github.com/quro-dev/quro/internal/controller"
)

// The control plane over real HTTP: status codes, field names and the
// semantics the SDKs rely on (sdk src/sandbox/sandboxApi.ts).

type answer struct {
	status int
	header http.Header
	body   []byte
}

func (a answer) json(t *testing.T, v any) {
	t.Helper()
	if err := json.Unmarshal(a.body, v); err != nil {
		t.Fatalf("%d %s: %v", a.status, a.body, err)
	}
}

// api calls the control plane with key (X-API-KEY) and a JSON body (nil:
// none).
func (e *env) api(t *testing.T, key, method, path string, body any) answer {
	t.Helper()
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			t.Fatal(err)
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, e.URL+"/e2b"+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("X-API-KEY", key)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return answer{resp.StatusCode, resp.Header, b}
}

// want checks the status and, for an error, E2B's {code, message} with
// message containing sub.
func (a answer) want(t *testing.T, status int, sub string) {
	t.Helper()
	if a.status != status {
		t.Fatalf("status %d, want %d: %s", a.status, status, a.body)
	}
	if status >= 400 {
		var eb struct {
			Code    int    `json:"code"`
			Message string `json:"message"`
		}
		a.json(t, &eb)
		if eb.Code != status || !strings.Contains(eb.Message, sub) {
			t.Fatalf("error %+v, want code %d and %q", eb, status, sub)
		}
		if status == http.StatusNotImplemented && !strings.Contains(eb.Message, "not supported by Quro test") {
			t.Fatalf("unsupported without Quro's version: %+v", eb)
		}
	}
}

type sandboxAnswer struct {
	SandboxID          string  `json:"sandboxID"`
	TemplateID         string  `json:"templateID"`
	ClientID           string  `json:"clientID"`
	EnvdVersion        string  `json:"envdVersion"`
	EnvdAccessToken    string  `json:"envdAccessToken"`
	TrafficAccessToken string  `json:"trafficAccessToken"`
	Domain             *string `json:"domain"`
}

type listed struct {
	SandboxID   string            `json:"sandboxID"`
	TemplateID  string            `json:"templateID"`
	ClientID    string            `json:"clientID"`
	Metadata    map[string]string `json:"metadata"`
	StartedAt   time.Time         `json:"startedAt"`
	EndAt       time.Time         `json:"endAt"`
	State       string            `json:"state"`
	CPUCount    int               `json:"cpuCount"`
	MemoryMB    *int              `json:"memoryMB"`
	DiskSizeMB  *int              `json:"diskSizeMB"`
	EnvdVersion string            `json:"envdVersion"`
}

type detail struct {
	listed
	EnvdAccessToken string `json:"envdAccessToken"`
	Lifecycle       struct {
		OnTimeout  string `json:"onTimeout"`
		AutoResume bool   `json:"autoResume"`
	} `json:"lifecycle"`
}

var semver = regexp.MustCompile(`^\d+\.\d+\.\d+$`)

func (e *env) create(t *testing.T, body map[string]any) sandboxAnswer {
	t.Helper()
	a := e.api(t, e.Key, "POST", "/v2/sandboxes", body)
	a.want(t, http.StatusCreated, "")
	var sb sandboxAnswer
	a.json(t, &sb)
	return sb
}

func (e *env) info(t *testing.T, id string) detail {
	t.Helper()
	a := e.api(t, e.Key, "GET", "/sandboxes/"+id, nil)
	a.want(t, http.StatusOK, "")
	var d detail
	a.json(t, &d)
	return d
}

// otherKey is an API key of another tenant, with every scope the first has.
func (e *env) otherKey(t *testing.T) string {
	t.Helper()
	tok, err := e.App.CreateToken(context.Background(), "cli", "t2", []string{"read", "exec"}, "intruder")
	if err != nil {
		t.Fatal(err)
	}
	return tok.E2BKey
}

func TestControlCreateInfoKill(t *testing.T) {
	e := newEnv(t, nil)
	before := time.Now()
	sb := e.create(t, map[string]any{"templateID": "base", "timeout": 600,
		"metadata": map[string]string{"user": "ada"}, "envVars": map[string]string{"GREETING": "hi"}})
	created := time.Now()
	if !regexp.MustCompile(`^[0-9a-f]{32}$`).MatchString(sb.SandboxID) || !semver.MatchString(sb.EnvdVersion) ||
		sb.EnvdAccessToken != e.accessToken(sb.SandboxID) || sb.TrafficAccessToken != sb.EnvdAccessToken ||
		sb.ClientID == "" || sb.TemplateID != "base" || sb.Domain != nil {
		t.Fatalf("create: %+v", sb)
	}
	d := e.info(t, sb.SandboxID)
	if d.SandboxID != sb.SandboxID || d.State != "running" || d.Metadata["user"] != "ada" || d.TemplateID != "base" ||
		d.EnvdAccessToken != sb.EnvdAccessToken || d.Lifecycle.OnTimeout != "kill" || !semver.MatchString(d.EnvdVersion) ||
		d.CPUCount < 1 || d.MemoryMB == nil || d.DiskSizeMB == nil {
		t.Fatalf("info: %+v", d)
	}
	if d.StartedAt.Before(before.Truncate(time.Millisecond)) || d.StartedAt.After(created) {
		t.Fatalf("startedAt %v, not between %v and %v (the create's request and answer)", d.StartedAt, before, created)
	}
	wantEndAt(t, "create", d.EndAt, before, created, 600)
	// The session has the sandbox's variables.
	reply, err := e.App.Controller.Call(context.Background(), controller.Caller{Path: "test", Tenant: e.Tenant, Scope: capability.ScopeRead},
		"get_session_env", json.RawMessage(`{"session":"`+sb.SandboxID+`"}`))
	if err != nil || reply.Output.(*app.EnvOutput).Env["GREETING"] != "hi" {
		t.Fatalf("env: %+v %v", reply, err)
	}
	// v1 create (SDK ≤ 2.45) answers the same shape.
	v1 := e.api(t, e.Key, "POST", "/sandboxes", map[string]any{"templateID": "code-interpreter-v1", "timeout": 60, "secure": true})
	v1.want(t, http.StatusCreated, "")
	var sb1 sandboxAnswer
	v1.json(t, &sb1)
	if sb1.EnvdAccessToken != e.accessToken(sb1.SandboxID) || !semver.MatchString(sb1.EnvdVersion) {
		t.Fatalf("v1 create: %+v", sb1)
	}

	// Kill: 204, then 404 as E2B's JSON (the SDK's kill returns false).
	e.api(t, e.Key, "DELETE", "/sandboxes/"+sb.SandboxID, nil).want(t, http.StatusNoContent, "")
	e.api(t, e.Key, "DELETE", "/sandboxes/"+sb.SandboxID, nil).want(t, http.StatusNotFound, "not found")
	e.api(t, e.Key, "GET", "/sandboxes/"+sb.SandboxID, nil).want(t, http.StatusNotFound, "not found")
	// An id is an id: a session's name, even the default one's, names no
	// sandbox (the tenant has a default session now).
	if _, err := e.App.Controller.Call(context.Background(), controller.Caller{Path: "test", Tenant: e.Tenant, Scope: capability.ScopeRead},
		"get_session_status", json.RawMessage(`{}`)); err != nil {
		t.Fatal(err)
	}
	e.api(t, e.Key, "GET", "/sandboxes/default", nil).want(t, http.StatusNotFound, "32 hex digits")
	e.api(t, e.Key, "DELETE", "/sandboxes/default", nil).want(t, http.StatusNotFound, "32 hex digits")
}

func TestControlCreateRefusals(t *testing.T) {
	e := newEnv(t, nil)
	count := func() int {
		a := e.api(t, e.Key, "GET", "/v2/sandboxes", nil)
		a.want(t, http.StatusOK, "")
		var l []listed
		a.json(t, &l)
		return len(l)
	}
	n := count()
	many := map[string]string{}
	for i := range 65 {
		many[fmt.Sprint("k", i)] = "v"
	}
	for _, tc := range []struct {
		body   map[string]any
		status int
		sub    string
	}{
		{map[string]any{"templateID": "no-such-template"}, 400, `template "no-such-template"`},
		{map[string]any{}, 400, "templateID is required"},
		{map[string]any{"templateID": "base", "metadata": many}, 400, "at most 64"},
		{map[string]any{"templateID": "base", "envVars": map[string]string{"LD_PRELOAD": "/tmp/x.so"}}, 400, "LD_PRELOAD"},
		{map[string]any{"templateID": "base", "timeout": 0}, 400, "timeout"},
		{map[string]any{"templateID": "base", "network": map[string]any{"rules": map[string]any{"x.test": []any{}}}}, 501, "network.rules"},
		{map[string]any{"templateID": "base", "network": map[string]any{"denyOut": []string{"not a rule!"}}}, 400, "not a rule!"},
		{map[string]any{"templateID": "base", "volumeMounts": []any{map[string]string{"name": "v", "path": "/data"}}}, 501, "volumes"},
	} {
		e.api(t, e.Key, "POST", "/v2/sandboxes", tc.body).want(t, tc.status, tc.sub)
	}
	a := e.api(t, e.Key, "POST", "/v2/sandboxes", nil)
	a.want(t, 400, "templateID")
	req, _ := http.NewRequest("POST", e.URL+"/e2b/v2/sandboxes", strings.NewReader("{not json"))
	req.Header.Set("X-API-KEY", e.Key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 400 {
		t.Fatalf("bad JSON: %d", resp.StatusCode)
	}
	if got := count(); got != n {
		t.Fatalf("refused creates made sandboxes: %d → %d", n, got)
	}
}

// E2B's API only records a create's mcp servers: the SDK starts the
// gateway itself, in the box. Quro takes the field as E2B does.
func TestCreateTakesMCPConfig(t *testing.T) {
	e := newEnv(t, nil)
	sb := e.create(t, map[string]any{"templateID": "base", "mcp": map[string]any{"invalid_server": map[string]any{}}})
	if !regexp.MustCompile(`^[0-9a-f]{32}$`).MatchString(sb.SandboxID) {
		t.Fatalf("create with mcp: %+v", sb)
	}
}

// sdkMetadata is the metadata query parameter as the JS SDK builds it:
// URLSearchParams of encodeURIComponent'd keys and values.
func sdkMetadata(md map[string]string) string {
	v := url.Values{}
	for k, val := range md {
		v.Set(url.PathEscape(k), url.PathEscape(val))
	}
	return url.QueryEscape(v.Encode())
}

func TestControlListFiltersAndPages(t *testing.T) {
	e := newEnv(t, nil)
	var group []string
	for i := range 3 {
		group = append(group, e.create(t, map[string]any{"templateID": "base", "timeout": 600,
			"metadata": map[string]string{"group": "a b=c", "n": fmt.Sprint(i)}}).SandboxID)
	}
	other := e.create(t, map[string]any{"templateID": "base", "timeout": 600, "metadata": map[string]string{"group": "z"}}).SandboxID

	list := func(q string) ([]listed, answer) {
		a := e.api(t, e.Key, "GET", "/v2/sandboxes"+q, nil)
		a.want(t, http.StatusOK, "")
		var l []listed
		a.json(t, &l)
		return l, a
	}
	l, a := list("?metadata=" + sdkMetadata(map[string]string{"group": "a b=c"}))
	if len(l) != 3 || a.header.Get("X-Next-Token") != "" {
		t.Fatalf("metadata filter: %+v (next %q)", l, a.header.Get("X-Next-Token"))
	}
	for _, x := range l {
		if x.Metadata["group"] != "a b=c" || x.State != "running" || x.ClientID == "" || x.EnvdVersion == "" || x.StartedAt.IsZero() {
			t.Fatalf("listed: %+v", x)
		}
	}
	if l, _ := list("?metadata=" + sdkMetadata(map[string]string{"group": "a b=c", "n": "1"})); len(l) != 1 || l[0].SandboxID != group[1] {
		t.Fatalf("two pairs: %+v", l)
	}
	if l, _ := list("?state=paused"); len(l) != 0 {
		t.Fatalf("paused: %+v", l)
	}
	if l, _ := list("?state=running,paused&metadata=" + sdkMetadata(map[string]string{"group": "z"})); len(l) != 1 || l[0].SandboxID != other {
		t.Fatalf("state and metadata: %+v", l)
	}
	e.api(t, e.Key, "GET", "/v2/sandboxes?state=sleeping", nil).want(t, 400, "running or paused")
	e.api(t, e.Key, "GET", "/v2/sandboxes?limit=0", nil).want(t, 400, "limit")
	e.api(t, e.Key, "GET", "/v2/sandboxes?nextToken=garbage", nil).want(t, 400, "nextToken")

	// Pages of 2, oldest first: every sandbox once, X-Next-Token until the last page.
	seen := map[string]bool{}
	next, pages := "", 0
	for {
		q := "?order=asc&limit=2"
		if next != "" {
			q += "&nextToken=" + url.QueryEscape(next)
		}
		l, a := list(q)
		pages++
		for _, x := range l {
			if seen[x.SandboxID] {
				t.Fatalf("%s on two pages", x.SandboxID)
			}
			seen[x.SandboxID] = true
		}
		if next = a.header.Get("X-Next-Token"); next == "" {
			break
		}
		if len(l) != 2 || pages > 10 {
			t.Fatalf("page %d: %d items, next %q", pages, len(l), next)
		}
	}
	for _, id := range append(group, other) {
		if !seen[id] {
			t.Fatalf("%s on no page (%d pages)", id, pages)
		}
	}
	// The default order, newest first, one a page, filtered: each once, and
	// no X-Next-Token with the last.
	seen = map[string]bool{}
	next, pages = "", 0
	for {
		q := "?limit=1&state=running&metadata=" + sdkMetadata(map[string]string{"group": "a b=c"})
		if next != "" {
			q += "&nextToken=" + url.QueryEscape(next)
		}
		l, a := list(q)
		pages++
		if len(l) != 1 || seen[l[0].SandboxID] || pages > 3 {
			t.Fatalf("page %d: %+v (seen %v)", pages, l, seen)
		}
		seen[l[0].SandboxID] = true
		if want := group[3-pages]; l[0].SandboxID != want {
			t.Fatalf("page %d: %s, want %s (newest first)", pages, l[0].SandboxID, want)
		}
		if next = a.header.Get("X-Next-Token"); next == "" {
			break
		}
	}
	if pages != 3 {
		t.Fatalf("%d pages of the 3 sandboxes", pages)
	}
	// startedAfter is inclusive.
	first := e.info(t, group[0])
	if l, _ := list("?startedAfter=" + url.QueryEscape(first.StartedAt.Format(time.RFC3339Nano)) + "&metadata=" + sdkMetadata(map[string]string{"n": "0"})); len(l) != 1 {
		t.Fatalf("startedAfter its own start: %+v", l)
	}
	if l, _ := list("?startedAfter=" + url.QueryEscape(first.StartedAt.Add(time.Second).Format(time.RFC3339Nano)) + "&metadata=" + sdkMetadata(map[string]string{"n": "0"})); len(l) != 0 {
		t.Fatalf("startedAfter a second after its start: %+v", l)
	}
	// v1 lists the running sandboxes.
	a = e.api(t, e.Key, "GET", "/sandboxes", nil)
	a.want(t, 200, "")
	var v1 []listed
	a.json(t, &v1)
	if len(v1) < 4 {
		t.Fatalf("v1 list: %+v", v1)
	}
}

// The v1 list (GET /sandboxes) answers every running sandbox, as E2B's:
// it has no pages (no limit, no X-Next-Token), so none may be left out.
func TestControlV1ListIsWhole(t *testing.T) {
	// A tenant may hold more sessions than a page when its limit is raised.
	e := newEnv(t, &app.Options{Limits: app.Limits{SessionsPerTenant: 200}})
	const page = 100 // a v2 page at most (listLimit)
	want := map[string]bool{}
	for range page + 5 {
		want[e.create(t, map[string]any{"templateID": "base", "timeout": 600}).SandboxID] = true
	}
	a := e.api(t, e.Key, "GET", "/sandboxes", nil)
	a.want(t, http.StatusOK, "")
	var l []listed
	a.json(t, &l)
	for _, x := range l {
		delete(want, x.SandboxID)
	}
	if len(want) > 0 || len(l) != page+5 {
		t.Fatalf("the v1 list has %d sandboxes; %d running ones are missing", len(l), len(want))
	}
	if n := a.header.Get("X-Total-Running"); n != fmt.Sprint(page+5) {
		t.Fatalf("X-Total-Running %q", n)
	}
	// v2 still pages.
	a = e.api(t, e.Key, "GET", "/v2/sandboxes", nil)
	a.json(t, &l)
	if len(l) != page || a.header.Get("X-Next-Token") == "" {
		t.Fatalf("v2 first page: %d sandboxes, next token %q", len(l), a.header.Get("X-Next-Token"))
	}
}

// supervise runs the App's patrols (session lifetimes among them) as
// quro serve does, until the test ends.
func (e *env) supervise(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go e.App.Supervise(ctx, time.Minute)
}

// wantEndAt checks that endAt is seconds after a moment between asked and
// answered (taken just before the request that set the lifetime and just
// after its answer): an ordering, true however slow the machine is. The
// server keeps times in milliseconds.
func wantEndAt(t *testing.T, what string, endAt, asked, answered time.Time, seconds int64) {
	t.Helper()
	d := time.Duration(seconds) * time.Second
	if endAt.Before(asked.Add(d).Truncate(time.Millisecond)) || endAt.After(answered.Add(d)) {
		t.Fatalf("%s: endAt %v, want %d s after a moment between %v and %v", what, endAt, seconds, asked, answered)
	}
}

// waitFor polls cond until it holds; the deadline is a guard against a
// hang, not a measurement.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute) // generous: the machine may be busy
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not after a minute", what)
		}
		time.Sleep(10 * time.Millisecond) // a poll interval, not a wait for something to settle
	}
}

func TestControlTimeouts(t *testing.T) {
	e := newEnv(t, nil)
	e.supervise(t)
	// A sandbox whose timeout passes is killed: the API then answers 404.
	short := e.create(t, map[string]any{"templateID": "base", "timeout": 1}).SandboxID
	// (Created with 600 s, not 1: at load, more than a second could pass
	// before the setTimeout below, and the sandbox was killed first.)
	long := e.create(t, map[string]any{"templateID": "base", "timeout": 600}).SandboxID
	// setTimeout extends (and may shorten) from now.
	asked := time.Now()
	e.api(t, e.Key, "POST", "/sandboxes/"+long+"/timeout", map[string]any{"timeout": 3600}).want(t, http.StatusNoContent, "")
	answered := time.Now()
	waitFor(t, "the timed-out sandbox killed", func() bool {
		return e.api(t, e.Key, "GET", "/sandboxes/"+short, nil).status == http.StatusNotFound
	})
	d := e.info(t, long)
	wantEndAt(t, "setTimeout 3600", d.EndAt, asked, answered, 3600)
	// connect and refreshes never shorten a lifetime.
	a := e.api(t, e.Key, "POST", "/v2/sandboxes/"+long+"/connect", map[string]any{"timeout": 10})
	a.want(t, http.StatusOK, "")
	var sb sandboxAnswer
	a.json(t, &sb)
	if sb.SandboxID != long || sb.EnvdAccessToken != e.accessToken(long) || !semver.MatchString(sb.EnvdVersion) {
		t.Fatalf("connect: %+v", sb)
	}
	e.api(t, e.Key, "POST", "/sandboxes/"+long+"/refreshes", map[string]any{"duration": 5}).want(t, http.StatusNoContent, "")
	if d2 := e.info(t, long); !d2.EndAt.Equal(d.EndAt) {
		t.Fatalf("connect/refresh shortened the lifetime: %v → %v", d.EndAt, d2.EndAt)
	}
	// ...but extend one that ends sooner.
	e.api(t, e.Key, "POST", "/sandboxes/"+long+"/timeout", map[string]any{"timeout": 30}).want(t, http.StatusNoContent, "")
	asked = time.Now()
	e.api(t, e.Key, "POST", "/sandboxes/"+long+"/connect", map[string]any{"timeout": 900}).want(t, http.StatusOK, "")
	answered = time.Now()
	wantEndAt(t, "connect extending the lifetime", e.info(t, long).EndAt, asked, answered, 900)
	e.api(t, e.Key, "POST", "/sandboxes/"+long+"/timeout", map[string]any{"timeout": -1}).want(t, 400, "timeout_s")
	e.api(t, e.Key, "POST", "/sandboxes/"+long+"/timeout", nil).want(t, 400, "timeout")
	// The killed sandbox is 404: "not found" once its record is gone, or
	// "was destroyed" while its destroy is still ending it (the GET above
	// can see the first before this call meets the second).
	if r := e.api(t, e.Key, "POST", "/sandboxes/"+short+"/timeout", map[string]any{"timeout": 60}); !strings.Contains(string(r.body), "was destroyed") {
		r.want(t, 404, "not found")
	} else {
		r.want(t, 404, "was destroyed")
	}
}

func TestControlPauseConnect(t *testing.T) {
	e := newEnv(t, nil)
	e.supervise(t)
	id := e.create(t, map[string]any{"templateID": "base", "timeout": 600, "autoPause": true}).SandboxID
	if d := e.info(t, id); d.Lifecycle.OnTimeout != "pause" {
		t.Fatalf("lifecycle %+v", d.Lifecycle)
	}
	// A box with a shell in it, so there is something to freeze.
	if _, err := e.App.Controller.Call(context.Background(), controller.Caller{Path: "test", Tenant: e.Tenant, Scope: capability.ScopeExec},
		"terminal_exec", json.RawMessage(`{"session":"`+id+`","command":"X=kept"}`)); err != nil {
		t.Fatal(err)
	}
	if bx := e.App.Sandbox.Box(id); bx == nil || !bx.CanPause() {
		t.Skip("this machine cannot freeze a box")
	}
	// The timeout with autoPause pauses it.
	e.api(t, e.Key, "POST", "/sandboxes/"+id+"/timeout", map[string]any{"timeout": 1}).want(t, http.StatusNoContent, "")
	waitFor(t, "the sandbox paused at its timeout", func() bool {
		d := e.info(t, id)
		return d.State == "paused" && d.EndAt.Year() == 9999
	})
	a := e.api(t, e.Key, "GET", "/v2/sandboxes?state=paused", nil)
	var l []listed
	a.json(t, &l)
	if len(l) != 1 || l[0].SandboxID != id {
		t.Fatalf("paused list: %+v", l)
	}
	// Already paused: 409 (the SDK's pause returns false).
	e.api(t, e.Key, "POST", "/sandboxes/"+id+"/pause", nil).want(t, http.StatusConflict, "already paused")
	// connect resumes it (201) with a new lifetime.
	asked := time.Now()
	e.api(t, e.Key, "POST", "/v2/sandboxes/"+id+"/connect", map[string]any{"timeout": 300}).want(t, http.StatusCreated, "")
	answered := time.Now()
	d := e.info(t, id)
	if d.State != "running" {
		t.Fatalf("after connect: %+v", d)
	}
	wantEndAt(t, "after connect", d.EndAt, asked, answered, 300)
	// pause: 204, and a paused sandbox has no lifetime (it waits to be resumed or killed).
	e.api(t, e.Key, "POST", "/sandboxes/"+id+"/pause", nil).want(t, http.StatusNoContent, "")
	if d := e.info(t, id); d.State != "paused" || d.EndAt.Year() != 9999 {
		t.Fatalf("after pause: %+v", d)
	}
	// resume (deprecated): 201, then 409 when it is not paused.
	e.api(t, e.Key, "POST", "/sandboxes/"+id+"/resume", map[string]any{"timeout": -1}).want(t, http.StatusBadRequest, "timeout is -1: give the lifetime")
	e.api(t, e.Key, "POST", "/sandboxes/"+id+"/resume", map[string]any{"timeout": 60}).want(t, http.StatusCreated, "")
	e.api(t, e.Key, "POST", "/sandboxes/"+id+"/resume", map[string]any{"timeout": 60}).want(t, http.StatusConflict, "not paused")
	// The v1 connect of a running sandbox: 200.
	e.api(t, e.Key, "POST", "/sandboxes/"+id+"/connect", map[string]any{"timeout": 60}).want(t, http.StatusOK, "")
}

// A sandbox pauses with a background command's stream open (E2B pauses
// regardless of open streams): the stream stays, and goes on after the
// resume. While code runs in it (a runCode), the pause is refused with an
// error the SDK raises (503), never the 409 it reads as "already paused".
func TestControlPauseWithAStreamOpen(t *testing.T) {
	e := newEnv(t, nil)
	id := e.create(t, map[string]any{"templateID": "base", "timeout": 600}).SandboxID
	ev := e.start(t, id, bash(`echo ready; while read line; do echo "echo $line"; done`, true), nil)
	pid := ev.startPid(t)
	ev.until(t, "stdout", "ready\n")
	if bx := e.App.Sandbox.Box(id); bx == nil || !bx.CanPause() {
		t.Skip("this machine cannot freeze a box")
	}
	e.api(t, e.Key, "POST", "/sandboxes/"+id+"/pause", nil).want(t, http.StatusNoContent, "")
	if d := e.info(t, id); d.State != "paused" || !e.App.Sandbox.Box(id).Paused() {
		t.Fatalf("after pause: %+v", d)
	}
	e.api(t, e.Key, "POST", "/v2/sandboxes/"+id+"/connect", map[string]any{"timeout": 300}).want(t, http.StatusCreated, "")
	if _, err := e.procClient(id).SendInput(context.Background(), connect.NewRequest(&process.SendInputRequest{Process: pidSel(pid),
		Input: &process.ProcessInput{Input: &process.ProcessInput_Stdin{Stdin: []byte("one\n")}}})); err != nil {
		t.Fatal(err)
	}
	ev.until(t, "stdout", "echo one\n") // the same stream, after the resume

	// Code running: refused, with why.
	sess, err := e.App.Sessions.ByIDAnyTenant(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	fifo := filepath.Join(sess.Workspace(), "started")
	if err := syscall.Mkfifo(fifo, 0o666); err != nil {
		t.Fatal(err)
	}
	os.Chmod(fifo, 0o666)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ran := make(chan struct{})
	go func() {
		defer close(ran)
		e.App.Controller.Call(ctx, controller.Caller{Path: "test", Tenant: e.Tenant, Scope: capability.ScopeExec},
			"run_code", json.RawMessage(`{"session":"`+id+`","lang":"sh","code":"echo > started; sleep 1000","timeout_ms":300000}`))
	}()
	if _, err := os.ReadFile(fifo); err != nil { // the run is in flight once it wrote there
		t.Fatal(err)
	}
	e.api(t, e.Key, "POST", "/sandboxes/"+id+"/pause", nil).want(t, http.StatusServiceUnavailable, "running code")
	cancel()
	<-ran
}

func TestControlMetricsAndUnsupported(t *testing.T) {
	e := newEnv(t, nil)
	id := e.create(t, map[string]any{"templateID": "base", "timeout": 600}).SandboxID
	a := e.api(t, e.Key, "GET", "/sandboxes/"+id+"/metrics", nil)
	a.want(t, 200, "")
	var m []map[string]any
	a.json(t, &m)
	if len(m) != 1 {
		t.Fatalf("metrics: %s", a.body)
	}
	for _, f := range []string{"timestamp", "timestampUnix", "cpuCount", "cpuUsedPct", "memUsed", "memTotal", "memCache", "diskUsed", "diskTotal"} {
		if _, ok := m[0][f]; !ok {
			t.Fatalf("metric lacks %s: %s", f, a.body)
		}
	}
	a = e.api(t, e.Key, "GET", "/sandboxes/"+id+"/metrics?start=1&end=2", nil)
	a.want(t, 200, "")
	if strings.TrimSpace(string(a.body)) != "[]" {
		t.Fatalf("metrics of 1970: %s", a.body)
	}
	a = e.api(t, e.Key, "GET", "/sandboxes/metrics?sandbox_ids="+id+",ffffffffffffffffffffffffffffffff", nil)
	a.want(t, 200, "")
	var many struct {
		Sandboxes map[string]map[string]any `json:"sandboxes"`
	}
	a.json(t, &many)
	if len(many.Sandboxes) != 1 || many.Sandboxes[id] == nil {
		t.Fatalf("metrics of many: %s", a.body)
	}
	for _, c := range []struct{ method, path, sub string }{
		{"GET", "/sandboxes/" + id + "/logs", "sandbox logs"},
		{"GET", "/v2/sandboxes/" + id + "/logs", "sandbox logs"},
		{"POST", "/sandboxes/" + id + "/snapshots", "snapshots"},
		{"POST", "/v3/templates", "templates"},
		{"GET", "/volumes", "volumes"},
		{"PUT", "/sandboxes", "PUT /sandboxes"}, // a method not served: 501, not a bare 405
	} {
		e.api(t, e.Key, c.method, c.path, nil).want(t, http.StatusNotImplemented, c.sub)
	}
}

// Another tenant's key (in the E2B form) neither sees nor touches the
// first tenant's sandboxes: every route answers 404, as for a sandbox that
// does not exist, and changes nothing.
func TestControlTenantsCannotReachEachOther(t *testing.T) {
	e := newEnv(t, nil)
	id := e.create(t, map[string]any{"templateID": "base", "timeout": 600, "metadata": map[string]string{"owner": "t1"}}).SandboxID
	before := e.info(t, id)
	evil := e.otherKey(t)
	if !regexp.MustCompile(`^e2b_[0-9a-f]+$`).MatchString(evil) {
		t.Fatalf("E2B-form key %q", evil)
	}
	// The key works: it lists its own (none of t1's).
	a := e.api(t, evil, "GET", "/v2/sandboxes?metadata="+sdkMetadata(map[string]string{"owner": "t1"}), nil)
	a.want(t, 200, "")
	var l []listed
	a.json(t, &l)
	if len(l) != 0 {
		t.Fatalf("another tenant lists t1's sandbox: %s", a.body)
	}
	a = e.api(t, evil, "GET", "/sandboxes", nil)
	if strings.Contains(string(a.body), id) {
		t.Fatalf("v1 list shows t1's sandbox to t2: %s", a.body)
	}
	for _, c := range []struct {
		method, path string
		body         any
	}{
		{"GET", "/sandboxes/" + id, nil},
		{"DELETE", "/sandboxes/" + id, nil},
		{"POST", "/sandboxes/" + id + "/timeout", map[string]any{"timeout": 1}},
		{"POST", "/sandboxes/" + id + "/refreshes", map[string]any{"duration": 3600}},
		{"POST", "/v2/sandboxes/" + id + "/connect", map[string]any{"timeout": 1}},
		{"POST", "/sandboxes/" + id + "/connect", map[string]any{"timeout": 1}},
		{"POST", "/sandboxes/" + id + "/pause", nil},
		{"POST", "/sandboxes/" + id + "/resume", map[string]any{"timeout": 1}},
		{"GET", "/sandboxes/" + id + "/metrics", nil},
		{"POST", "/sandboxes/" + id + "/fork", map[string]any{"count": 1}},
	} {
		a := e.api(t, evil, c.method, c.path, c.body)
		a.want(t, http.StatusNotFound, "not found")
		if strings.Contains(string(a.body), e.accessToken(id)) {
			t.Fatalf("%s %s leaks the access token", c.method, c.path)
		}
	}
	a = e.api(t, evil, "GET", "/sandboxes/metrics?sandbox_ids="+id, nil)
	if strings.Contains(string(a.body), id) {
		t.Fatalf("metrics of t1's sandbox for t2: %s", a.body)
	}
	after := e.info(t, id)
	if !after.EndAt.Equal(before.EndAt) || after.State != before.State {
		t.Fatalf("t2 changed t1's sandbox: %+v → %+v", before, after)
	}
	// A bad key: 401.
	e.api(t, "e2b_"+strings.Repeat("0", 76), "GET", "/v2/sandboxes", nil).want(t, http.StatusUnauthorized, "")
}

// fork copies the workspace into new sandboxes, each with a lifetime.
func TestControlFork(t *testing.T) {
	e := newEnv(t, nil)
	id := e.create(t, map[string]any{"templateID": "base", "timeout": 600, "envVars": map[string]string{"FROM": "parent"}}).SandboxID
	asked := time.Now()
	a := e.api(t, e.Key, "POST", "/sandboxes/"+id+"/fork", map[string]any{"count": 2, "timeout": 120})
	answered := time.Now()
	a.want(t, http.StatusCreated, "")
	var res []struct {
		Sandbox *sandboxAnswer `json:"sandbox"`
		Error   any            `json:"error"`
	}
	a.json(t, &res)
	if len(res) != 2 {
		t.Fatalf("fork: %s", a.body)
	}
	for _, r := range res {
		if r.Sandbox == nil || r.Error != nil || r.Sandbox.SandboxID == id || r.Sandbox.EnvdAccessToken != e.accessToken(r.Sandbox.SandboxID) {
			t.Fatalf("fork result: %s", a.body)
		}
		d := e.info(t, r.Sandbox.SandboxID)
		wantEndAt(t, "a fork", d.EndAt, asked, answered, 120)
	}
	e.api(t, e.Key, "POST", "/sandboxes/"+id+"/fork", map[string]any{"count": 99}).want(t, 400, "")
	e.api(t, e.Key, "POST", "/sandboxes/"+id+"/fork", map[string]any{"timeout": 0}).want(t, 400, "timeout is 0: give the forks' lifetime")
}

// A sandbox with nothing running in it (no command yet) pauses too, as
// the SDK's scenario does right after create.
func TestControlPauseFresh(t *testing.T) {
	e := newEnv(t, nil)
	id := e.create(t, map[string]any{"templateID": "base", "timeout": 600}).SandboxID
	e.api(t, e.Key, "POST", "/sandboxes/"+id+"/pause", nil).want(t, http.StatusNoContent, "")
	if d := e.info(t, id); d.State != "paused" {
		t.Fatalf("after pause: %+v", d)
	}
	e.api(t, e.Key, "POST", "/sandboxes/"+id+"/pause", nil).want(t, http.StatusConflict, "already paused")
	e.api(t, e.Key, "POST", "/v2/sandboxes/"+id+"/connect", map[string]any{"timeout": 60}).want(t, http.StatusCreated, "")
	if d := e.info(t, id); d.State != "running" || d.EndAt.Year() == 9999 {
		t.Fatalf("after connect: %+v", d)
	}
}

// TestE2BNetworkRules: E2B's network settings become the session's policy
// and rules, E2B's precedence (allowOut over denyOut) translated to
// Quro's (deny wins); PUT /sandboxes/{id}/network changes them.
func TestE2BNetworkRules(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	rules := func(id string) (string, *session.NetRules) {
		t.Helper()
		s, err := e.App.Sessions.ByIDAnyTenant(context.Background(), id)
		if err != nil {
			t.Fatal(err)
		}
		return s.Network, s.NetRules
	}
	for _, tc := range []struct {
		body        map[string]any
		network     string
		allow, deny []string
	}{
		{map[string]any{}, "internet", nil, nil},
		{map[string]any{"allow_internet_access": false}, "none", nil, nil},
		{map[string]any{"network": map[string]any{"denyOut": []string{"0.0.0.0/0"}}}, "none", nil, nil},
		{map[string]any{"network": map[string]any{"denyOut": []string{"0.0.0.0/0"}, "allowOut": []string{"pypi.org", "1.1.1.1"}}}, "internet", []string{"pypi.org", "1.1.1.1"}, nil},
		{map[string]any{"network": map[string]any{"denyOut": []string{"8.8.8.0/24", "1.1.1.1"}, "allowOut": []string{"1.1.1.1"}}}, "internet", nil, []string{"8.8.8.0/24"}},
	} {
		body := map[string]any{"templateID": "base"}
		maps.Copy(body, tc.body)
		var sb struct{ SandboxID string }
		r := e.api(t, e.Key, "POST", "/v2/sandboxes", body)
		r.want(t, 201, "")
		r.json(t, &sb)
		network, nr := rules(sb.SandboxID)
		var allow, deny []string
		if nr != nil {
			allow, deny = nr.Allow, nr.Deny
		}
		if network != tc.network || !slices.Equal(allow, tc.allow) || !slices.Equal(deny, tc.deny) {
			t.Errorf("%v: network %q allow %v deny %v; want %q %v %v", tc.body, network, allow, deny, tc.network, tc.allow, tc.deny)
		}
		if tc.network == "internet" && len(tc.allow) == 0 && len(tc.deny) == 0 {
			// updateNetwork: an allow list, then everything denied.
			e.api(t, e.Key, "PUT", "/sandboxes/"+sb.SandboxID+"/network", map[string]any{"denyOut": []string{"0.0.0.0/0"}, "allowOut": []string{"github.com"}}).want(t, 204, "")
			if network, nr := rules(sb.SandboxID); network != "internet" || nr == nil || !slices.Equal(nr.Allow, []string{"github.com"}) {
				t.Errorf("after PUT network: %q %+v", network, nr)
			}
			e.api(t, e.Key, "PUT", "/sandboxes/"+sb.SandboxID+"/network", map[string]any{"allow_internet_access": false}).want(t, 204, "")
			if network, _ := rules(sb.SandboxID); network != "none" {
				t.Errorf("after PUT allow_internet_access false: %q", network)
			}
		}
	}
}

// TestE2BTenantNetworkMax: a tenant held to network none by the operator
// (set_tenant_limits network_max) gets E2B's default create as none (its
// internet is refused by the tenant's maximum, as by the server's), and an
// explicit allowInternetAccess or allowOut, or an updateNetwork to
// internet, is refused (403) naming the tenant's setting.
func TestE2BTenantNetworkMax(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	in, _ := json.Marshal(map[string]any{"tenant": e.Tenant, "network_max": "none"})
	if _, err := e.App.Controller.Call(context.Background(),
		controller.Caller{Path: "cli", Scope: capability.ScopeAdmin}, "set_tenant_limits", in); err != nil {
		t.Fatal(err)
	}
	var sb struct{ SandboxID string }
	r := e.api(t, e.Key, "POST", "/v2/sandboxes", map[string]any{"templateID": "base"})
	r.want(t, 201, "")
	r.json(t, &sb)
	if s, err := e.App.Sessions.ByIDAnyTenant(context.Background(), sb.SandboxID); err != nil || s.Network != "none" {
		t.Fatalf("E2B's default create under a tenant maximum of none: %+v %v", s, err)
	}
	for _, body := range []map[string]any{
		{"templateID": "base", "allow_internet_access": true},
		{"templateID": "base", "network": map[string]any{"allowOut": []string{"pypi.org"}, "denyOut": []string{"0.0.0.0/0"}}},
	} {
		e.api(t, e.Key, "POST", "/v2/sandboxes", body).want(t, 403, "quro tenant limits set --tenant "+e.Tenant+" --network-max")
	}
	e.api(t, e.Key, "PUT", "/sandboxes/"+sb.SandboxID+"/network", map[string]any{"allow_internet_access": true}).
		want(t, 403, "quro tenant limits set --tenant "+e.Tenant+" --network-max")
}

// Past the server's session ceiling (all tenants together), creating a
// sandbox answers at once 429 (E2B's SDKs raise RateLimitError) naming
// the ceiling, its value and the flag that raises it, with Retry-After;
// a killed sandbox makes room.
func TestControlCreateAtTheSessionCeilingIs429(t *testing.T) {
	e := newEnv(t, &app.Options{Limits: app.Limits{Sessions: 3}})
	var made []string
	for range 4 {
		a := e.api(t, e.Key, "POST", "/v2/sandboxes", map[string]any{"templateID": "base"})
		if a.status == http.StatusCreated {
			var sb sandboxAnswer
			a.json(t, &sb)
			made = append(made, sb.SandboxID)
			continue
		}
		a.want(t, http.StatusTooManyRequests, "is at its session ceiling of 3")
		for _, want := range []string{"quro serve --max-sessions N", "destroy one"} {
			if !strings.Contains(string(a.body), want) {
				t.Errorf("the refusal %s does not say %q", a.body, want)
			}
		}
		if a.header.Get("Retry-After") == "" {
			t.Errorf("no Retry-After")
		}
		break
	}
	if len(made) == 0 || len(made) == 4 {
		t.Fatalf("made %d sandboxes under a ceiling of 3", len(made))
	}
	e.api(t, e.Key, "DELETE", "/sandboxes/"+made[0], nil).want(t, http.StatusNoContent, "")
	e.create(t, map[string]any{"templateID": "base"})
}
