//go:build !slim

package mcp_test

// embeddedPython: this build has the embedded interpreter (and its rich
// display hooks).
const embeddedPython = true
