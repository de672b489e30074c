package main

import (
	"bytes"
	"encoding/json"
	"os"
	"testing"
)

// openapiFile is the server's API document as the web UI's typed client
// is generated from (make web-types): web/src/api-types.ts is
// openapi-typescript's output for it.
const openapiFile = "../../web/openapi.json"

// TestOpenAPIFile: the committed web/openapi.json is what a real quro
// serve answers at /v1/openapi.json (its version left out, which changes
// with every commit), so the UI's generated types are the server's.
// QURO_UPDATE_OPENAPI=1 writes it instead (make web-types does).
func TestOpenAPIFile(t *testing.T) {
	t.Parallel()
	srv := startServer(t)
	r := do(t, "GET", srv.url+"/v1/openapi.json", "", "", "Authorization", "Bearer "+srv.token)
	if r.status != 200 {
		t.Fatalf("%d %s", r.status, r.body)
	}
	var doc map[string]any
	if err := json.Unmarshal([]byte(r.body), &doc); err != nil {
		t.Fatal(err)
	}
	if info, ok := doc["info"].(map[string]any); ok {
		info["version"] = "(the server's)"
	}
	want, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	want = append(want, '\n')
	if os.Getenv("QURO_UPDATE_OPENAPI") != "" {
		if err := os.WriteFile(openapiFile, want, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	got, err := os.ReadFile(openapiFile)
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("web/openapi.json is not the server's API document (%v): run `make web-types` and commit it with web/src/api-types.ts", err)
	}
}
