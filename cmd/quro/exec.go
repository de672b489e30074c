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
		Short: "Run a command line in a session's shell (terminal_exec), in-process",
		Long: `Run a command line in the session's shell. The session keeps its working
directory and variables across calls (they are stored), so successive
quro exec calls behave like one terminal. The exit status is the command's.`,
		Example: `  quro exec -- 'cd src && ls'
  quro exec -s work -- make test`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			a, err := g.open(cmd.Context())
			if err != nil {
				return err
			}
			defer a.Close()
			in, _ := json.Marshal(app.TerminalExecInput{Command: strings.Join(args, " "), Session: sess, TimeoutMS: timeout.Milliseconds()})
			reply, err := a.Controller.Call(cmd.Context(), g.caller(), "terminal_exec", in)
			if err != nil {
				return err
			}
			res := reply.Output.(*terminal.Result)
			if asJSON {
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				enc.Encode(res)
			} else {
				fmt.Fprint(cmd.OutOrStdout(), res.Output)
				if res.Error != "" || res.WaitingForInput || res.ShellRestarted || res.TimedOut {
					fmt.Fprintln(cmd.ErrOrStderr(), reply.Text)
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
	return cmd
}
