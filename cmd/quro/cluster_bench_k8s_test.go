//go:build k8s

package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strings"
	"testing"
	"time"
)

// BenchmarkClusterForwarding: two nodes on a real API server; through
// node a, a warm run_code print(1) on a session of node a (local) and on
// one of node b (forwarded by the router), interleaved, as REST
// (POST /v1/sessions/{id}/run) and as MCP tools/call (forwarded by the
// controller); and session creates through node a, placed on either.
// Medians, in ms, and the forwarded/local ratio. Run (bench/README.md):
//
//	go test -tags k8s -trimpath -run '^$' -bench ClusterForwarding -benchtime 1x ./cmd/quro/
//
// QURO_BENCH_N sets the round trips of each kind (default 300).
func BenchmarkClusterForwarding(b *testing.B) {
	n := 300
	if v := os.Getenv("QURO_BENCH_N"); v != "" {
		fmt.Sscan(v, &n)
	}
	tok := quroToken()
	a, _, _, owner := twoNodes(b, tok+" acme exec\n")
	client := &http.Client{Timeout: 10 * time.Minute}
	post := func(url, body string) (int, string, time.Duration) {
		req, _ := http.NewRequest("POST", url, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+tok)
		start := time.Now()
		resp, err := client.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		out, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp.StatusCode, string(out), time.Since(start)
	}
	// Session creates through a, placed on both nodes.
	var creates []time.Duration
	on := map[string]string{}
	for i := 0; i < 20 || on["node-a"] == "" || on["node-b"] == ""; i++ {
		if i == 60 {
			b.Fatalf("60 creates did not land on both nodes: %v", on)
		}
		status, body, d := post(a.url+"/v1/sessions", fmt.Sprintf(`{"name":"bench%d"}`, i))
		var out struct{ ID string }
		if status != http.StatusCreated || json.Unmarshal([]byte(body), &out) != nil {
			b.Fatalf("create: %d %s", status, body)
		}
		creates = append(creates, d)
		if node := owner(out.ID); on[node] == "" {
			on[node] = out.ID
		}
	}
	local, remote := on["node-a"], on["node-b"]
	run := func(id string) time.Duration {
		status, body, d := post(a.url+"/v1/sessions/"+id+"/run", `{"code":"print(1)"}`)
		if status != 200 || !strings.Contains(body, `"1\n"`) && !strings.Contains(body, "1\\n") {
			b.Fatalf("run on %s: %d %s", id, status, body)
		}
		return d
	}
	m := mcpOpen(b, a.url, tok)
	mcpRun := func(id string) time.Duration {
		start := time.Now()
		status, msgs, _ := m.post(m.callMsg("run_code", map[string]any{"session": id, "code": "print(1)"}))
		d := time.Since(start)
		if status != 200 || len(msgs) != 1 || !strings.Contains(string(msgs[0]), `1\n`) {
			b.Fatalf("MCP run on %s: %d %s", id, status, msgs)
		}
		return d
	}
	for range 20 { // warm both interpreters and connections
		run(local)
		run(remote)
		mcpRun(local)
		mcpRun(remote)
	}
	var restL, restF, mcpL, mcpF []time.Duration
	b.ResetTimer()
	for range b.N {
		for range n {
			restL = append(restL, run(local))
			restF = append(restF, run(remote))
			mcpL = append(mcpL, mcpRun(local))
			mcpF = append(mcpF, mcpRun(remote))
		}
	}
	b.StopTimer()
	med := func(ds []time.Duration) float64 {
		s := slices.Clone(ds)
		slices.Sort(s)
		return float64(s[len(s)/2]) / float64(time.Millisecond)
	}
	load, _ := os.ReadFile("/proc/loadavg")
	b.Logf("load %s", strings.TrimSpace(string(load)))
	b.Logf("REST run_code print(1) through node a: local %.3f ms, forwarded %.3f ms (+%.3f ms, x%.2f), n=%d each",
		med(restL), med(restF), med(restF)-med(restL), med(restF)/med(restL), len(restL))
	b.Logf("MCP tools/call run_code through node a: local %.3f ms, forwarded %.3f ms (+%.3f ms, x%.2f), n=%d each",
		med(mcpL), med(mcpF), med(mcpF)-med(mcpL), med(mcpF)/med(mcpL), len(mcpL))
	b.Logf("session create through node a, placed on either: median %.3f ms, n=%d", med(creates), len(creates))
	b.ReportMetric(med(restL), "rest-local-ms")
	b.ReportMetric(med(restF), "rest-forwarded-ms")
	b.ReportMetric(med(mcpL), "mcp-local-ms")
	b.ReportMetric(med(mcpF), "mcp-forwarded-ms")
	b.ReportMetric(med(creates), "create-ms")
}
