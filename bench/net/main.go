// Command net measures the network path of a box under policy "internet"
// (the server's namespace, nftables redirect, the egress's splice relay)
// against the host's own network, on the served, boxed setup: one real App
// served over REST (benchbed) with a "host" session and an "internet"
// session, and a stand-in server on the host's loopback that the egress
// resolves big.test to (an operator's exception, as in the tests). Rounds
// alternate between the two sessions so that the machine's drift hits
// both alike.
//
//   - download: curl in the box fetches -mb MiB (time_total as curl
//     measures it, inside the box);
//
//   - connection: Python in the box opens -conns connections one after
//     another (connect, a 1-byte request, the 1-byte answer, close):
//     the median per connection;
//
//   - namespace: sandbox.NewNetns without and with the egress's rules,
//     and the egress's listeners opened in it (Attach), then closed;
//
//   - memory: -boxes namespaces with the egress attached, held at once:
//     the kernel's unreclaimable slab and the server's Go heap per box;
//
//   - create (-only create for this alone): create_session under "host"
//     (no namespace of its own), "none" (an empty one) and "internet"
//     (namespace, rules, egress listeners), then destroy_session, -creates
//     rounds with the policies' order turning round by round (create.go);
//
//   - preview (-only preview for this alone): a request to a server in a
//     box through the preview proxy (path and host form) against one
//     written on a connection DialBox makes (preview.go).
//
//     sudo go run ./bench/net
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/quro-dev/quro/bench/internal/benchbed"
	"github.com/quro-dev/quro/internal/app"
	"github.com/quro-dev/quro/internal/engine/python"
	"github.com/quro-dev/quro/internal/runcode"
	"github.com/quro-dev/quro/internal/sandbox"
)

var (
	rounds  = flag.Int("n", 9, "rounds of each measure on each session")
	mb      = flag.Int("mb", 100, "MiB per download")
	conns   = flag.Int("conns", 200, "connections per connection round")
	nsN     = flag.Int("ns", 200, "namespaces made for the namespace figures")
	boxes   = flag.Int("boxes", 1000, "namespaces with the egress attached, held at once, for the memory figure")
	reqs    = flag.Int("requests", 1000, "requests of each kind for the preview figures")
	creates = flag.Int("creates", 60, "create_session rounds per network policy for the create figures")
	only    = flag.String("only", "", "run one part: preview (the preview proxy against a direct request) or create (create_session by network policy); default: all")
	install = flag.String("install", filepath.Join(os.TempDir(), "quro-test-python"), "where the embedded interpreter is extracted (shared with the tests)")
)

func main() {
	flag.Parse()
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "net:", err)
		os.Exit(1)
	}
}

type series struct {
	name string
	ds   []time.Duration
}

func (s *series) q(p float64) time.Duration {
	d := slices.Clone(s.ds)
	slices.Sort(d)
	return d[int(p*float64(len(d)-1))]
}

// standIn serves -mb MiB at /big and one byte per request on a raw port.
func standIn() (httpPort, echoPort int, stop func(), err error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, 0, nil, err
	}
	chunk := make([]byte, 1<<20)
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", strconv.Itoa(*mb<<20))
		for range *mb {
			if _, err := w.Write(chunk); err != nil {
				return
			}
		}
	})}
	go func() { _ = srv.Serve(ln) }()
	el, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		srv.Close()
		return 0, 0, nil, err
	}
	go func() {
		for {
			c, err := el.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				b := make([]byte, 1)
				if _, err := io.ReadFull(c, b); err == nil {
					_, _ = c.Write(b)
				}
			}()
		}
	}()
	return ln.Addr().(*net.TCPAddr).Port, el.Addr().(*net.TCPAddr).Port, func() { srv.Close(); el.Close() }, nil
}

