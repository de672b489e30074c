package app

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/quro-dev/quro/internal/capability"
)

// This file says how the capabilities are shown to a model: the tool
// profiles MCP lists, each capability's short form for a compact profile,
// its hints (MCP annotations) by meaning, and help's topics. docs/tools.md
// says why each tool of the agent profile is there.

// profiles are the tool profiles (capability.Profile) MCP lists: quro mcp
// --tools, /mcp?tools=, a token's default. A profile only chooses what is
// listed; a caller may call any capability its scope covers.
var profiles = []capability.Profile{
	{
		Name:    capability.DefaultProfile,
		Summary: "a coding agent's dozen tools, described briefly, on the default session (the default)",
		Tools: []string{"run_code", "terminal_exec", "send_input", "read_file", "write_file", "edit_file", "list_files",
			"start_process", "read_process_output", "install_packages", "get_preview_url", "help"},
		Compact: true,
	},
	{
		Name:    "sessions",
		Summary: "the agent's tools with a session argument, and the tools that make, copy and end sessions",
		Tools: []string{"run_code", "terminal_exec", "send_input", "read_file", "write_file", "edit_file", "list_files",
			"start_process", "read_process_output", "install_packages", "get_preview_url", "list_ports",
			"create_session", "list_sessions", "get_session_status", "destroy_session", "snapshot_session", "fork_session", "help"},
		Compact:     true,
		WithSession: true,
	},
	{
		Name:    "admin",
		Summary: "an operator's tools: tokens, tenants' limits, the audit log, rootfs and sessions",
		Tools: []string{"get_service_status", "list_sessions", "get_session_status", "destroy_session",
			"create_token", "list_tokens", "revoke_token", "get_tenant_limits", "set_tenant_limits", "get_audit_log", "get_egress_log",
			"install_rootfs", "install_rootfs_packages", "repair_rootfs", "remove_rootfs", "help"},
	},
	{Name: capability.FullProfile, Summary: "every capability, described in full"},
}

// brief is a capability's short form (capability.Brief): what a compact
// profile lists.
type brief struct {
	short string
	props []string
}

// briefs are the short forms of the agent profile's tools. Every word
// costs each model that lists them, on every turn: say what the tool is
// for and what a model would otherwise get wrong; the rest is in help
// {tool}. TestAgentProfileBudget counts them.
var briefs = map[string]brief{
	"run_code": {"Run code in the session and get stdout, stderr, results and images. lang: python (default; variables persist), " +
		"js, ts, bash, sh, html, svg, c, go, rust… (help languages). Long output is cut; the whole is saved in the workspace.",
		[]string{"code", "lang", "timeout_ms"}},
	"terminal_exec": {"Run a command line in the session's persistent bash (cwd, variables persist). " +
		"If it waits for input, answer with send_input.",
		[]string{"command", "timeout_ms"}},
	"send_input": {"Type into the command waiting for input (or the terminal); \"\\u0003\" interrupts it.",
		[]string{"data"}},
	"read_file": {"Read a file of the workspace (/home/user): text, an image as an image, other bytes as base64; offset/limit for a part.",
		[]string{"path", "offset", "limit"}},
	"edit_file": {"Edit a text file. command view: numbered lines (view_range [first, last]); " +
		"str_replace: old_str, which must occur once, becomes new_str; insert: new_str after line insert_line (0: top).",
		[]string{"command", "path", "old_str", "new_str", "insert_line", "view_range"}},
	"write_file": {"Write a file of the workspace, atomically; creates parent directories.",
		[]string{"path", "content", "append"}},
	"list_files": {"List a directory of the workspace (default /home/user).",
		[]string{"path", "depth"}},
	"start_process": {"Start a shell command as a process that outlives the call (a server, a watcher, a long job); " +
		"background:true returns once it runs, else the call waits for its end. read_process_output reads its output.",
		[]string{"command", "background", "tag"}},
	"read_process_output": {"A process's output since offset since (0: what is kept, the last 64 KiB), and whether it still runs.",
		[]string{"pid", "tag", "since"}},
	"install_packages": {"Install packages: manager pip for Python packages (into the session); apt, the default, for Debian packages (into the session's rootfs).",
		[]string{"manager", "packages"}},
	"get_preview_url": {"The URL of a port the session's code listens on, to open in a browser.",
		[]string{"port"}},
	"list_ports": {"The TCP ports the session's code listens on, to open with get_preview_url.", nil},
	"help": {"A short guide to Quro; help {topic} says more (languages, files, processes, packages, a tool's name).",
		[]string{"topic"}},
	"create_session": {"Create a session: its own workspace, shell, Python and network.",
		[]string{"name", "rootfs", "network"}},
	"list_sessions":      {"List your sessions.", nil},
	"get_session_status": {"A session's state, resources and limits.", nil},
	"destroy_session":    {"Destroy a session and everything in it.", nil},
	"snapshot_session":   {"Save a session's workspace and state as a snapshot.", nil},
	"fork_session":       {"Make a new session from a session or a snapshot.", nil},
}

