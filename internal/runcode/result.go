package runcode

import (
	"fmt"
	"slices"
	"strings"
)

// Artifact is a rich output of a run: a page, an image, a tree.
type Artifact struct {
	Kind string `json:"kind" jsonschema:"html, svg, png, jpeg, markdown, latex, json or text"`
	MIME string `json:"mime" jsonschema:"media type, e.g. text/html"`
	Name string `json:"name" jsonschema:"a file name for the artifact"`
	// Data is the content: base64 for png and jpeg, text for the others.
	Data string `json:"data" jsonschema:"the content: base64 for png and jpeg, text for the others"`
	// Text is the value's text/plain form beside the rich one (a
	// DataFrame's table beside its HTML), when it has one.
	Text string `json:"text,omitempty" jsonschema:"the value's plain-text form (its repr), when it has one"`
}

// Result is the one result shape of run_code, whatever the language.
//
// Error is an engine-level failure only (engine missing, crashed, timed out);
// the user code's own failure is a normal result with its message in Stderr
// and a non-zero ExitCode.
type Result struct {
	Session     string     `json:"session" jsonschema:"id of the session the code ran in"`
	Lang        string     `json:"lang" jsonschema:"the language after resolving aliases"`
	Engine      string     `json:"engine" jsonschema:"the engine that produced the result"`
	ExitCode    int        `json:"exit_code" jsonschema:"exit status; 128+N when killed by signal N"`
	Stdout      string     `json:"stdout" jsonschema:"standard output (middle cut when long; bytes that are not UTF-8 shown as \\xNN)"`
	Stderr      string     `json:"stderr" jsonschema:"standard error, same rules as stdout"`
	Error       string     `json:"error" jsonschema:"engine-level failure, empty when the engine ran the code"`
	TimedOut    bool       `json:"timed_out" jsonschema:"the run hit its timeout"`
	Interrupted bool       `json:"interrupted" jsonschema:"the run was stopped before it finished (timeout or cancel)"`
	OOMKilled   bool       `json:"oom_killed,omitempty" jsonschema:"the kernel killed the code for want of memory; a note names the limit reached"`
	Truncated   bool       `json:"truncated" jsonschema:"stdout or stderr was cut; the full output is in stdout_file/stderr_file"`
	DurationMS  float64    `json:"duration_ms" jsonschema:"wall time of the run in milliseconds"`
	Artifacts   []Artifact `json:"artifacts" jsonschema:"rich outputs: pages, images, trees"`
	StdoutBytes int64      `json:"stdout_bytes" jsonschema:"size of the whole standard output"`
	StderrBytes int64      `json:"stderr_bytes" jsonschema:"size of the whole standard error"`
	// StdoutFile and StderrFile name, relative to the session workspace, the
	// files that keep a stream whole when it was cut or had to be escaped.
	StdoutFile string   `json:"stdout_file,omitempty" jsonschema:"workspace-relative file with the full raw stdout, when cut or escaped"`
	StderrFile string   `json:"stderr_file,omitempty" jsonschema:"workspace-relative file with the full raw stderr, when cut or escaped"`
	Notes      []string `json:"notes,omitempty" jsonschema:"remarks about the run, e.g. that code was shown but not run"`

	// Toolchain languages (c, cpp, go, java, ruby, …) only.
	Toolchain string  `json:"toolchain,omitempty" jsonschema:"the compiler or interpreter of the session's userland that built and ran the code, with its version, e.g. gcc (Debian 12.2.0-14) 12.2.0"`
	Stage     string  `json:"stage,omitempty" jsonschema:"compile: the compile failed or timed out and the program did not run (exit_code is the compiler's); run: the program ran"`
	Cached    bool    `json:"cached,omitempty" jsonschema:"the build came from the session's build cache (same source and toolchain): nothing was compiled"`
	CompileMS float64 `json:"compile_ms,omitempty" jsonschema:"wall time of the build stage in milliseconds (0 when cached)"`

	// Code-context runs (run_code with context or rich) only.
	Context        string       `json:"context,omitempty" jsonschema:"the code context the code ran in"`
	Results        []RichResult `json:"results,omitempty" jsonschema:"rich mode: the last expression's value (main) and display() outputs, in order"`
	Exception      *Exception   `json:"exception,omitempty" jsonschema:"rich mode: the exception the code raised, instead of a traceback on stderr"`
	ExecutionCount int          `json:"execution_count,omitempty" jsonschema:"how many runs the context has had, this one included"`
}

// RichResult is a value a rich-mode run showed: the last expression's
// (Main) or a display() call's, in every form it has.
type RichResult struct {
	Main bool `json:"main,omitempty" jsonschema:"the value of the code's last expression (else a display() output)"`
	// Data maps a media type to the content: text for text/*,
	// image/svg+xml and application/javascript; base64 for image/png,
	// image/jpeg and application/pdf; a JSON value for application/json
	// and e2b/data (a pandas DataFrame's columns → values, as E2B's
	// kernel gives them).
	Data map[string]any `json:"data" jsonschema:"media type → content: text/plain (always), text/html, text/markdown, image/svg+xml, image/png (base64), image/jpeg (base64), application/pdf (base64), text/latex, application/json (a JSON value), application/javascript"`
}

