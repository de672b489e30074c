package e2b

import (
	"errors"
	"net/http"
	"strconv"
	"strings"
	"time"

	"connectrpc.com/connect"
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

// maxQuotedUser bounds how much of a refused user name a message repeats.
const maxQuotedUser = 64

// userRefusal is why an envd request naming user u (its Basic auth user,
// or /files' username parameter) is refused, "" when it is not: a Quro
// sandbox has one user, "user", that runs every process and owns every
// file; root or another is refused rather than silently served as it.
// The name is only quoted, never read as a format.
func (s *Server) userRefusal(u string) string {
	if u == "" || u == "user" {
		return ""
	}
	if len(u) > maxQuotedUser {
		u = u[:maxQuotedUser] + "…"
	}
	return "user " + strconv.Quote(u) + `: a Quro sandbox has one user, "user" (the session's own, which runs every process and owns every file); ` +
		"Quro " + s.version() + " runs nothing as root or another user: drop the user option"
}

// checkUser refuses a Connect request of envd that names another user
// than the sandbox's own (permission_denied).
func (s *Server) checkUser(h http.Header) error {
	if msg := s.userRefusal(user(&http.Request{Header: h})); msg != "" {
		return rpcErrorf(connect.CodePermissionDenied, msg)
	}
	return nil
}
