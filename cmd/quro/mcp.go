package main

import (
	"context"
	"time"

	"github.com/spf13/cobra"

	quromcp "github.com/quro-dev/quro/internal/api/mcp"
)

func newMCPCmd(g *globals) *cobra.Command {
	var patrol time.Duration
	cmd := &cobra.Command{
		Use:   "mcp",
		Short: "Serve every capability as MCP tools on standard input and output",
		Long: `Serve the Model Context Protocol on standard input and output, for an MCP
client that starts quro as a local server (e.g. "command": "quro",
"args": ["mcp"]). Every capability is a tool, called as the local user with
every scope. Standard output carries only the protocol; logs go to standard
error. quro serve offers the same tools over streamable HTTP at /mcp.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			// g.open logs to standard error only: standard output is the protocol.
			a, err := g.open(cmd.Context())
			if err != nil {
				return err
			}
			defer a.Close()
			go func() { _, _ = a.Status(context.WithoutCancel(cmd.Context())) }() // a warm-up: nobody waits for its answer
			go a.Supervise(cmd.Context(), patrol)
			return quromcp.ServeStdio(cmd.Context(), a.Controller, cmd.InOrStdin(), cmd.OutOrStdout(), &quromcp.Options{Logger: a.Log})
		},
	}
	cmd.Flags().DurationVar(&patrol, "patrol", 15*time.Second, "supervisor interval: restart the default shell, stop idle shells, kill orphans")
	return local(cmd, "an access path: serves the controller as MCP on stdio; every tool call is audited with path mcp")
}