// Exception is the exception a rich-mode run ended with.
type Exception struct {
	Name      string `json:"name" jsonschema:"the exception's class, e.g. ZeroDivisionError"`
	Value     string `json:"value" jsonschema:"its message"`
	Traceback string `json:"traceback" jsonschema:"the traceback as Python prints it, the worker's own frames left out"`
}

// AddNote adds a remark about the run (controller.Noter).
func (r *Result) AddNote(n string) { r.Notes = append(r.Notes, n) }

// Text renders the result for a model, with one template for every engine:
// the error line, stdout, stderr, then notes and artifacts, or "(no output)".
func (r *Result) Text() string {
	var b strings.Builder
	line := func(s string) {
		b.WriteString(s)
		if !strings.HasSuffix(s, "\n") {
			b.WriteByte('\n')
		}
	}
	if r.Error != "" {
		line("⚠️ error: " + r.Error)
	}
	if r.Stdout != "" {
		line(r.Stdout)
		if r.StdoutFile != "" {
			line(fmt.Sprintf("(full stdout, %s: %s)", HumanBytes(r.StdoutBytes), r.StdoutFile))
		}
	}
	if r.Stderr != "" {
		line("⚠️ stderr:")
		line(r.Stderr)
		if r.StderrFile != "" {
			line(fmt.Sprintf("(full stderr, %s: %s)", HumanBytes(r.StderrBytes), r.StderrFile))
		}
	}
	switch {
	case r.Error == "" && r.ExitCode != 0 && r.Stage == "compile":
		line(fmt.Sprintf("⚠️ compile failed (exit code %d); the program did not run", r.ExitCode))
	case r.Error == "" && r.ExitCode != 0:
		line(fmt.Sprintf("⚠️ exit code %d", r.ExitCode))
	}
	if r.Toolchain != "" {
		switch {
		case r.Stage == "compile":
			line("🔧 " + r.Toolchain)
		case r.Cached:
			line("🔧 " + r.Toolchain + " (cached build of this same source: nothing compiled)")
		case r.CompileMS > 0:
			line(fmt.Sprintf("🔧 %s (built in %.0f ms)", r.Toolchain, r.CompileMS))
		default:
			line("🔧 " + r.Toolchain)
		}
	}
	for _, n := range r.Notes {
		line("ℹ️ " + n)
	}
	budget := richTextMax
	if r.Exception != nil {
		tb := r.Exception.Traceback
		if strings.TrimSpace(tb) == "" {
			tb = r.Exception.Name + ": " + r.Exception.Value
		}
		line("⚠️ " + cutMiddle(strings.TrimRight(tb, "\n"), &budget))
	}
	for _, res := range r.Results {
		text, _ := res.Data["text/plain"].(string)
		if text != "" {
			text = cutMiddle(text, &budget)
			if res.Main {
				text = "Out: " + text
			}
			line(text)
		}
		if other := res.Forms(); len(other) > 0 {
			line("📎 also as " + strings.Join(other, ", "))
		}
	}
	for _, a := range r.Artifacts {
		line(fmt.Sprintf("📎 %s artifact %q (%s)", a.Kind, a.Name, HumanBytes(int64(len(a.Data)))))
		if a.Text != "" {
			line(cutMiddle(a.Text, &budget))
		}
	}
	if b.Len() == 0 {
		return "(no output)"
	}
	return strings.TrimRight(b.String(), "\n")
}

// richTextMax bounds, in bytes, the text of rich results, artifacts and a
// rich run's exception that Text renders: their whole forms stay in the
// structured result.
const richTextMax = 8 << 10

// cutMiddle is s within what is left of budget (which it spends): its head
// and tail around a note of what was cut, cut at UTF-8 boundaries.
func cutMiddle(s string, budget *int) string {
	if len(s) <= *budget {
		*budget -= len(s)
		return s
	}
	if *budget < 64 {
		return fmt.Sprintf("(%s of text left out: the reply's text budget is spent)", HumanBytes(int64(len(s))))
	}
	half := (*budget - 40) / 2
	*budget = 0
	head := strings.ToValidUTF8(s[:half], "")
	tail := strings.ToValidUTF8(s[len(s)-half:], "")
	return fmt.Sprintf("%s\n… (%s cut) …\n%s", head, HumanBytes(int64(len(s)-len(head)-len(tail))), tail)
}

// Forms are the media types of the result besides text/plain, sorted.
func (r RichResult) Forms() []string {
	var out []string
	for k := range r.Data {
		if k != "text/plain" {
			out = append(out, k)
		}
	}
	slices.Sort(out)
	return out
}
