// Package e2b serves E2B's APIs, so that code written against the e2b and
// @e2b/code-interpreter SDKs runs against Quro unchanged: the control plane
// (REST: /sandboxes, /v2/sandboxes …), envd (Connect-RPC process.Process and
// filesystem.Filesystem, GET/POST /files, /health) and the code
// interpreter (/execute, /contexts).
//
// It is an access path like REST or MCP: every operation is a capability
// call through the controller, so scopes, tenancy, limits and the audit
// apply, and nothing here starts a process or touches a file. An E2B
// sandbox is a Quro session; a code context is a namespace in the
// session's Python worker (or a JavaScript context); an API key is a Quro
// token.
//
// Requests reach it on the server's one listener. The control plane is
// under a path prefix (/e2b, for E2B_API_URL=http://host:port/e2b) or, with
// a domain, on the host api.DOMAIN. A sandbox's own planes (envd on port
// 49983, the code interpreter on 49999) are chosen by the E2b-Sandbox-Id
// and E2b-Sandbox-Port headers the SDKs send when E2B_SANDBOX_URL is set,
// or, with a domain, by the host PORT-ID.DOMAIN. See docs/e2b.md.
package e2b