// readOnly, readNew, etc. are the kinds of hints the table uses.
var (
	readOnly   = capability.Hints{ReadOnly: true, Idempotent: true}
	additive   = capability.Hints{}                                    // adds something new each call
	setting    = capability.Hints{Idempotent: true}                    // sets a value: again changes nothing more
	removing   = capability.Hints{Destructive: true, Idempotent: true} // removes or resets: again changes nothing more
	overwrites = capability.Hints{Destructive: true}                   // may overwrite or stop what was there
	// runsCode runs what a model wrote, which may do anything the
	// session may (delete files, reach the network it has).
	runsCode = capability.Hints{Destructive: true, OpenWorld: true}
	// fetches reaches a package index or a mirror; installing what is
	// installed changes nothing.
	fetches = capability.Hints{Idempotent: true, OpenWorld: true}
)

// hints are what each capability does, by meaning: the one table the MCP
// annotations come from. TestHintsCoverEveryCapability checks that every
// capability has its row.
var hints = map[string]capability.Hints{
	"run_code": runsCode, "terminal_exec": runsCode, "send_input": runsCode, "python_run": runsCode,
	"run_js_file": runsCode, "call_js_function": runsCode, "start_process": runsCode, "send_process_input": runsCode,

	"read_file": readOnly, "list_files": readOnly, "stat_file": readOnly, "watch_dir": readOnly,
	"read_screen": readOnly, "read_process_output": readOnly, "list_processes": readOnly, "connect_process": readOnly,
	"list_sessions": readOnly, "get_session_status": readOnly, "get_session_env": readOnly, "list_snapshots": readOnly,
	"list_code_contexts": readOnly, "get_egress_log": readOnly, "list_ports": readOnly,
	"list_tokens": readOnly, "get_tenant_limits": readOnly, "get_audit_log": readOnly,
	"get_service_status": readOnly, "list_capabilities": readOnly, "help": readOnly,

	"write_file": overwrites, "edit_file": overwrites, "move_file": overwrites, "signal_process": overwrites,
	"export_session_log": overwrites,

	"remove_file": removing, "destroy_session": removing, "delete_snapshot": removing, "remove_code_context": removing,
	"restart_code_context": removing, "reset_python": removing, "revoke_token": removing, "remove_rootfs": removing,
	"close_process_stdin": removing,

	"create_session": additive, "fork_session": additive, "snapshot_session": additive, "create_code_context": additive,
	"create_project": additive, "create_token": additive, "open_terminal": additive,

	"make_dir": setting, "resize_process": setting, "pause_session": setting, "resume_session": setting,
	"set_default_session": setting, "set_session_env": setting, "set_session_timeout": setting,
	"set_session_network": setting, "set_session_secret": setting, "get_preview_url": setting, "set_tenant_limits": setting, "repair_rootfs": setting,

	"install_packages": fetches, "install_rootfs": fetches, "install_rootfs_packages": fetches,
}

