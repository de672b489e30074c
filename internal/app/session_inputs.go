package app

// The inputs that name a session (capability.SessionInput): the
// controller enters the session SessionRef names, in the mode the
// capability declares (InSession), before its handler runs.

// SessionRef is the session the input names.
func (in SessionRef) SessionRef() string { return in.Session }

// SessionRef is the session the input names.
func (in TerminalExecInput) SessionRef() string { return in.Session }

// SessionRef is the session the input names.
func (in SendInputInput) SessionRef() string { return in.Session }

// SessionRef is the session the input names.
func (in SetTimeoutInput) SessionRef() string { return in.Session }

// SessionRef is the session the input names.
func (in SetEnvInput) SessionRef() string { return in.Session }

// SessionRef is the session the input names.
func (in ExportLogInput) SessionRef() string { return in.Session }

// SessionRef is the session the input names.
func (in RunCodeInput) SessionRef() string { return in.Session }

// SessionRef is the session the input names.
func (in CodeContextInput) SessionRef() string { return in.Session }

// SessionRef is the session the input names.
func (in CodeContextRef) SessionRef() string { return in.Session }

// SessionRef is the session the input names.
func (in ReadFileInput) SessionRef() string { return in.Session }

// SessionRef is the session the input names.
func (in WriteFileInput) SessionRef() string { return in.Session }

// SessionRef is the session the input names.
func (in ListFilesInput) SessionRef() string { return in.Session }

// SessionRef is the session the input names.
func (in CreateProjectInput) SessionRef() string { return in.Session }

// SessionRef is the session the input names.
func (in EditFileInput) SessionRef() string { return in.Session }

// SessionRef is the session the input names.
func (in PathInput) SessionRef() string { return in.Session }

// SessionRef is the session the input names.
func (in MoveFileInput) SessionRef() string { return in.Session }

// SessionRef is the session the input names.
func (in WatchDirInput) SessionRef() string { return in.Session }

// SessionRef is the session the input names.
func (in RunJSFileInput) SessionRef() string { return in.Session }

// SessionRef is the session the input names.
func (in CallJSFunctionInput) SessionRef() string { return in.Session }

// SessionRef is the session the input names.
func (in InstallPackagesInput) SessionRef() string { return in.Session }

// SessionRef is the session the input names.
func (in ProcessSelector) SessionRef() string { return in.Session }

// SessionRef is the session the input names.
func (in StartProcessInput) SessionRef() string { return in.Session }

// SessionRef is the session the input names.
func (in PythonRunInput) SessionRef() string { return in.Session }

// SessionRef is the session the input names.
func (in SnapshotInput) SessionRef() string { return in.Session }

// SessionRef is the session the input names.
func (in ForkInput) SessionRef() string { return in.Session }

// NamesSession is false for a fork of a snapshot, which names no session
// (the controller enters none); one that names both is refused by the
// handler, before any lookup.
func (in ForkInput) NamesSession() bool { return in.Session != "" && in.Snapshot == "" }

// SessionRef is the session set_session_network changes.
func (in SetNetworkInput) SessionRef() string { return in.Session }

// SessionRef is the session set_session_secret gives a secret.
func (in SetSecretInput) SessionRef() string { return in.Session }

// SessionRef is the session whose egress log get_egress_log reads.
func (in EgressLogInput) SessionRef() string { return in.Session }

// SessionRef is the session the input names.
func (in PreviewURLInput) SessionRef() string { return in.Session }
