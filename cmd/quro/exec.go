package main

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/quro-dev/quro/internal/app"
	"github.com/quro-dev/quro/internal/terminal"
)

// maxExecInput bounds the standard input quro exec passes: it travels
// base64-encoded in one request (the server takes 16 MiB).
const maxExecInput = 8 << 20

func newExecCmd(g *globals) *cobra.Command {
	var (
		sess    string
		timeout time.Duration
		asJSON  bool
		input   string
		noStdin bool
	)
	cmd := &cobra.Command{
		Use:   "exec [-s SESSION] -- COMMAND...",
		Short: "Run a command line in a session's shell (terminal_exec), on the running server or in-process",
		Long: `Run a command line in the session's shell. The session keeps its working
directory and variables across calls (they are stored), so successive
quro exec calls behave like one terminal. The exit status is the command's.

The command reads what is piped to quro exec, or the --input string, then
end of input; with neither (standard input a terminal, or -n) it reads
end of input at once, so a command that asks for input never waits. For
an interactive program use quro term.

It runs on the server running on the data directory, or the one named by
--server or QURO_URL, when there is one; else in-process.`,
		Example: `  quro exec -- 'cd src && ls'
  quro exec -s work -- make test
  cat data.csv | quro exec -- 'python3 stats.py'
  quro exec --input 42 -- 'read n; echo $((n + 1))'`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var stdin []byte
			switch {
			case cmd.Flags().Changed("input"):
				stdin = []byte(input + "\n")
			case !noStdin:
				var err error
				if stdin, err = pipedInput(cmd.InOrStdin()); err != nil {
					return err
				}
			}
			b, err := g.backend(cmd)
			if err != nil {
				return err
			}
			defer b.close()
			res := &terminal.Result{}
			in := app.TerminalExecInput{Command: withInput(strings.Join(args, " "), stdin), Session: sess, TimeoutMS: timeout.Milliseconds()}
			if err := b.output(cmd.Context(), "terminal_exec", in, res); err != nil {
				return err
			}
			if asJSON {
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				if err := enc.Encode(res); err != nil {
					return err // the result did not reach stdout
				}
			} else {
				fmt.Fprint(cmd.OutOrStdout(), res.Output)
				if res.Error != "" || res.ShellRestarted || res.TimedOut {
					fmt.Fprintln(cmd.ErrOrStderr(), res.Text())
				}
			}
			switch {
			case res.Running:
				fmt.Fprintln(cmd.ErrOrStderr(), `quro: the command is still running in the session's shell; quro call send_input '{"data":"\u0003"}' (with "session" if not the default) stops it`)
				return &exitError{125}
			case res.ExitCode != 0:
				return &exitError{min(max(res.ExitCode, 1), 255)}
			}
			return nil
		},
	}
	cmd.Flags().StringVarP(&sess, "session", "s", "", "session id or name (default session when empty)")
	cmd.Flags().DurationVarP(&timeout, "timeout", "t", 0, "time budget, e.g. 10s (default 30s)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the structured result as JSON")
	cmd.Flags().StringVar(&input, "input", "", "the command's standard input: STRING and a newline (as bash's <<<), instead of what is piped")
	cmd.Flags().BoolVarP(&noStdin, "no-stdin", "n", false, "do not read standard input: the command reads end of input (as ssh -n)")
	g.serverFlags(cmd, false)
	return annotate(cmd, "terminal_exec")
}

// pipedInput reads the standard input of quro exec when something is
// piped or redirected to it: not from a terminal or another character
// device (/dev/null), whose input is none.
func pipedInput(r io.Reader) ([]byte, error) {
	if f, ok := r.(*os.File); ok {
		fi, err := f.Stat()
		switch {
		case errors.Is(err, syscall.EBADF) || errors.Is(err, os.ErrClosed):
			return nil, nil // no standard input at all
		case err != nil:
			return nil, fmt.Errorf("standard input: %w (-n leaves it unread)", err)
		case fi.Mode()&os.ModeCharDevice != 0:
			return nil, nil
		}
	}
	b, err := io.ReadAll(io.LimitReader(r, maxExecInput+1))
	if err != nil {
		return nil, fmt.Errorf("reading standard input: %w", err)
	}
	if len(b) > maxExecInput {
		return nil, fmt.Errorf("standard input is over %d MiB, more than quro exec passes: copy the data into the session (quro call write_file) and read it from there", maxExecInput>>20)
	}
	return b, nil
}

// withInput makes command read stdin, then end of input, in the
// session's shell. A brace group runs in the command's own shell, so that
// cd and variables still carry over to the next command; the bytes travel
// base64-encoded in a quoted heredoc (any byte, NUL too, arrives as sent).
// Without input the command reads /dev/null: it never waits for input
// nobody can send.
func withInput(command string, stdin []byte) string {
	if len(stdin) == 0 {
		return "{\n" + command + "\n} </dev/null"
	}
	enc := base64.StdEncoding.EncodeToString(stdin)
	var b strings.Builder
	b.WriteString("{\n" + command + "\n} < <(base64 -d <<'QURO_STDIN'\n")
	for len(enc) > 76 {
		b.WriteString(enc[:76] + "\n")
		enc = enc[76:]
	}
	b.WriteString(enc + "\nQURO_STDIN\n)")
	return b.String()
}
