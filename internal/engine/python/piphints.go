package python

// The hints pip's shims in a session end a failure with network; every
// build names them (the slim build's tests too), though only the embedded
// interpreter's pip is shimmed.

// UnreachableHint and NotOnIndexHint end a failed pip run in a session
// with network, as pip's verbose log (PIP_LOG) tells: pip words both
// "from versions: none".
const (
	UnreachableHint = "quro: pip could not reach the package index (PIP_INDEX_URL, or the server's): the session's network policy (allow_out, egress) or the index setting is why, not the package name"
	NotOnIndexHint  = "quro: the package index answered and has no version of it for this Python: check the name and version"
)