// describeTools gives every capability of reg its hints and brief, adds
// the profiles, and returns reg, once every capability is registered. A
// brief or hint of a capability reg lacks is skipped.
func describeTools(reg *capability.Registry) *capability.Registry {
	for _, c := range reg.List() {
		if h, ok := hints[c.Name]; ok {
			c.Hints = h
		} else {
			c.Hints = capability.Hints{Destructive: true, OpenWorld: true} // unknown: assume the worst
		}
		if b, ok := briefs[c.Name]; ok {
			c.Brief(b.short, b.props...)
		}
	}
	for _, p := range profiles {
		if p.Name != capability.FullProfile {
			reg.AddProfile(p)
		}
	}
	return reg
}

// HelpInput is help's input.
type HelpInput struct {
	Topic string `json:"topic,omitempty" jsonschema:"a topic (languages, python, sessions, terminal, files, processes, contexts, network, packages, admin, profiles, tools) or a tool's name"`
}

// topic is one of help's topics: a few sentences and the tools it is about.
type topic struct {
	intro string
	tools []string
}

// topics are help's topics but languages, profiles and tools, which are
// made from the runner and the registry.
var topics = map[string]topic{
	"python": {"run_code's python is the session's own interpreter — the embedded CPython 3.14 on the host userland, the rootfs's python3 on a session created on a rootfs — the same as python3 and pip in its shell. " +
		"A resident worker runs it: variables and imports persist between runs; a timeout is a KeyboardInterrupt that keeps them; the last expression and display() become results, matplotlib figures PNG images. " +
		"%pip install X (or !pip install X) installs into the session's user site and imports at once. " +
		"python_run is a fresh python3 -I of a Debian rootfs (the session's, else \"default\") per call, for Debian's packages or a clean interpreter each time, with nothing kept.",
		[]string{"run_code", "python_run", "reset_python"}},
	"sessions": {"Every tool takes an optional session (id or name); without one the default session is used. " +
		"A session has its own workspace (/home/user), shell, Python, processes and network policy, kept between calls until it is destroyed or times out.",
		[]string{"create_session", "list_sessions", "get_session_status", "destroy_session", "set_default_session", "set_session_timeout",
			"set_session_env", "get_session_env", "pause_session", "resume_session", "snapshot_session", "fork_session", "list_snapshots",
			"delete_snapshot", "export_session_log"}},
	"terminal": {"terminal_exec runs a command line in the session's persistent bash: its directory, variables and functions stay between calls. " +
		"A command that waits for input returns with waiting_for_input: answer with send_input (\"yes\\n\"), or interrupt with \"\\u0003\". " +
		"Long output is cut to head and tail; output_file keeps it whole.",
		[]string{"terminal_exec", "send_input", "open_terminal", "read_screen"}},
	"files": {"Paths are relative to the workspace, /home/user, or absolute inside it. " +
		"read_file answers text, an image as an image, other bytes as base64; offset and limit read a part of a big file. write_file replaces a file atomically (append=true adds to it).",
		[]string{"read_file", "write_file", "edit_file", "list_files", "stat_file", "make_dir", "move_file", "remove_file", "watch_dir", "create_project"}},
	"processes": {"start_process runs a shell command (or cmd with args, a program) that outlives the call, found by pid or tag; background=true returns once it runs, " +
		"or with its exit code and output if it ended at once. read_process_output {since} reads its last 64 KiB; connect_process follows it. " +
		"list_ports lists the ports the session's servers listen on; get_preview_url opens one.",
		[]string{"start_process", "read_process_output", "list_processes", "connect_process", "send_process_input", "close_process_stdin",
			"signal_process", "resize_process", "get_preview_url", "list_ports"}},
	"contexts": {"A code context is a separate interpreter state in a session (python, js/ts or bash): run_code {context} runs in it.",
		[]string{"create_code_context", "list_code_contexts", "restart_code_context", "remove_code_context", "run_js_file", "call_js_function"}},
	"network": {"A session's network is none (loopback only; the default unless the operator chose another), internet (public addresses through the server's egress, " +
		"optionally held to allow_out and deny_out) or host. set_session_secret gives code a placeholder the egress swaps for the value only in requests to the secret's hosts. A run that failed on a refused connection says which and what would allow it. " +
		"A port the session's code listens on is reached through get_preview_url.",
		[]string{"set_session_network", "set_session_secret", "get_egress_log", "get_preview_url", "list_ports"}},
	"packages": {"install_packages with manager pip installs Python packages into the session (wheels from the tenant's cache; the server fetches missing ones). " +
		"Without manager it is apt: Debian packages into the session's rootfs (create_session rootfs=NAME), shared by every session on it; that needs scope install. " +
		"In run_code's python, %pip install X works too.",
		[]string{"install_packages", "install_rootfs", "install_rootfs_packages", "repair_rootfs", "remove_rootfs"}},
	"admin": {"Tokens belong to a tenant and hold scopes: read, exec, install, admin. The audit log records every call.",
		[]string{"create_token", "list_tokens", "revoke_token", "get_tenant_limits", "set_tenant_limits", "get_audit_log", "get_service_status", "list_capabilities"}},
}