func run() error {
	ctx := context.Background()
	httpPort, echoPort, stop, err := standIn()
	if err != nil {
		return err
	}
	defer stop()
	dir, err := os.MkdirTemp("", "quro-bench-net-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	resolve := func(_ context.Context, host string) ([]netip.Addr, error) {
		if host == "big.test" {
			return []netip.Addr{netip.MustParseAddr("127.0.0.1")}, nil
		}
		return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
	}
	a, err := app.New(ctx, dir, &app.Options{
		Python:    &python.EmbeddedOptions{InstallRoot: *install},
		Sandbox:   &sandbox.Options{BoxReadOnly: []string{*install}},
		AutoPause: -1,
		Limits: app.Limits{SessionsPerTenant: -1,
			Tenant: app.TenantLimits{Sessions: -1, Tasks: -1, Memory: -1, Disk: -1}},
		Network: app.NetworkOptions{Max: "host", Resolve: resolve, PreviewDomain: "http://preview.bench", PreviewPublic: true,
			Trusted: []string{fmt.Sprintf("big.test:%d", httpPort), fmt.Sprintf("big.test:%d", echoPort)}},
	})
	if err != nil {
		return err
	}
	b, err := benchbed.Serve(ctx, a, false)
	if err != nil {
		return err
	}
	defer b.Close()
	if *only == "preview" {
		return printPreview(ctx, a, b)
	}
	if *only == "create" {
		return printCreate(ctx, b)
	}
	if *only != "" {
		return fmt.Errorf("-only %q: want preview or create", *only)
	}
	sessions := map[string]string{}
	hosts := map[string]string{"host": "127.0.0.1", "internet": "big.test"}
	for _, policy := range []string{"host", "internet"} {
		var s app.SessionInfo
		if err := b.Post(ctx, "create_session", []byte(`{"network":"`+policy+`"}`), &s); err != nil {
			return err
		}
		sessions[policy] = s.ID
	}
	runIn := func(policy, lang, code string) (string, error) {
		body, _ := json.Marshal(app.RunCodeInput{Session: sessions[policy], Lang: lang, Code: code, TimeoutMS: 120000})
		var r runcode.Result
		if err := b.Post(ctx, "run_code", body, &r); err != nil {
			return "", err
		}
		if r.ExitCode != 0 {
			return "", fmt.Errorf("%s in %s: %+v", lang, policy, r)
		}
		return strings.TrimSpace(r.Stdout), nil
	}
	secs := func(s string) (time.Duration, error) {
		f, err := strconv.ParseFloat(s, 64)
		return time.Duration(f * float64(time.Second)), err
	}
	dl := map[string]*series{"host": {name: "download, host network"}, "internet": {name: "download, internet (egress)"}}
	cn := map[string]*series{"host": {name: "new connection, host network"}, "internet": {name: "new connection, internet (egress)"}}
	connCode := func(host string) string {
		return fmt.Sprintf("import socket, time\nts = []\nfor _ in range(%d):\n t = time.perf_counter(); c = socket.create_connection((%q, %d)); c.sendall(b'x'); c.recv(1); c.close(); ts.append(time.perf_counter() - t)\nts.sort(); print(ts[len(ts)//2])", *conns, host, echoPort)
	}
	fmt.Fprintf(os.Stderr, "%d rounds of %d MiB and %d connections in each session ...\n", *rounds, *mb, *conns)
	for i := range *rounds + 1 {
		for _, policy := range []string{"host", "internet"} {
			out, err := runIn(policy, "bash", fmt.Sprintf("curl -sS -o /dev/null -w '%%{time_total}' http://%s:%d/big", hosts[policy], httpPort))
			if err != nil {
				return err
			}
			d, err := secs(out)
			if err != nil {
				return fmt.Errorf("curl said %q", out)
			}
			out, err = runIn(policy, "python", connCode(hosts[policy]))
			if err != nil {
				return err
			}
			c, err := secs(out)
			if err != nil {
				return fmt.Errorf("python said %q", out)
			}
			if i > 0 { // the first round warms up
				dl[policy].ds = append(dl[policy].ds, d)
				cn[policy].ds = append(cn[policy].ds, c)
			}
		}
	}

	mk, perBox, err := namespaces(a.Egress())
	if err != nil {
		return err
	}

	load, _ := os.ReadFile("/proc/loadavg")
	fmt.Printf("Quro network path: %s, load average %s\n", time.Now().UTC().Format(time.RFC3339), strings.Join(strings.Fields(string(load))[:3], " "))
	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "\tn\tmedian\tp95\t")
	for _, s := range []*series{dl["host"], dl["internet"], cn["host"], cn["internet"], mk[false], mk[true]} {
		fmt.Fprintf(tw, "%s\t%d\t%.3f ms\t%.3f ms\t\n", s.name, len(s.ds), ms(s.q(0.5)), ms(s.q(0.95)))
	}
	tw.Flush()
	fmt.Printf("download ratio internet/host (medians): %.2f\n", float64(dl["internet"].q(0.5))/float64(dl["host"].q(0.5)))
	fmt.Printf("added per new connection (medians): %.3f ms\n", ms(cn["internet"].q(0.5)-cn["host"].q(0.5)))
	fmt.Printf("added to a box's making under internet vs none (medians): %.3f ms\n", ms(mk[true].q(0.5)-mk[false].q(0.5)))
	fmt.Printf("memory per box at %d boxes: kernel %.1f KiB (SUnreclaim), server heap and stacks %.1f KiB\n", *boxes, perBox[0]/1024, perBox[1]/1024)
	if err := printCreate(ctx, b); err != nil {
		return err
	}
	return printPreview(ctx, a, b)
}

