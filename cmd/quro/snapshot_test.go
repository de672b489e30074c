package main

import (
	"encoding/json"
	"strings"
	"testing"
)

// Over real HTTP with two tenants' tokens: tenant tb can neither list,
// fork nor delete tenant ta's snapshot, by id or by name, through the
// resource routes or POST /v1/{capability}; the refusals are plain "not
// found"; ta's snapshot is untouched and tb's own of the same name is
// its own.
func TestSnapshotsAreTheirTenants(t *testing.T) {
	t.Parallel()
	srv := startServer(t)
	tok := func(tenant string) []string {
		out, errs, code := quro(t, "", "token", "create", "--data", srv.data, "--tenant", tenant, "--scopes", "read,exec")
		if code != 0 {
			t.Fatalf("token create: %s", errs)
		}
		return []string{"Authorization", "Bearer " + strings.TrimSpace(out)}
	}
	ta, tb := tok("ta"), tok("tb")
	const js = "application/json"
	must := func(hdr []string, method, path, body string, status int) string {
		t.Helper()
		ctype := ""
		if body != "" {
			ctype = js
		}
		r := do(t, method, srv.url+path, ctype, body, hdr...)
		if r.status != status {
			t.Fatalf("%s %s: %d %s, want %d", method, path, r.status, trim(r.body), status)
		}
		return r.body
	}
	must(ta, "POST", "/v1/sessions", `{"name":"w"}`, 201)
	must(ta, "POST", "/v1/sessions/w/run", `{"lang":"sh","code":"echo ta-secret > s.txt"}`, 200)
	var snap struct{ ID, Name string }
	if err := json.Unmarshal([]byte(must(ta, "POST", "/v1/sessions/w/snapshots", `{"name":"s"}`, 201)), &snap); err != nil || snap.ID == "" {
		t.Fatalf("snapshot: %v %+v", err, snap)
	}

	if body := must(tb, "GET", "/v1/snapshots", "", 200); strings.Contains(body, snap.ID) || strings.Contains(body, `"name":"s"`) {
		t.Fatalf("tb lists ta's snapshot: %s", body)
	}
	for _, ref := range []string{snap.ID, "s"} {
		for _, c := range []struct{ method, path, body string }{
			{"POST", "/v1/snapshots/" + ref + "/fork", `{"count":1}`},
			{"DELETE", "/v1/snapshots/" + ref, ""},
			{"POST", "/v1/fork_session", `{"snapshot":"` + ref + `"}`},
			{"POST", "/v1/delete_snapshot", `{"snapshot":"` + ref + `"}`},
		} {
			body := must(tb, c.method, c.path, c.body, 404)
			if !strings.Contains(body, "not_found") || strings.Contains(body, "ta") && strings.Contains(body, "tenant") {
				t.Errorf("%s %s as tb: %s", c.method, c.path, body)
			}
		}
	}
	// tb cannot snapshot ta's session either, and its own "s" is its own.
	must(tb, "POST", "/v1/sessions/w/snapshots", `{"name":"x"}`, 404)
	must(tb, "POST", "/v1/snapshot_session", `{"name":"s"}`, 200)
	if body := must(tb, "GET", "/v1/sessions", "", 200); strings.Contains(body, `"name":"w"`) {
		t.Fatalf("tb sees ta's session: %s", body)
	}
	// ta's snapshot is intact and forks with ta's files.
	if body := must(ta, "GET", "/v1/snapshots", "", 200); !strings.Contains(body, snap.ID) {
		t.Fatalf("ta's snapshot is gone: %s", body)
	}
	must(ta, "POST", "/v1/snapshots/"+snap.ID+"/fork", `{"count":1,"name_prefix":"copy"}`, 201)
	if body := must(ta, "POST", "/v1/sessions/copy-1/run", `{"lang":"sh","code":"cat s.txt"}`, 200); !strings.Contains(body, "ta-secret") {
		t.Fatalf("ta's fork: %s", body)
	}
	// tb's fork of its own "s" has tb's default workspace, not ta's files.
	must(tb, "POST", "/v1/snapshots/s/fork", `{"name_prefix":"mine"}`, 201)
	if body := must(tb, "POST", "/v1/sessions/mine-1/run", `{"lang":"sh","code":"cat s.txt || echo none"}`, 200); strings.Contains(body, "ta-secret") {
		t.Fatalf("tb's fork holds ta's file: %s", body)
	}
}
