//go:build slim

package mcp_test

// embeddedPython: the slim build has no embedded interpreter.
const embeddedPython = false