// printPreview measures and prints the preview proxy against a direct
// request.
func printPreview(ctx context.Context, a *app.App, b *benchbed.Bed) error {
	fmt.Fprintf(os.Stderr, "%d requests of each kind to a server in a box ...\n", *reqs)
	pv, err := previewRequests(ctx, a, b, *reqs)
	if err != nil {
		return err
	}
	load, _ := os.ReadFile("/proc/loadavg")
	fmt.Printf("Quro preview proxy: %s, load average %s\n", time.Now().UTC().Format(time.RFC3339), strings.Join(strings.Fields(string(load))[:3], " "))
	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "\tn\tmedian\tp95\t")
	for _, s := range pv {
		fmt.Fprintf(tw, "%s\t%d\t%.3f ms\t%.3f ms\t\n", s.name, len(s.ds), ms(s.q(0.5)), ms(s.q(0.95)))
	}
	tw.Flush()
	fmt.Printf("added by the preview proxy (medians): path form %.3f ms, host form %.3f ms, public host form %.3f ms (against its own box)\n",
		ms(pv[1].q(0.5)-pv[0].q(0.5)), ms(pv[2].q(0.5)-pv[0].q(0.5)), ms(pv[3].q(0.5)-pv[4].q(0.5)))
	return nil
}

// namespaces times making a box's namespace without and with the egress
// (made and closed one at a time), then holds -boxes of them with the
// egress attached: the kernel's and the server's bytes per box.
func namespaces(eg sandbox.Egress) (map[bool]*series, [2]float64, error) {
	var perBox [2]float64
	// Namespaces, made and closed one at a time.
	mk := map[bool]*series{false: {name: "namespace, none"}, true: {name: "namespace + rules + egress listeners, internet"}}
	for range *nsN {
		for _, egress := range []bool{false, true} {
			t := time.Now()
			ns, err := sandbox.NewNetns(egress)
			if err != nil {
				return nil, perBox, err
			}
			var c io.Closer
			if egress {
				if c, err = eg.Attach("bench", ns); err != nil {
					return nil, perBox, err
				}
			}
			mk[egress].ds = append(mk[egress].ds, time.Since(t))
			if c != nil {
				c.Close()
			}
			ns.Close()
		}
	}

	// Memory of -boxes namespaces held at once.
	slab0, heap0 := unreclaimable(), heap()
	type held struct {
		ns *sandbox.Netns
		c  io.Closer
	}
	var all []held
	for range *boxes {
		ns, err := sandbox.NewNetns(true)
		if err != nil {
			return nil, perBox, err
		}
		c, err := eg.Attach("bench", ns)
		if err != nil {
			return nil, perBox, err
		}
		all = append(all, held{ns, c})
	}
	slab1, heap1 := unreclaimable(), heap()
	for _, h := range all {
		h.c.Close()
		h.ns.Close()
	}

	perBox = [2]float64{float64(slab1-slab0) / float64(*boxes), float64(heap1-heap0) / float64(*boxes)}
	return mk, perBox, nil
}

// unreclaimable is the kernel's SUnreclaim in bytes.
func unreclaimable() int64 {
	b, _ := os.ReadFile("/proc/meminfo")
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == "SUnreclaim:" {
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			return kb << 10
		}
	}
	return 0
}

func heap() int64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapAlloc + m.StackInuse)
}

func ms(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e6 }
