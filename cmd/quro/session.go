package main

import (
	"encoding/json"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/quro-dev/quro/internal/app"
	"github.com/quro-dev/quro/internal/controller"
)

// callCap opens the app, calls a capability with args and returns the reply.
func (g *globals) callCap(cmd *cobra.Command, name string, args any) (*controller.Reply, error) {
	a, err := g.open(cmd.Context())
	if err != nil {
		return nil, err
	}
	defer a.Close()
	in, err := json.Marshal(args)
	if err != nil {
		return nil, err
	}
	return a.Controller.Call(cmd.Context(), g.caller(), name, in)
}

func newSessionCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "session",
		Short: "Create, list, inspect and destroy sessions; set their variables",
	}
	var network, rootfs string
	create := &cobra.Command{
		Use:   "create [NAME]",
		Short: "Create a session (a fresh workspace); prints its id and name",
		Args:  cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			in := app.CreateSessionInput{Network: network, Rootfs: rootfs}
			if len(args) == 1 {
				in.Name = args[0]
			}
			reply, err := g.callCap(cmd, "create_session", in)
			if err != nil {
				return err
			}
			s := reply.Output.(*app.SessionInfo)
			fmt.Fprintf(cmd.OutOrStdout(), "%s %s\n", s.ID, s.Name)
			return nil
		},
	}
	create.Flags().StringVar(&network, "network", "", "network policy: none (default) or full")
	create.Flags().StringVar(&rootfs, "rootfs", "", "run the session on this installed rootfs")
	cmd.AddCommand(create, &cobra.Command{
		Use:   "list",
		Short: "List sessions",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			reply, err := g.callCap(cmd, "list_sessions", struct{}{})
			if err != nil {
				return err
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 2, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tNAME\tDEFAULT\tALIVE\tCWD\tLAST EXIT\tLAST USED")
			for _, s := range reply.Output.(*app.SessionList).Sessions {
				d := ""
				if s.Default {
					d = "*"
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%v\t%s\t%d\t%s\n", s.ID, s.Name, d, s.Alive, s.Cwd, s.LastExit, s.LastUsedAt.Format(time.DateTime))
			}
			return tw.Flush()
		},
	}, &cobra.Command{
		Use:   "status [SESSION]",
		Short: "Show a session's status",
		Args:  cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			reply, err := g.callCap(cmd, "get_session_status", app.SessionRef{Session: first(args)})
			if err != nil {
				return err
			}
			enc := json.NewEncoder(cmd.OutOrStdout())
			enc.SetIndent("", "  ")
			return enc.Encode(reply.Output)
		},
	}, &cobra.Command{
		Use:   "destroy SESSION",
		Short: "Destroy a session: kill its processes and delete its workspace",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			reply, err := g.callCap(cmd, "destroy_session", app.SessionRef{Session: args[0]})
			if err != nil {
				return err
			}
			fmt.Fprintln(cmd.OutOrStdout(), reply.Text)
			return nil
		},
	}, &cobra.Command{
		Use:   "default SESSION",
		Short: "Make SESSION the default session",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			_, err := g.callCap(cmd, "set_default_session", app.SessionRef{Session: args[0]})
			return err
		},
	}, &cobra.Command{
		Use:   "env SESSION [KEY=VALUE | KEY=]...",
		Short: "Show a session's variables, or set them (KEY= with nothing after = unsets)",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var reply *controller.Reply
			var err error
			if len(args) == 1 {
				reply, err = g.callCap(cmd, "get_session_env", app.SessionRef{Session: args[0]})
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
				reply, err = g.callCap(cmd, "set_session_env", app.SetEnvInput{Session: args[0], Env: changes})
			}
			if err != nil {
				return err
			}
			fmt.Fprintln(cmd.OutOrStdout(), reply.Text)
			return nil
		},
	})
	return cmd
}

func first(args []string) string {
	if len(args) > 0 {
		return args[0]
	}
	return ""
}