// topicNames are help's topics, sorted.
func topicNames() []string {
	return slices.Sorted(func(yield func(string) bool) {
		for _, n := range append(slices.Collect(maps.Keys(topics)), "languages", "profiles", "tools") {
			if !yield(n) {
				return
			}
		}
	})
}

// helpGuide is help without a topic: at most 300 tokens (a test counts).
const helpGuide = `Quro runs code and commands in isolated, persistent sessions. The workspace is /home/user; relative paths start there. Files, installed packages, the shell's directory and Python's variables persist between calls.
- run_code: Python (state kept), JS/TS, shell, C, Go and more; html and svg are rendered.
- terminal_exec: a command in the session's bash; send_input answers a prompt.
- read_file, write_file, edit_file, list_files: the workspace's files.
- start_process, read_process_output: servers and long jobs; get_preview_url opens a port.
- install_packages: pip or apt packages.
Every tool takes an optional session (id or name); without it the default session is used. Errors say what to do next.
More: help {topic}: `

// help answers help's input.
func (a *App) help(reg *capability.Registry, in HelpInput) (*Help, error) {
	t := strings.TrimSpace(strings.ToLower(in.Topic))
	var b strings.Builder
	switch t {
	case "":
		b.WriteString(helpGuide + strings.Join(topicNames(), ", ") + "; or a tool's name.")
	case "languages":
		a.helpLanguages(&b)
	case "profiles":
		b.WriteString("MCP lists one profile of tools (quro mcp --tools P, /mcp?tools=P, a token's default); any tool your scope allows may be called.\n")
		for _, n := range reg.ProfileNames() {
			p, _ := reg.Profile(n)
			fmt.Fprintf(&b, "- %s: %s", n, p.Summary)
			if p.Tools != nil {
				fmt.Fprintf(&b, " (%s)", strings.Join(p.Tools, ", "))
			}
			b.WriteString("\n")
		}
	case "tools":
		for _, c := range reg.List() {
			fmt.Fprintf(&b, "- %s: %s\n", c.Name, summary(c))
		}
	default:
		if tp, ok := topics[t]; ok {
			b.WriteString(tp.intro + "\n")
			for _, n := range tp.tools {
				if c, ok := reg.Get(n); ok {
					fmt.Fprintf(&b, "- %s: %s\n", c.Name, summary(c))
				}
			}
			b.WriteString("help {tool} gives a tool's description and every input.")
			break
		}
		c, ok := reg.Get(t)
		if !ok {
			return nil, capability.Errorf(capability.InvalidArgument, "help has no topic %q: the topics are %s, or a tool's name", in.Topic, strings.Join(topicNames(), ", "))
		}
		fmt.Fprintf(&b, "%s (scope %s): %s\nInputs:\n", c.Name, c.Scope, c.Description)
		for _, f := range slices.Sorted(maps.Keys(c.InputSchema.Properties)) {
			req := ""
			if slices.Contains(c.InputSchema.Required, f) {
				req = ", required"
			}
			fmt.Fprintf(&b, "- %s (%s%s): %s\n", f, typeName(c.InputSchema.Properties[f].Type, c.InputSchema.Properties[f].Types), req, c.InputSchema.Properties[f].Description)
		}
	}
	return &Help{Guide: strings.TrimRight(b.String(), "\n")}, nil
}

