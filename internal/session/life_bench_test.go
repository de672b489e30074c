package session

import (
	"context"
	"testing"
	"time"

	"github.com/quro-dev/quro/internal/capability"
)

// BenchmarkLifeEnter is the cost the session's life owner adds to every
// call (issue goal: ≤ 5 µs): the entry and its release, in each mode, on
// a session already looked up (the lookup is the store's, as before).
// UseBusy adds what the calls did before the Life owned them: the use
// recorded in the store and the box asked whether it is paused.
func BenchmarkLifeEnter(b *testing.B) {
	for _, use := range []capability.Use{capability.UseRead, capability.UseHold} {
		b.Run(use.String(), func(b *testing.B) {
			var log []string
			l, _, _ := newLife(b, &log, time.Second)
			s := &Session{ID: "0123456789abcdef0123456789abcdef", Name: "bench"}
			ctx := context.Background()
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				_, release, err := l.EnterSession(ctx, s, use)
				if err != nil {
					b.Fatal(err)
				}
				release()
			}
		})
	}
}
