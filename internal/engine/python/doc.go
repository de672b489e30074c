// Package python holds run_code's Python engines. internal/app puts them in
// one chain, tried in order (runcode's fallback rule: the next engine is
// used only when one fails at engine level with no output at all, such as
// an engine that is unavailable or a session it does not serve; code that
// ran answers, whatever it did):
//
//  1. Embedded: CPython from go-embed-python, extracted once per data
//     directory, run as a resident worker per session (worker/quro_worker.py)
//     spawned in the session's box; a session's globals persist between its
//     runs. The slim build (-tags slim) replaces it with a stand-in that is
//     never available.
//  2. Rootfs: python3 inside the session's Debian rootfs, one process per
//     run, for sessions created with a rootfs; other sessions pass through.
//     python_run (internal/app) runs code in a named rootfs the same way.
//  3. System: the host's python3, one process per run.
//  4. GPython: a pure-Go subset of Python, run in a re-executed quro child
//     so that a timeout can kill it.
//
// Every run of code is started through internal/sandbox, and nothing here
// signals or waits for one except through sandbox.Process. (System's Probe
// asks the host's python3 for its version directly: the server's own
// check, with no user code.)
package python