// summary is a capability in a line: its brief, else its description's
// first sentence.
func summary(c *capability.Capability) string {
	if c.Short != "" {
		return c.Short
	}
	if i := strings.Index(c.Description, ". "); i > 0 {
		return c.Description[:i+1]
	}
	return c.Description
}

func typeName(t string, ts []string) string {
	if t != "" {
		return t
	}
	return strings.Join(ts, " or ")
}

// helpLanguages is help languages: what run_code accepts and what runs
// here now.
func (a *App) helpLanguages(b *strings.Builder) {
	opts := a.Runner.Options()
	b.WriteString("run_code's lang (default python) is one of: " + strings.Join(a.Runner.SortedAliases(), "; ") + ".\n")
	b.WriteString("python and the shells run in the session's sandbox with the workspace as working directory. " +
		"bash runs bash (an error if the box has none), sh runs POSIX sh, shell runs bash when the box has it and sh otherwise — the result's engine says which (shell/bash, shell/sh).\n")
	b.WriteString("js and ts run in an embedded QuickJS sandbox (no node; ts is transpiled by esbuild; console, CommonJS require of workspace files, " +
		"the last expression or module.exports shown as ➡️ result, and a host API Tools.Files/Net/System/calc confined to the workspace; memory capped at 64 MiB; a fresh context per run).\n")
	b.WriteString("node runs real Node.js in the session's box where its userland has node (a resident worker: top-level declarations kept between runs, top-level await, require of Node's modules and of /home/user/node_modules, the last value printed), else QuickJS with a note; " +
		"code contexts of javascript/typescript (create_code_context) run on that Node too.\n")
	b.WriteString("html, css, json, xml and svg are validated and rendered as artifacts.\n")
	b.WriteString("c, cpp, go, rust, java, kotlin, csharp, swift, scala, zig, haskell, dart, objc, fortran, pascal, ruby, php, perl, lua, r and julia run with the toolchain of the session's userland " +
		"(the host's, or the session's rootfs: install_packages adds one): compiled in the session's box into a build cache keyed by the source's SHA-256 (the same source is not compiled again), then run with stdin and args. " +
		"A compile failure is a result with stage \"compile\" and the compiler's diagnostics on stderr (the source file, e.g. main.c, has the code's line numbers); compile_timeout_ms bounds the compile apart from timeout_ms; the result's toolchain names the compiler. " +
		"Where the userland has no toolchain the code is shown highlighted, NOT run, and a note names the Debian package that adds it.\n")
	fmt.Fprintf(b, "stdout is cut to %d KiB and stderr to %d KiB keeping head and tail; the whole is saved in the workspace (stdout_file, stderr_file).\n", opts.MaxStdout>>10, opts.MaxStderr>>10)
	runs, shown := a.Runner.Runnable()
	b.WriteString("run_code runs these on this server's own userland now: " + strings.Join(runs, ", ") + "\n")
	if len(shown) > 0 {
		b.WriteString("Only shown highlighted here (no toolchain in the host userland; a session on a rootfs runs them once its rootfs has one — install_packages adds it):\n")
		for _, n := range slices.Sorted(maps.Keys(shown)) {
			fmt.Fprintf(b, "- %s: %s\n", n, shown[n])
		}
	}
}

func (a *App) registerHelp(reg *capability.Registry) {
	reg.Register(capability.New("help",
		"A short guide to Quro for models; help {topic} says more: the languages run_code accepts, sessions, files, processes, packages, the tool profiles, "+
			"every tool in a line (tools), or one tool's description and inputs (its name).",
		capability.ScopeRead, func(ctx context.Context, in HelpInput) (*Help, error) { return a.help(reg, in) }))
}
