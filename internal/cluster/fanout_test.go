package cluster

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/quro-dev/quro/internal/controller"
)

// TestAuditFanOut: an audit query on any node answers every live node's
// entries, merged oldest first with the node named, the latest limit of
// them; each node is asked with the caller's own credential; a node that
// does not answer is named; this node's refusal is the answer.
func TestAuditFanOut(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC)
	entries := func(secs ...int) string {
		var parts []string
		for i, s := range secs {
			parts = append(parts, fmt.Sprintf(`{"seq":%d,"time":%q,"capability":"run_code"}`, i+1, t0.Add(time.Duration(s)*time.Second).Format(time.RFC3339Nano)))
		}
		return `{"entries":[` + strings.Join(parts, ",") + `]}`
	}
	node := func(body string) *httptest.Server {
		return httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Header.Get("Authorization") != "Bearer tok" || r.Header.Get(HeaderForwardedBy) == "" || r.URL.Query().Get("limit") != "4" {
				http.Error(w, "asked without the caller's token, the header or the query", http.StatusUnauthorized)
				return
			}
			fmt.Fprint(w, body)
		}))
	}
	b, c := node(entries(2, 5)), node(entries(1, 3, 6))
	defer b.Close()
	defer c.Close()
	dead, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	deadAddr := dead.Addr().String()
	dead.Close()
	now := time.Now()
	table := &staticTable{self: "a", nodes: []Node{
		{Name: "a", Address: "unused", Renewed: now, TTL: time.Hour},
		{Name: "b", Address: strings.TrimPrefix(b.URL, "http://"), Renewed: now, TTL: time.Hour},
		{Name: "c", Address: strings.TrimPrefix(c.URL, "http://"), Renewed: now, TTL: time.Hour},
		{Name: "d", Address: deadAddr, Renewed: now, TTL: time.Hour},
		{Name: "e", Address: "unused", Renewed: now.Add(-time.Hour), TTL: time.Minute},
	}}
	entry := httptest.NewServer(&Router{Table: table, Key: []byte("0123456789abcdef0123456789abcdef"),
		Next: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Header.Get("Authorization") != "Bearer tok" {
				http.Error(w, `{"error":"no token"}`, http.StatusUnauthorized)
				return
			}
			fmt.Fprint(w, entries(4, 7))
		})})
	defer entry.Close()
	get := func(auth string) (int, string) {
		req, _ := http.NewRequest("GET", entry.URL+"/v1/audit?limit=4", nil)
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	code, body := get("Bearer tok")
	var out struct {
		Entries []struct {
			Node string    `json:"node"`
			Time time.Time `json:"time"`
		} `json:"entries"`
		Unanswered []string `json:"nodes_unanswered"`
	}
	if err := json.Unmarshal([]byte(body), &out); err != nil || code != 200 {
		t.Fatalf("%d %s", code, body)
	}
	var got []string
	for _, e := range out.Entries {
		got = append(got, fmt.Sprintf("%s@%d", e.Node, int(e.Time.Sub(t0).Seconds())))
	}
	// All seven: c@1 b@2 c@3 a@4 b@5 c@6 a@7; the latest four.
	if want := "a@4 b@5 c@6 a@7"; strings.Join(got, " ") != want {
		t.Errorf("entries %q, want %q", strings.Join(got, " "), want)
	}
	if want := "d e"; strings.Join(out.Unanswered, " ") != want {
		t.Errorf("unanswered %q, want %q", out.Unanswered, want)
	}
	if code, body := get(""); code != http.StatusUnauthorized || !strings.Contains(body, "no token") {
		t.Errorf("no token: %d %s", code, body)
	}
}

// TestAuditFanOutIsBounded: a tenant that sends the same audit query on
// many connections at once (each a sub-query on every node, each answer
// up to 8 MiB decoded here) has at most maxAuditFanOutsPerTenant of them
// out in the cluster; the rest are told 429 with Retry-After without a
// sub-query, and another tenant's query still goes out.
func TestAuditFanOutIsBounded(t *testing.T) {
	t.Parallel()
	type event struct{ tenant, what string }
	events := make(chan event, 64)
	release := make(chan struct{})
	tenantOf := map[string]string{"Bearer acme": "acme", "Bearer other": "other"}
	b := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		events <- event{tenantOf[r.Header.Get("Authorization")], "asked"}
		<-release
		fmt.Fprint(w, `{"entries":[]}`)
	}))
	defer b.Close()
	now := time.Now()
	table := &staticTable{self: "a", nodes: []Node{
		{Name: "a", Address: "unused", Renewed: now, TTL: time.Hour},
		{Name: "b", Address: strings.TrimPrefix(b.URL, "http://"), Renewed: now, TTL: time.Hour},
	}}
	entry := httptest.NewServer(&Router{Table: table, Key: []byte("0123456789abcdef0123456789abcdef"),
		Auth: func(r *http.Request) (controller.Caller, error) {
			if tn, ok := tenantOf[r.Header.Get("Authorization")]; ok {
				return controller.Caller{Tenant: tn}, nil
			}
			return controller.Caller{}, errors.New("no token")
		},
		Next: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, `{"entries":[]}`) })})
	defer entry.Close()
	codes := make(chan int, 64)
	query := func(tenant string) {
		req, _ := http.NewRequest("GET", entry.URL+"/v1/audit", nil)
		req.Header.Set("Authorization", "Bearer "+tenant)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			codes <- 0
			return
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode == http.StatusTooManyRequests {
			if resp.Header.Get("Retry-After") == "" {
				t.Errorf("a 429 without Retry-After")
			}
			events <- event{tenant, "refused"}
		}
		codes <- resp.StatusCode
	}
	const flood = 6
	for range flood {
		go query("acme")
	}
	// Each query of the flood is either asked of node b or refused.
	got := map[event]int{}
	wait := func(n int) {
		t.Helper()
		for range n {
			select {
			case e := <-events:
				got[e]++
			case <-time.After(2 * time.Minute):
				close(release)
				t.Fatalf("the queries' fates after 2 minutes: %v", got)
			}
		}
	}
	wait(flood)
	if got[event{"acme", "asked"}] != maxAuditFanOutsPerTenant || got[event{"acme", "refused"}] != flood-maxAuditFanOutsPerTenant {
		close(release)
		t.Fatalf("%d queries of one tenant at once: %v, want %d asked of the other node and the rest refused", flood, got, maxAuditFanOutsPerTenant)
	}
	go query("other")
	wait(1)
	close(release)
	if got[event{"other", "asked"}] != 1 {
		t.Fatalf("another tenant's query while the first's are out: %v", got)
	}
	ok := 0
	for range flood + 1 {
		if <-codes == http.StatusOK {
			ok++
		}
	}
	if ok != maxAuditFanOutsPerTenant+1 {
		t.Fatalf("%d queries answered, want %d", ok, maxAuditFanOutsPerTenant+1)
	}
}
