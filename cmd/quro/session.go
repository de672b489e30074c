package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/quro-dev/quro/internal/app"
)

// sessionOutput calls a capability through the command's backend (the
// running server, else in-process) and decodes its output into out.
func (g *globals) sessionOutput(cmd *cobra.Command, name string, in, out any) error {
	b, err := g.backend(cmd)
	if err != nil {
		return err
	}
	defer b.close()
	return b.output(cmd.Context(), name, in, out)
}

// sessionText is sessionOutput for the text a model reads.
func (g *globals) sessionText(cmd *cobra.Command, name string, in any) (string, error) {
	b, err := g.backend(cmd)
	if err != nil {
		return "", err
	}
	defer b.close()
	return b.text(cmd.Context(), name, in)
}

func newSessionCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "session",
		Short: "Create, list, inspect, snapshot, fork and destroy sessions; set their variables",
		Long: `Create, list, inspect, snapshot, fork and destroy sessions; set their variables. These
commands go through the server running on the data directory (or the one
named by --server or QURO_URL) when there is one, else run in-process.`,
	}
	g.serverFlags(cmd, true)
	cmd.AddCommand(newSessionCreateCmd(g), newSessionListCmd(g), newSessionStatusCmd(g),
		newSessionDestroyCmd(g), newSessionPauseCmd(g), newSessionResumeCmd(g),
		newSessionDefaultCmd(g), newSessionEnvCmd(g))
	cmd.AddCommand(snapshotCmds(g)...)
	for _, c := range cmd.Commands() {
		annotate(c, sessionCapabilities[c.Name()]...)
	}
	return cmd
}

// newSessionCreateCmd is `quro session create`.
func newSessionCreateCmd(g *globals) *cobra.Command {
	var network, rootfs string
	cmd := &cobra.Command{
		Use:   "create [NAME]",
		Short: "Create a session (a fresh workspace); prints its id and name",
		Args:  cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			in := app.CreateSessionInput{Network: network, Rootfs: rootfs}
			if len(args) == 1 {
				in.Name = args[0]
			}
			s := &app.SessionInfo{}
			if err := g.sessionOutput(cmd, "create_session", in, s); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s %s\n", s.ID, s.Name)
			return nil
		},
	}
	cmd.Flags().StringVar(&network, "network", "", "network policy: none (loopback only; the server's default unless its operator chose another), internet (public addresses through the server's egress) or host (the host's network, if the operator allows it)")
	cmd.Flags().StringVar(&rootfs, "rootfs", "", "run the session on this installed rootfs")
	return cmd
}

// newSessionListCmd is `quro session list`.
func newSessionListCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "list",
		Short: "List sessions",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var list app.SessionList
			if err := g.sessionOutput(cmd, "list_sessions", struct{}{}, &list); err != nil {
				return err
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 2, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tNAME\tDEFAULT\tALIVE\tCWD\tLAST EXIT\tLAST USED")
			for _, s := range list.Sessions {
				d := ""
				if s.Default {
					d = "*"
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%v\t%s\t%d\t%s\n", s.ID, s.Name, d, s.Alive, s.Cwd, s.LastExit, s.LastUsedAt.Format(time.DateTime))
			}
			return tw.Flush()
		},
	}
}

// newSessionStatusCmd is `quro session status`.
func newSessionStatusCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "status [SESSION]",
		Short: "Show a session's status",
		Args:  cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var status json.RawMessage
			if err := g.sessionOutput(cmd, "get_session_status", app.SessionRef{Session: first(args)}, &status); err != nil {
				return err
			}
			var b bytes.Buffer
			if err := json.Indent(&b, status, "", "  "); err != nil {
				return err
			}
			b.WriteByte('\n')
			_, err := b.WriteTo(cmd.OutOrStdout())
			return err
		},
	}
}

// newSessionDestroyCmd is `quro session destroy`.
func newSessionDestroyCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "destroy SESSION",
		Short: "Destroy a session: kill its processes and delete its workspace",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			text, err := g.sessionText(cmd, "destroy_session", app.SessionRef{Session: args[0]})
			if err != nil {
				return err
			}
			fmt.Fprintln(cmd.OutOrStdout(), text)
			return nil
		},
	}
}

// newSessionPauseCmd is `quro session pause`.
func newSessionPauseCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "pause [SESSION]",
		Short: "Pause a session: freeze its processes, keeping their memory and state (any run resumes it)",
		Args:  cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			text, err := g.sessionText(cmd, "pause_session", app.SessionRef{Session: first(args)})
			if err != nil {
				return err
			}
			fmt.Fprintln(cmd.OutOrStdout(), text)
			return nil
		},
	}
}

// newSessionResumeCmd is `quro session resume`.
func newSessionResumeCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "resume [SESSION]",
		Short: "Resume a paused session",
		Args:  cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			text, err := g.sessionText(cmd, "resume_session", app.SessionRef{Session: first(args)})
			if err != nil {
				return err
			}
			fmt.Fprintln(cmd.OutOrStdout(), text)
			return nil
		},
	}
}

// newSessionDefaultCmd is `quro session default`.
func newSessionDefaultCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "default SESSION",
		Short: "Make SESSION the default session",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			_, err := g.sessionText(cmd, "set_default_session", app.SessionRef{Session: args[0]})
			return err
		},
	}
}

// newSessionEnvCmd is `quro session env`.
func newSessionEnvCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "env SESSION [KEY=VALUE | KEY=]...",
		Short: "Show a session's variables, or set them (KEY= with nothing after = unsets)",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var text string
			var err error
			if len(args) == 1 {
				text, err = g.sessionText(cmd, "get_session_env", app.SessionRef{Session: args[0]})
			} else {
				changes := map[string]*string{}
				for _, kv := range args[1:] {
					k, v, ok := strings.Cut(kv, "=")
					if !ok {
						return fmt.Errorf("%q: use KEY=VALUE, or KEY= to unset", kv)
					}
					if v == "" {
						changes[k] = nil
					} else {
						changes[k] = &v
					}
				}
				text, err = g.sessionText(cmd, "set_session_env", app.SetEnvInput{Session: args[0], Env: changes})
			}
			if err != nil {
				return err
			}
			fmt.Fprintln(cmd.OutOrStdout(), text)
			return nil
		},
	}
}

// sessionCapabilities are what each quro session command calls.
var sessionCapabilities = map[string][]string{
	"create": {"create_session"}, "list": {"list_sessions"}, "status": {"get_session_status"},
	"destroy": {"destroy_session"}, "pause": {"pause_session"}, "resume": {"resume_session"},
	"default": {"set_default_session"}, "env": {"get_session_env", "set_session_env"},
	"snapshot": {"snapshot_session"}, "fork": {"fork_session"}, "snapshots": {"list_snapshots"},
	"snapshot-delete": {"delete_snapshot"},
}

func first(args []string) string {
	if len(args) > 0 {
		return args[0]
	}
	return ""
}
