package python

import (
	"crypto/rand"
	"encoding/hex"
	"strings"
)

// completeMarker is written last into a finished tree, before the rename.
const completeMarker = ".quro-complete"

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
