package main

import (
	"encoding/json"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/quro-dev/quro/internal/app"
)

func newAuditCmd(g *globals) *cobra.Command {
	var (
		in     app.AuditInput
		tenant string
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "audit",
		Short: "Show the audit log: every call through REST, MCP, WebSocket and the CLI",
		Long: `Show the latest audit entries of a tenant (the local tenant by default),
oldest first: time, access path, capability, arguments summary, outcome and
duration. This reads the data directory directly, so it sees every tenant's
log when asked with --tenant.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			a, err := g.open(cmd.Context())
			if err != nil {
				return err
			}
			defer a.Close()
			args, err := json.Marshal(in)
			if err != nil {
				return err
			}
			caller := g.caller()
			caller.Tenant = tenant
			reply, err := a.Controller.Call(cmd.Context(), caller, "get_audit_log", args)
			if err != nil {
				return err
			}
			if asJSON {
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				return enc.Encode(reply.Output)
			}
			fmt.Fprintln(cmd.OutOrStdout(), reply.Text)
			return nil
		},
	}
	cmd.Flags().IntVarP(&in.Limit, "limit", "n", 50, "how many of the latest entries (at most 1000)")
	cmd.Flags().StringVar(&in.Capability, "capability", "", "only calls of this capability")
	cmd.Flags().StringVar(&in.Since, "since", "", "only calls since this RFC 3339 time or duration ago (15m, 2h)")
	cmd.Flags().StringVar(&tenant, "tenant", "", "the tenant whose log to show (default: the local tenant)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return annotate(cmd, "get_audit_log")
}
