package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/quro-dev/quro/bench/internal/benchbed"
	"github.com/quro-dev/quro/internal/app"
)

// The benchmarks share one server (one App, one listener, one MCP session),
// so that one `go test -bench` run gives every path on the same machine at
// the same time; each reports its median as p50-µs beside ns/op:
//
//	go test -run '^$' -bench . -benchtime 2000x -count 5 ./bench/service/
//
// and with a CPU profile of server and client together:
//
//	go test -run '^$' -bench MCP -benchtime 5000x -cpuprofile /tmp/mcp.prof ./bench/service/

var shared struct {
	once sync.Once
	b    *bed
	err  error
}

func TestMain(m *testing.M) {
	code := m.Run()
	if shared.b != nil {
		shared.b.Close()
		os.RemoveAll(shared.b.App.DataDir)
	}
	os.Exit(code)
}

func testBed(b *testing.B) *bed {
	shared.once.Do(func() {
		dir, err := os.MkdirTemp("", "quro-bench-service-")
		if err != nil {
			shared.err = err
			return
		}
		install := filepath.Join(os.TempDir(), "quro-test-python") // shared with the tests
		shared.b, shared.err = newBed(context.Background(), dir, install, app.Limits{})
	})
	if shared.err != nil {
		b.Fatal(shared.err)
	}
	return shared.b
}

// loopDB is benchbed.Loop reporting also the store's SQLite statements
// per call (sqlite-stmts/op, the 20 warm-up calls included) and the
// connections it opened (sqlite-conns).
func loopDB(b *testing.B, t *bed, f func() error) {
	db0 := t.App.Store.Stats()
	benchbed.Loop(b, f)
	db1 := t.App.Store.Stats()
	b.ReportMetric(float64(db1.Statements-db0.Statements)/float64(b.N+20), "sqlite-stmts/op")
	b.ReportMetric(float64(db1.AuditBatches-db0.AuditBatches)/float64(b.N+20), "audit-batches/op")
	b.ReportMetric(float64(db1.ConnsOpened-db0.ConnsOpened), "sqlite-conns")
}

func BenchmarkRunCodeInProcess(b *testing.B) {
	t := testBed(b)
	args := runArgs("")
	loopDB(b, t, func() error { return t.InProcess(context.Background(), args) })
}

func BenchmarkRunCodeREST(b *testing.B) {
	t := testBed(b)
	args := runArgs("")
	loopDB(b, t, func() error { return t.REST(context.Background(), "run_code", args) })
}

func BenchmarkRunCodeMCP(b *testing.B) {
	t := testBed(b)
	args := map[string]any{"code": "print(1)"}
	benchbed.Loop(b, func() error { return t.MCP(context.Background(), args) })
}

// BenchmarkRunCodeREST16 is 16 concurrent REST clients, each on its own
// session; ns/op is wall time per request (1e9/ns-op = requests/s).
func BenchmarkRunCodeREST16(b *testing.B) {
	t := testBed(b)
	const clients = 16
	var bodies [][]byte
	for i := range clients {
		name := fmt.Sprintf("bench16-%d", i)
		s, err := t.App.Sessions.Get(context.Background(), name)
		if err != nil { // the first of the framework's calls creates them
			s, err = t.App.Sessions.Create(context.Background(), name)
		}
		if err != nil {
			b.Fatal(err)
		}
		body := runArgs(s.Name)
		if err := t.REST(context.Background(), "run_code", body); err != nil {
			b.Fatal(err)
		}
		bodies = append(bodies, body)
	}
	db0 := t.App.Store.Stats()
	b.ResetTimer()
	l := hammer("rest16", clients, b.N, func(c int) error { return t.REST(context.Background(), "run_code", bodies[c]) })
	b.StopTimer()
	if l.errs > 0 {
		b.Errorf("%d of %d requests failed; first: %v", l.errs, l.n, l.firstErr)
	}
	b.ReportMetric(l.rps(), "req/s")
	b.ReportMetric(float64(l.lat.q(0.5).Nanoseconds())/1e3, "p50-µs")
	b.ReportMetric(float64(l.lat.q(0.99).Nanoseconds())/1e3, "p99-µs")
	b.ReportMetric(float64(l.errs), "errors")
	db1 := t.App.Store.Stats()
	b.ReportMetric(float64(db1.Statements-db0.Statements)/float64(b.N), "sqlite-stmts/op")
	b.ReportMetric(float64(db1.AuditBatches-db0.AuditBatches)/float64(b.N), "audit-batches/op")
	b.ReportMetric(float64(db1.ConnsOpened-db0.ConnsOpened), "sqlite-conns")
}
