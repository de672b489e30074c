package e2b

// ExecuteKeepalive lets the tests see keepalives without waiting 5 s.
var ExecuteKeepalive = &executeKeepalive

// KeepaliveInterval is the envd streams' reading of Keepalive-Ping-Interval.
var KeepaliveInterval = keepaliveInterval

// KeepaliveUnit is a second of Keepalive-Ping-Interval; the tests shorten it.
var KeepaliveUnit = &keepaliveUnit
