//go:build slim

package app

// wantPython is the engine that answers Python in this build: the slim
// build has no embedded interpreter, so the chain falls through to it.
const wantPython = "python/system"
