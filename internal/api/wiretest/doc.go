// Package wiretest holds the golden wire transcripts of Quro's network
// access paths: REST (/v1/), MCP over the streamable HTTP transport (/mcp),
// the WebSocket routes (/v1/stream/{capability}, /v1/sessions/{id}/pty)
// and E2B's APIs (the control plane under /e2b; a sandbox's envd and code
// interpreter, addressed by the E2b-Sandbox-Id and E2b-Sandbox-Port
// headers).
// Each transcript, testdata/wire/NAME.txtar, is a sequence of exchanges
// that the test replays against a real server (a real App on a fresh data
// directory, the handlers mounted as `quro serve --no-auth` mounts them,
// a real HTTP listener); the server's answers, normalized, must equal the recorded
// ones. A change to any status, recorded header, field, value or error
// text fails the test; when the change is intended, rewrite the answers:
//
//	go test ./internal/api/wiretest -run Wire -update
//
// and review the diff: it is the change of the wire.
//
// # Sections
//
// A transcript's comment says what it shows. Its files come in pairs: a
// request "NN.req", written by hand, and the answer "NN.resp", written by
// -update. A request is one of:
//
//	METHOD /path          an HTTP request: header lines, a blank line, the body
//	WS /path until=COND   a WebSocket dial: header lines (Sec-WebSocket-Protocol)
//	SEND text until=COND  a text message, the body on the next lines
//	SEND binary until=COND
//
// A header line "Wire-Keep-Tools: a,b" is not sent: it cuts the tools of a
// tools/list answer to those named (the whole list is the registry's, and
// long), and fails when one is missing.
//
// A body is the section's text after the header lines and blank line,
// without its last newline. A request whose Content-Type is
// application/connect+json (a Connect stream's) sends its body as one
// enveloped message. COND is what ends the reading of the answer:
// "close" (the server closes the socket), a message type ("hello",
// "result", "error", "exit"): reading stops after the first text message
// of that type, or, for a dial only, "none": nothing is read after the
// upgrade.
//
// The answer of an HTTP request is the status, the recorded headers
// (Content-Type, Allow, Location, Mcp-Session-Id, WWW-Authenticate,
// Retry-After; others, such as Date and Content-Length, are not recorded),
// a blank line and the body: JSON indented with sorted keys; a server-sent
// event stream as its lines with each data line's JSON indented below it;
// NDJSON (application/x-ndjson) as each line's JSON, indented; a Connect
// stream (application/connect+json) as each enveloped message's JSON,
// indented, the end-of-stream message after a line "end-stream";
// anything else as it is. The answer of a dial is the status and selected
// subprotocol; the answer of a message is the messages received, a text
// message as "text" and its JSON indented, the close as "close CODE
// REASON".
//
// # Normalization
//
// Values that change from run to run are replaced by placeholders before
// the comparison, by these rules and no others:
//
//   - a string value of a JSON key "id", "session", "sandboxID" (E2B's)
//     or ending in "_id" (in an answer, where "session" is the session's
//     id), and the Mcp-Session-Id header, is an identifier: the first one
//     seen becomes $ID1, the next $ID2, … (the MCP session $MCP_SESSION);
//     a string value of a key ending in "AccessToken" (E2B's sandbox
//     access tokens) becomes $TOKEN1, $TOKEN2, …; every later occurrence
//     of such a string, anywhere (paths, headers, texts), becomes the same
//     placeholder, and a request may use the placeholder, which is
//     replaced by the real value before it is sent;
//   - the data directory of the server becomes $DATA, wherever it occurs;
//   - a run's id in a file name (20060102-150405.000000-1a2b3c4d) becomes
//     $RUN;
//   - a string that is an RFC 3339 time becomes $TIME;
//   - the numbers of the keys listed in volatileNumbers (durations, pids,
//     sizes on disk, an E2B metric's sample time and use) become the
//     string "$N";
//   - the string value of a key "version" that is the server's version
//     becomes $VERSION;
//   - keepalives, which come by the clock, are not recorded: an NDJSON
//     line {"type":"keepalive"} and a Connect stream message of a
//     keepalive event;
//   - WebSocket: the "output" messages between two other messages are
//     joined per stream, stdout first (the two pipes are read apart, so
//     neither the chunking nor the order between the streams is part of
//     the wire), and binary messages (a terminal's screen bytes: prompt
//     and echo) are not recorded.
//
// Error messages are compared as they are: they are part of the wire.
package wiretest
