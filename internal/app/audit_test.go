package app

import (
	"strings"
	"testing"
)

// The audit log shows arguments as they were written (no \u003e for >) and
// a write's size as the bytes written, not its JSON encoding's.
func TestAuditSummaryAsWritten(t *testing.T) {
	t.Parallel()
	a := newApp(t, nil)
	if _, err := call(t, a, "write_file", WriteFileInput{Path: "a&b.txt", Content: "a > b\n"}); err != nil {
		t.Fatal(err)
	}
	if _, err := call(t, a, "write_file", WriteFileInput{Path: "bin", Content: "AAEC/w==", Encoding: "base64"}); err != nil {
		t.Fatal(err)
	}
	if _, err := call(t, a, "terminal_exec", TerminalExecInput{Command: "wc -c < 'a&b.txt' > n.txt && cat n.txt"}); err != nil {
		t.Fatal(err)
	}
	reply, err := call(t, a, "get_audit_log", AuditInput{})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		`content=<6 bytes> path="a&b.txt"`,
		`content=<4 bytes> encoding="base64" path="bin"`,
		`command="wc -c < 'a&b.txt' > n.txt && cat n.txt"`,
	} {
		if !strings.Contains(reply.Text, want) {
			t.Errorf("audit log lacks %s:\n%s", want, reply.Text)
		}
	}
	if strings.Contains(reply.Text, `\u00`) {
		t.Errorf("escapes in the audit log:\n%s", reply.Text)
	}
}
