package e2b

import (
	"errors"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// What envd's services (process.Process in envd_process.go,
// filesystem.Filesystem in envd_fs.go) read alike from a request.

// headerKeepalive names the seconds without output after which a stream
// gets a keepalive event (the SDKs send 50; envd's default is 90).
const headerKeepalive = "Keepalive-Ping-Interval"

// The bounds of a stream's keepalive interval, in seconds.
const (
	defaultKeepaliveSeconds = 90
	maxKeepaliveSeconds     = 3600
)

// keepaliveInterval is how long an envd stream stays silent before it
// sends a keepalive: the request's Keepalive-Ping-Interval in whole
// seconds, 1 to 3600 (a larger value is an hour: seconds that overflow a
// time.Duration would turn it negative and fire the timer for ever), else
// (absent, not a positive number) envd's default, 90 s.
func keepaliveInterval(h http.Header) time.Duration {
	n, err := strconv.ParseInt(strings.TrimSpace(h.Get(headerKeepalive)), 10, 64)
	if err != nil && !errors.Is(err, strconv.ErrRange) || n <= 0 {
		n = defaultKeepaliveSeconds
	}
	return time.Duration(min(n, maxKeepaliveSeconds)) * keepaliveUnit
}

// keepaliveUnit is a second of Keepalive-Ping-Interval (the tests shorten
// it to see keepalives at once).
var keepaliveUnit = time.Second
