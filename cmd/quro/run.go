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
	"github.com/quro-dev/quro/internal/capability"
	"github.com/quro-dev/quro/internal/controller"
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
		Short: "Run code through run_code, in-process",
		Long: `Run code from -c, a file, or standard input through the same controller
that quro serve uses. The language is --lang, else the file's extension, else
python. The exit status is the program's; 124 when it timed out, 125 when no
engine could run it.`,
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
			a, err := g.open(cmd.Context())
			if err != nil {
				return err
			}
			defer a.Close()
			in, _ := json.Marshal(app.RunCodeInput{Code: src, Lang: lang, Session: sess, TimeoutMS: timeout.Milliseconds()})
			reply, err := a.Controller.Call(cmd.Context(), controller.Caller{Path: "cli", Scope: capability.ScopeAdmin}, "run_code", in)
			if err != nil {
				return err
			}
			res := reply.Output.(*runcode.Result)
			out := cmd.OutOrStdout()
			if asJSON {
				enc := json.NewEncoder(out)
				enc.SetEscapeHTML(false)
				enc.SetIndent("", "  ")
				enc.Encode(res)
			} else {
				fmt.Fprintln(out, reply.Text)
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
	return cmd
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
