package main

import (
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
)

func newSessionCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "session",
		Short: "Create and list sessions",
	}
	cmd.AddCommand(&cobra.Command{
		Use:   "create [NAME]",
		Short: "Create a session (a fresh workspace); prints its id",
		Args:  cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			a, err := g.open(cmd.Context())
			if err != nil {
				return err
			}
			defer a.Close()
			name := ""
			if len(args) == 1 {
				name = args[0]
			}
			s, err := a.Sessions.Create(cmd.Context(), name)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s %s\n", s.ID, s.Name)
			return nil
		},
	}, &cobra.Command{
		Use:   "list",
		Short: "List sessions",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			a, err := g.open(cmd.Context())
			if err != nil {
				return err
			}
			defer a.Close()
			list, err := a.Sessions.List(cmd.Context())
			if err != nil {
				return err
			}
			def, err := a.Sessions.Default(cmd.Context())
			if err != nil {
				return err
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 2, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tNAME\tDEFAULT\tCREATED\tLAST USED\tWORKSPACE")
			for _, s := range list {
				d := ""
				if s.ID == def.ID {
					d = "*"
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", s.ID, s.Name, d,
					s.CreatedAt.Format(time.DateTime), s.LastUsedAt.Format(time.DateTime), s.Workspace())
			}
			return tw.Flush()
		},
	})
	return cmd
}
