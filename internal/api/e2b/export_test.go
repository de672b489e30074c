package e2b

// KeepaliveEvery lets the tests see keepalives without waiting 5 s.
var KeepaliveEvery = &keepaliveEvery
