package main

import (
	"context"
	"net/url"
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
"args": ["mcp"]). tools/list shows the tools of one profile (--tools): agent,
a dozen tools for a coding agent (the default), sessions, admin, or full
(every capability); a tool outside the profile may still be called.
Standard output carries only the protocol; logs go to standard error.

When a server runs on the data directory (or --server or QURO_URL names
one), quro mcp relays to its /mcp endpoint (?tools=PROFILE) with the token
the CLI uses there (the data directory's admin token for the local
server): the client shares the server's sessions, state and audit. Else it
serves every capability in-process, called as the local user with every
scope.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			t, err := g.target()
			if err != nil {
				return err
			}
			if t.url != "" {
				endpoint := "/mcp"
				// The profile is the server's to apply: it takes it as
				// /mcp?tools= (and refuses an unknown one).
				if tools != "" {
					endpoint += "?" + url.Values{"tools": {tools}}.Encode()
				}
				return bridgeMCP(cmd.Context(), t, endpoint, cmd.InOrStdin(), cmd.OutOrStdout())
			}
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
	g.serverFlags(cmd, false)
	return local(cmd, "an access path: serves the controller as MCP on stdio, or relays it to the server's /mcp; every tool call is audited with path mcp")
}
