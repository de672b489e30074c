package auth

import (
	"context"
	"regexp"
	"strings"
	"testing"
)

// The E2B form of a token passes the SDKs' key check, names the same
// token (tenant, scopes, id), and is refused exactly as the Quro form is:
// a changed secret, a changed id, a revoked token, a malformed key.
func TestE2BForm(t *testing.T) {
	ctx := context.Background()
	tk, _ := newTokens(t)
	iss, err := tk.Create(ctx, "acme", []string{"read", "exec"}, "sdk")
	if err != nil {
		t.Fatal(err)
	}
	// The Python SDK's and JS SDK 2.45's check.
	if !regexp.MustCompile(`^e2b_[0-9a-f]+$`).MatchString(iss.E2BKey) {
		t.Fatalf("E2B key %q does not pass the SDKs' check", iss.E2BKey)
	}
	if again, err := E2BForm(iss.Token); err != nil || again != iss.E2BKey {
		t.Fatalf("E2BForm = %q, %v; issued %q", again, err, iss.E2BKey)
	}
	want, err := tk.Verify(ctx, iss.Token)
	if err != nil {
		t.Fatal(err)
	}
	got, err := tk.Verify(ctx, iss.E2BKey)
	if err != nil || got != want {
		t.Fatalf("E2B form: %+v, %v; Quro form: %+v", got, err, want)
	}

	// Another secret under the same id: the hash check refuses it.
	last := iss.E2BKey[len(iss.E2BKey)-1]
	flip := byte('0')
	if last == '0' {
		flip = '1'
	}
	_, err = tk.Verify(ctx, iss.E2BKey[:len(iss.E2BKey)-1]+string(flip))
	wantUnauthenticated(t, err, "unknown token")
	// Another token's id with this secret.
	other, err := tk.Create(ctx, "evil", []string{"read"}, "")
	if err != nil {
		t.Fatal(err)
	}
	swapped := "e2b_" + other.ID + iss.E2BKey[len("e2b_")+12:]
	_, err = tk.Verify(ctx, swapped)
	wantUnauthenticated(t, err, "unknown token")
	// Malformed: uppercase, short, long, not hex, empty.
	for _, bad := range []string{
		"e2b_" + strings.ToUpper(iss.E2BKey[4:]),
		iss.E2BKey[:len(iss.E2BKey)-2],
		iss.E2BKey + "00",
		"e2b_" + strings.Repeat("g", 76),
		"e2b_",
	} {
		_, err = tk.Verify(ctx, bad)
		wantUnauthenticated(t, err, "malformed API key")
	}
	// Revoked by its E2B form: neither form works any more.
	if err := tk.Revoke(ctx, iss.E2BKey); err != nil {
		t.Fatal(err)
	}
	_, err = tk.Verify(ctx, iss.E2BKey)
	wantUnauthenticated(t, err, "revoked")
	_, err = tk.Verify(ctx, iss.Token)
	wantUnauthenticated(t, err, "revoked")
	if _, err := E2BForm("quro_abc_def"); err == nil {
		t.Fatal("a token with a short id and secret has no E2B form")
	}
}
