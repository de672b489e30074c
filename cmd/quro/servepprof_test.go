package main

import (
	"bytes"
	"compress/gzip"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestServePprof: --pprof serves the profiler on its own loopback
// listener to the operator only (401 without a token, 403 with an exec
// one or another tenant's admin token: profiles hold every tenant's work);
// a 1 s CPU profile parses; the main listener does not serve it.
func TestServePprof(t *testing.T) {
	srv := startLogServer(t, "--pprof", "127.0.0.1:0")
	if srv.pprof == "" {
		t.Fatal("serve printed no profiler address")
	}
	if strings.HasPrefix(srv.pprof, srv.url) {
		t.Fatalf("the profiler is on the main listener: %s", srv.pprof)
	}
	runner, _, code := quro(t, "", "token", "create", "--data", srv.data, "--scopes", "read,exec")
	runner = strings.TrimSpace(runner)
	if code != 0 || runner == "" {
		t.Fatal("token create failed")
	}
	goroutines := srv.pprof + "goroutine?debug=1"
	if r := do(t, "GET", goroutines, "", ""); r.status != 401 {
		t.Errorf("no token: %d %s", r.status, r.body)
	}
	if r := do(t, "GET", goroutines, "", "", "Authorization", "Bearer quro_not-a-token"); r.status != 401 {
		t.Errorf("bad token: %d %s", r.status, r.body)
	}
	if r := do(t, "GET", goroutines, "", "", "Authorization", "Bearer "+runner); r.status != 403 || !strings.Contains(r.body, "admin") {
		t.Errorf("exec token: %d %s", r.status, r.body)
	}
	acme, _, code := quro(t, "", "token", "create", "--data", srv.data, "--tenant", "acme", "--scopes", "admin")
	if acme = strings.TrimSpace(acme); code != 0 || acme == "" {
		t.Fatal("token create failed")
	}
	if r := do(t, "GET", goroutines, "", "", "Authorization", "Bearer "+acme); r.status != 403 || !strings.Contains(r.body, "operator") {
		t.Errorf("another tenant's admin token: %d %s", r.status, r.body)
	}
	// A foreign Host name (DNS rebinding) is refused even with the token.
	req, _ := http.NewRequest("GET", goroutines, nil)
	req.Host = "evil.example"
	req.Header.Set("Authorization", "Bearer "+srv.token)
	if resp, err := http.DefaultClient.Do(req); err != nil {
		t.Fatal(err)
	} else if resp.Body.Close(); resp.StatusCode != 403 {
		t.Errorf("foreign Host: %d", resp.StatusCode)
	}
	// So is a foreign page's request (its Origin), as on every route.
	if r := do(t, "GET", goroutines, "", "", "Authorization", "Bearer "+srv.token, "Origin", "https://evil.example"); r.status != 403 || !strings.Contains(r.body, "origin") {
		t.Errorf("foreign Origin: %d %s", r.status, r.body)
	}
	r := do(t, "GET", goroutines, "", "", "Authorization", "Bearer "+srv.token)
	if r.status != 200 || !strings.Contains(r.body, "goroutine profile:") {
		t.Errorf("admin token: %d %.200s", r.status, r.body)
	}
	if r := do(t, "GET", srv.url+"/debug/pprof/goroutine?debug=1", "", "", "Authorization", "Bearer "+srv.token); strings.Contains(r.body, "goroutine profile:") {
		t.Error("the main listener serves the profiler")
	}

	r = do(t, "GET", srv.pprof+"profile?seconds=1", "", "", "Authorization", "Bearer "+srv.token)
	if r.status != 200 {
		t.Fatalf("CPU profile: %d %.200s", r.status, r.body)
	}
	// A profile is a gzipped profile.proto whose string table names the
	// sample type.
	zr, err := gzip.NewReader(strings.NewReader(r.body))
	if err != nil {
		t.Fatalf("the CPU profile is not gzipped: %v", err)
	}
	raw, err := io.ReadAll(zr)
	if err != nil || !bytes.Contains(raw, []byte("nanoseconds")) || !bytes.Contains(raw, []byte("cpu")) {
		t.Fatalf("the CPU profile does not read as one (%v, %d bytes)", err, len(raw))
	}
	// go tool pprof reads it, when the toolchain is here (it is under go test).
	if goBin, err := exec.LookPath("go"); err == nil {
		file := filepath.Join(t.TempDir(), "cpu.pprof")
		if err := os.WriteFile(file, []byte(r.body), 0o600); err != nil {
			t.Fatal(err)
		}
		out, err := exec.Command(goBin, "tool", "pprof", "-raw", file).CombinedOutput()
		if err != nil || !strings.Contains(string(out), "PeriodType: cpu nanoseconds") {
			t.Errorf("go tool pprof -raw: %v\n%.500s", err, out)
		}
	}
}

func TestPprofAddrLoopbackOnly(t *testing.T) {
	for _, addr := range []string{"0.0.0.0:6060", ":6060", "[::]:6060", "192.0.2.1:6060", "10.0.0.1:6060", "6060"} {
		if err := checkPprofAddr(addr); err == nil {
			t.Errorf("%s accepted", addr)
		}
	}
	for _, addr := range []string{"127.0.0.1:6060", "127.0.0.2:0", "[::1]:6060", "localhost:6060"} {
		if err := checkPprofAddr(addr); err != nil {
			t.Errorf("%s: %v", addr, err)
		}
	}
}
