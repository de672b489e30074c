package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/quro-dev/quro/internal/app"
	"github.com/quro-dev/quro/internal/runcode"
)

func newRunCmd(g *globals) *cobra.Command {
	var (
		code, lang, sess string
		timeout          time.Duration
		asJSON           bool
	)
	cmd := &cobra.Command{
		Use:   "run [FILE]",
		Short: "Run code through run_code, on the running server or in-process",
		Long: `Run code from -c, a file, or standard input through run_code. The language
is --lang, else the file's extension, else python.

When a server runs on the data directory (quro serve), or one is named with
--server or QURO_URL, the code runs there: in the server's sessions, whose
Python variables persist from one quro run to the next. Otherwise it runs
in-process, and Python variables last as long as this command.

The program's stdout is printed on stdout and its stderr on stderr; quro's
own remarks (errors, the exit code, notes, artifacts) go to stderr. --json
prints the whole result on stdout instead. The exit status is the
program's; 124 when it timed out, 125 when no engine could run it.`,
		Example: `  quro run -c 'print(6*7)'
  quro run script.sh
  echo '{"a":1}' | quro run --lang json`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			src, guessed, err := readCode(cmd, code, args, g.stdin)
			if err != nil {
				return err
			}
			if lang == "" {
				lang = guessed
			}
			b, err := g.backend(cmd)
			if err != nil {
				return err
			}
			defer b.close()
			res := &runcode.Result{}
			in := app.RunCodeInput{Code: src, Lang: lang, Session: sess, TimeoutMS: timeout.Milliseconds()}
			if err := b.output(cmd.Context(), "run_code", in, res); err != nil {
				return err
			}
			if asJSON {
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetEscapeHTML(false)
				enc.SetIndent("", "  ")
				if err := enc.Encode(res); err != nil {
					return err // the result did not reach stdout
				}
			} else if err := printRun(cmd.OutOrStdout(), cmd.ErrOrStderr(), res, b.app != nil); err != nil {
				return err
			}
			switch {
			case res.TimedOut:
				return &exitError{124}
			case res.Error != "":
				return &exitError{125}
			case res.ExitCode != 0:
				return &exitError{min(max(res.ExitCode, 1), 255)}
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVarP(&code, "code", "c", "", "code to run")
	f.StringVarP(&lang, "lang", "l", "", "language or alias (default: from the file extension, else python)")
	f.StringVarP(&sess, "session", "s", "", "session id or name (default session when empty)")
	f.DurationVarP(&timeout, "timeout", "t", 0, "time budget, e.g. 5s (default 30s)")
	f.BoolVar(&asJSON, "json", false, "print the structured result as JSON")
	g.serverFlags(cmd, false)
	return annotate(cmd, "run_code")
}

// printRun prints a result in text mode: the program's stdout on out, its
// stderr and every remark on errw, in the order of runcode.Result.Text.
// inProcess adds that Python variables do not outlive this command. It
// returns the error of a write to out: output that did not reach stdout (a
// full disk, a closed pipe) fails the command. Remarks on errw are best
// effort, like the rest of the CLI's messages.
func printRun(out, errw io.Writer, r *runcode.Result, inProcess bool) error {
	lined := func(s string) string {
		if !strings.HasSuffix(s, "\n") {
			s += "\n"
		}
		return s
	}
	line := func(w io.Writer, s string) { _, _ = io.WriteString(w, lined(s)) }
	if r.Error != "" {
		line(errw, "⚠️ error: "+r.Error)
		if inProcess && strings.Contains(r.Error, "keeps its variables") {
			line(errw, "ℹ️ in-process (no server runs on the data directory), the session's variables last only as long as this command; with quro serve running they persist between runs")
		}
	}
	var outErr error
	if r.Stdout != "" {
		_, outErr = io.WriteString(out, lined(r.Stdout))
	}
	if r.Stderr != "" {
		line(errw, r.Stderr)
	}
	if r.StdoutFile != "" {
		line(errw, fmt.Sprintf("(full stdout, %s: %s)", runcode.HumanBytes(r.StdoutBytes), r.StdoutFile))
	}
	if r.StderrFile != "" {
		line(errw, fmt.Sprintf("(full stderr, %s: %s)", runcode.HumanBytes(r.StderrBytes), r.StderrFile))
	}
	if r.Error == "" && r.ExitCode != 0 {
		line(errw, fmt.Sprintf("⚠️ exit code %d", r.ExitCode))
	}
	for _, n := range r.Notes {
		line(errw, "ℹ️ "+n)
	}
	for _, a := range r.Artifacts {
		line(errw, fmt.Sprintf("📎 %s artifact %q (%s)", a.Kind, a.Name, runcode.HumanBytes(int64(len(a.Data)))))
	}
	return outErr
}

// readCode takes the code from -c, a file, or stdin, and guesses the
// language from a file's extension.
func readCode(cmd *cobra.Command, code string, args []string, stdin io.Reader) (string, string, error) {
	switch {
	case code != "" && len(args) > 0:
		return "", "", errors.New("give the code with -c or as a file, not both")
	case cmd.Flags().Changed("code"):
		return code, "", nil
	case len(args) == 1 && args[0] != "-":
		b, err := os.ReadFile(args[0])
		if err != nil {
			return "", "", err
		}
		return string(b), strings.TrimPrefix(filepath.Ext(args[0]), "."), nil
	}
	if f, ok := stdin.(*os.File); ok {
		if fi, err := f.Stat(); err == nil && fi.Mode()&os.ModeCharDevice != 0 {
			return "", "", errors.New("no code: pass -c CODE, a FILE, or pipe the code into standard input")
		}
	}
	b, err := io.ReadAll(stdin)
	return string(b), "", err
}
