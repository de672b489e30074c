package main

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/quro-dev/quro/internal/app"
	"github.com/quro-dev/quro/internal/terminal"
)

func newExecCmd(g *globals) *cobra.Command {
	var (
		sess    string
		timeout time.Duration
		asJSON  bool
	)
	cmd := &cobra.Command{
		Use:   "exec [-s SESSION] -- COMMAND...",
		Short: "Run a command line in a session's shell (terminal_exec), on the running server or in-process",
		Long: `Run a command line in the session's shell. The session keeps its working
directory and variables across calls (they are stored), so successive
quro exec calls behave like one terminal. The exit status is the command's.

It runs on the server running on the data directory, or the one named by
--server or QURO_URL, when there is one; else in-process.`,
		Example: `  quro exec -- 'cd src && ls'
  quro exec -s work -- make test`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			b, err := g.backend(cmd)
			if err != nil {
				return err
			}
			defer b.close()
			res := &terminal.Result{}
			in := app.TerminalExecInput{Command: strings.Join(args, " "), Session: sess, TimeoutMS: timeout.Milliseconds()}
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
				if res.Error != "" || res.WaitingForInput || res.ShellRestarted || res.TimedOut {
					fmt.Fprintln(cmd.ErrOrStderr(), res.Text())
				}
			}
			switch {
			case res.Running:
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
	g.serverFlags(cmd, false)
	return annotate(cmd, "terminal_exec")
}
