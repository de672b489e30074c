package main

import (
	"encoding/json"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/quro-dev/quro/internal/app"
	"github.com/quro-dev/quro/internal/auth"
)

func newTokenCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "token",
		Short: "Create, list and revoke the bearer tokens of quro serve",
		Long: `Tokens authenticate calls to quro serve (REST, MCP, WebSocket). Each
belongs to a tenant, whose sessions, files and audit entries no other tenant
sees, and holds scopes: read (status, lists, output), exec (running code and
commands), install (install_packages and installing a missing rootfs: changes
a rootfs every tenant on it shares; exec does not imply it), admin
(destroying sessions, repairing a rootfs, everything). Only a hash is stored:
a token is shown once, when it is created. quro token create --e2b prints it
in the form E2B's SDKs accept as E2B_API_KEY (e2b_<hex>), which names the same
token.

These commands are the capabilities create_token, list_tokens and
revoke_token, recorded in the audit log. They run in-process on the data
directory as its operator (an admin of the local tenant, who manages every
tenant's tokens); with --server or QURO_URL they go through that server as
the tenant of the token given to it.`,
	}
	g.serverFlags(cmd, true)
	cmd.AddCommand(newTokenCreateCmd(g), newTokenListCmd(g), newTokenRevokeCmd(g))
	return cmd
}

// newTokenCreateCmd is `quro token create`.
func newTokenCreateCmd(g *globals) *cobra.Command {
	var tenant, scopes, label, tools string
	var asJSON, e2bForm bool
	cmd := &cobra.Command{
		Use:   "create",
		Short: "Create a token and print it (once) on stdout",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			list, err := auth.ParseScopes(scopes)
			if err != nil {
				return err
			}
			var iss app.CreatedToken
			if err := g.operatorOutput(cmd, "create_token", app.CreateTokenInput{Tenant: tenant, Scopes: list, Label: label, Tools: tools}, &iss); err != nil {
				return err
			}
			if asJSON {
				return json.NewEncoder(cmd.OutOrStdout()).Encode(iss.Issued)
			}
			if e2bForm {
				// Through an older server the answer has no E2B form:
				// the token has one all the same.
				key := iss.E2BKey
				if key == "" {
					if key, err = auth.E2BForm(iss.Token); err != nil {
						return err
					}
				}
				fmt.Fprintln(cmd.OutOrStdout(), key)
			} else {
				fmt.Fprintln(cmd.OutOrStdout(), iss.Token)
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "token %s for tenant %q with scopes %s; it is not shown again\n",
				iss.ID, iss.Tenant, strings.Join(iss.Scopes, ","))
			return nil
		},
	}
	cmd.Flags().StringVar(&tenant, "tenant", "", `tenant the token acts for ("" is the local tenant, whose sessions the CLI sees)`)
	cmd.Flags().StringVar(&scopes, "scopes", "read,exec", "comma-separated scopes: read, exec, install, admin")
	cmd.Flags().StringVar(&tools, "tools", "", "the MCP tool profile its clients are listed when they name none: agent, sessions, admin or full (default: the server's, agent)")
	cmd.Flags().StringVar(&label, "label", "", "a note to recognise the token by in lists")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the token and its details as JSON")
	cmd.Flags().BoolVar(&e2bForm, "e2b", false, "print the token in the form E2B's SDKs accept as E2B_API_KEY (e2b_<hex>; the same token)")
	return annotate(cmd, "create_token")
}

// newTokenListCmd is `quro token list`.
func newTokenListCmd(g *globals) *cobra.Command {
	var asJSON bool
	var listTenant string
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List tokens (ids, tenants, scopes; never the secrets)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var l app.TokenList
			if err := g.operatorOutput(cmd, "list_tokens", app.ListTokensInput{Tenant: listTenant}, &l); err != nil {
				return err
			}
			infos := l.Tokens
			if asJSON {
				if infos == nil {
					infos = []auth.Info{}
				}
				return json.NewEncoder(cmd.OutOrStdout()).Encode(infos)
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tTENANT\tSCOPES\tCREATED\tLAST USED\tSTATE\tLABEL")
			for _, i := range infos {
				state := "live"
				if !i.RevokedAt.IsZero() {
					state = "revoked"
				}
				tenantName := i.Tenant
				if tenantName == "" {
					tenantName = "(local)"
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", i.ID, tenantName, strings.Join(i.Scopes, ","),
					i.CreatedAt.Format(time.DateTime), ago(i.LastUsedAt), state, i.Label)
			}
			return tw.Flush()
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	cmd.Flags().StringVar(&listTenant, "tenant", "*", `only this tenant's tokens ("" is the local tenant; * every tenant's)`)
	return annotate(cmd, "list_tokens")
}

// newTokenRevokeCmd is `quro token revoke`.
func newTokenRevokeCmd(g *globals) *cobra.Command {
	return annotate(&cobra.Command{
		Use:   "revoke ID",
		Short: "Revoke a token: it stops working at once",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			// Only the id is sent (and audited): a whole token given by
			// mistake names its id, and its secret goes no further.
			id := auth.TokenID(strings.TrimSpace(args[0]))
			var done app.Done
			if err := g.operatorOutput(cmd, "revoke_token", app.RevokeTokenInput{ID: id}, &done); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "revoked %s\n", id)
			return nil
		},
	}, "revoke_token")
}

func ago(t time.Time) string {
	if t.IsZero() {
		return "never"
	}
	return t.Format(time.DateTime)
}
