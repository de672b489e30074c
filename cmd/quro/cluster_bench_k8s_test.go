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
// Spares on (quro serve's default) unless QURO_BENCH_SPARES=0.
func BenchmarkClusterForwarding(b *testing.B) {
	n := 300
	if v := os.Getenv("QURO_BENCH_N"); v != "" {
		fmt.Sscan(v, &n)
	}
	tok := quroToken()
	// Spares as quro serve keeps them by default (one per tenant and
	// network policy, more under a burst): a create takes a ready box, as
	// on a single node. QURO_BENCH_SPARES=0: every create starts its box.
	spares := "1"
	if v := os.Getenv("QURO_BENCH_SPARES"); v != "" {
		spares = v
	}
	op := quroToken()
	a, nb, _, owner := twoNodes(b, tok+" acme exec\n"+op+" - admin\n", "--spare-sessions", spares)
	post := func(url, body string) (int, string, time.Duration) { return timedPost(b, url, tok, body) }
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
	// Paced creates: each once both nodes' spare pools are full again
	// (no spare being made), as creates come apart: placed on node b
	// (forwarded by a) or on a.
	var pacedA, pacedB []time.Duration
	if spares != "0" {
		for i := 0; len(pacedA) < 10 || len(pacedB) < 10; i++ {
			if i == 80 {
				b.Fatalf("80 paced creates did not land 10 on each node: %d on a, %d on b", len(pacedA), len(pacedB))
			}
			id, d := pacedCreate(b, tok, op, a.url, fmt.Sprintf("paced%d", i), a.url, nb.url)
			if owner(id) == "node-b" {
				pacedB = append(pacedB, d)
			} else {
				pacedA = append(pacedA, d)
			}
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
	load, _ := os.ReadFile("/proc/loadavg")
	b.Logf("load %s", strings.TrimSpace(string(load)))
	b.Logf("REST run_code print(1) through node a: local %.3f ms, forwarded %.3f ms (+%.3f ms, x%.2f), n=%d each",
		med(restL), med(restF), med(restF)-med(restL), med(restF)/med(restL), len(restL))
	b.Logf("MCP tools/call run_code through node a: local %.3f ms, forwarded %.3f ms (+%.3f ms, x%.2f), n=%d each",
		med(mcpL), med(mcpF), med(mcpF)-med(mcpL), med(mcpF)/med(mcpL), len(mcpL))
	b.Logf("session create through node a, placed on either, back to back (spares %s): median %.3f ms, n=%d", spares, med(creates), len(creates))
	if len(pacedB) > 0 {
		b.Logf("session create through node a, a spare ready: placed on node b (forwarded) median %.3f ms, on node a median %.3f ms, n=%d+%d",
			med(pacedB), med(pacedA), len(pacedB), len(pacedA))
		b.ReportMetric(med(pacedB), "create-paced-forwarded-ms")
		b.ReportMetric(med(pacedA), "create-paced-local-ms")
	}
	b.ReportMetric(med(restL), "rest-local-ms")
	b.ReportMetric(med(restF), "rest-forwarded-ms")
	b.ReportMetric(med(mcpL), "mcp-local-ms")
	b.ReportMetric(med(mcpF), "mcp-forwarded-ms")
	b.ReportMetric(med(creates), "create-ms")
}

// benchClient is the benchmarks' client of the nodes.
var benchClient = &http.Client{Timeout: 10 * time.Minute}

// timedPost posts the JSON body to url with tok and times the round trip.
func timedPost(b *testing.B, url, tok, body string) (int, string, time.Duration) {
	b.Helper()
	req, _ := http.NewRequest("POST", url, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+tok)
	start := time.Now()
	resp, err := benchClient.Do(req)
	if err != nil {
		b.Fatal(err)
	}
	out, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp.StatusCode, string(out), time.Since(start)
}

// pacedCreate creates session name through the node at via once the
// spare pools of the nodes at urls are full again (op reads their
// metrics), as creates that come apart find them, and times it.
func pacedCreate(b *testing.B, tok, op, via, name string, urls ...string) (string, time.Duration) {
	b.Helper()
	sparesSettled(b, op, urls...)
	status, body, d := timedPost(b, via+"/v1/sessions", tok, fmt.Sprintf(`{"name":%q}`, name))
	var out struct{ ID string }
	if status != http.StatusCreated || json.Unmarshal([]byte(body), &out) != nil || out.ID == "" {
		b.Fatalf("create: %d %s", status, body)
	}
	return out.ID, d
}

// med is the median of ds, in ms.
func med(ds []time.Duration) float64 {
	s := slices.Clone(ds)
	slices.Sort(s)
	return float64(s[len(s)/2]) / float64(time.Millisecond)
}

// BenchmarkClusterCreate: three nodes on a real API server, spares on
// (quro serve's default); session creates through node a, each once
// every node's spare pool is full again (creates that come apart), placed
// by headroom over the three: those placed on node a itself (the local
// create, the peer) and those forwarded to node b or c, interleaved as
// placement spreads them; then creates back to back. Medians, in ms, and
// the forwarded/local ratio. Run (bench/README.md):
//
//	go test -tags k8s -trimpath -run '^$' -bench ClusterCreate -benchtime 1x ./cmd/quro/
//
// QURO_BENCH_N sets the paced creates of each kind (default 20).
func BenchmarkClusterCreate(b *testing.B) {
	n := 20
	if v := os.Getenv("QURO_BENCH_N"); v != "" {
		fmt.Sscan(v, &n)
	}
	tok, op := quroToken(), quroToken()
	ns, _, owner := startNodes(b, []string{"node-a", "node-b", "node-c"}, tok+" acme exec\n"+op+" - admin\n", "--spare-sessions", "1")
	var urls []string
	for _, nd := range ns {
		urls = append(urls, nd.url)
	}
	via := ns[0].url
	for i := range 3 { // warm: the first create of each node makes its interpreter's files
		pacedCreate(b, tok, op, via, fmt.Sprintf("warm%d", i), urls...)
	}
	var local, forwarded []time.Duration
	placed := map[string]int{}
	b.ResetTimer()
	for range b.N {
		for i := 0; len(local) < n || len(forwarded) < n; i++ {
			if i == 10*n {
				b.Fatalf("%d paced creates did not land %d on node a and %d elsewhere: %v", i, n, n, placed)
			}
			id, d := pacedCreate(b, tok, op, via, fmt.Sprintf("paced%d", i), urls...)
			node := owner(id)
			placed[node]++
			if node == "node-a" {
				local = append(local, d)
			} else {
				forwarded = append(forwarded, d)
			}
		}
	}
	b.StopTimer()
	var burst []time.Duration
	for i := range n {
		status, body, d := timedPost(b, via+"/v1/sessions", tok, fmt.Sprintf(`{"name":"burst%d"}`, i))
		if status != http.StatusCreated {
			b.Fatalf("create: %d %s", status, body)
		}
		burst = append(burst, d)
	}
	load, _ := os.ReadFile("/proc/loadavg")
	b.Logf("load %s", strings.TrimSpace(string(load)))
	b.Logf("session create through node a of 3, a spare ready: placed on node a (local) median %.3f ms, forwarded to b or c median %.3f ms (+%.3f ms, x%.2f), n=%d+%d, placed %v",
		med(local), med(forwarded), med(forwarded)-med(local), med(forwarded)/med(local), len(local), len(forwarded), placed)
	b.Logf("session create through node a of 3, back to back (spares refilling): median %.3f ms, n=%d", med(burst), len(burst))
	b.ReportMetric(med(local), "create-local-ms")
	b.ReportMetric(med(forwarded), "create-forwarded-ms")
	b.ReportMetric(med(burst), "create-burst-ms")
}

// sparesSettled waits until no spare session is being made on the nodes
// at urls (their /metrics' quro_spare_sessions{state="filling"} is 0) and
// each has one ready. A poll: the pool has no event to wait on.
func sparesSettled(b *testing.B, op string, urls ...string) {
	b.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	gauge := func(url, state string) float64 {
		req, _ := http.NewRequest("GET", url+"/metrics", nil)
		req.Header.Set("Authorization", "Bearer "+op)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		for _, line := range strings.Split(string(body), "\n") {
			if strings.HasPrefix(line, `quro_spare_sessions{`) && strings.Contains(line, `state="`+state+`"`) {
				var v float64
				fmt.Sscan(line[strings.LastIndexByte(line, ' ')+1:], &v)
				return v
			}
		}
		b.Fatalf("%s/metrics has no quro_spare_sessions{state=%q}: %d %.300s", url, state, resp.StatusCode, body)
		return 0
	}
	for _, url := range urls {
		for gauge(url, "filling") > 0 || gauge(url, "ready") < 1 {
			if time.Now().After(deadline) {
				b.Fatalf("%s's spare pool did not settle within 2 minutes", url)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
}
