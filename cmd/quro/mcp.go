package main

import (
	"context"
	"time"

	"github.com/spf13/cobra"

	quromcp "github.com/quro-dev/quro/internal/api/mcp"
)

func newMCPCmd(g *globals) *cobra.Command {
	var patrol time.Duration
	var tools string
	cmd := &cobra.Command{
		Use:   "mcp",
		Short: "Serve the capabilities as MCP tools on standard input and output",
		Long: `Serve the Model Context Protocol on standard input and output, for an MCP
client that starts quro as a local server (e.g. "command": "quro",
"args": ["mcp"]). Every capability is a tool, called as the local user with
every scope; tools/list shows the tools of one profile (--tools): agent, a
dozen tools for a coding agent (the default), sessions, admin, or full
(every capability). A tool outside the profile may still be called.
Standard output carries only the protocol; logs go to standard error. quro
serve offers the same tools over streamable HTTP at /mcp (?tools=PROFILE).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			// An unknown --tools is ServeStdio's error, before any protocol.
			// g.open logs to standard error only: standard output is the protocol.
			a, err := g.open(cmd.Context())
			if err != nil {
				return err
			}
			defer a.Close()
			go func() { _, _ = a.Status(context.WithoutCancel(cmd.Context())) }() // a warm-up: nobody waits for its answer
			go a.Supervise(cmd.Context(), patrol)
			return quromcp.ServeStdio(cmd.Context(), a.Controller, cmd.InOrStdin(), cmd.OutOrStdout(), &quromcp.Options{Logger: a.Log, Tools: tools})
		},
	}
	cmd.Flags().StringVar(&tools, "tools", "", "the tool profile tools/list shows: agent (default), sessions, admin or full")
	cmd.Flags().DurationVar(&patrol, "patrol", 15*time.Second, "supervisor interval: restart the default shell, stop idle shells, kill orphans")
	return local(cmd, "an access path: serves the controller as MCP on stdio; every tool call is audited with path mcp")
}
