package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/quro-dev/quro/internal/auth"
	"github.com/quro-dev/quro/internal/store"
)

// openTokens opens just the store: managing tokens needs no engines.
func (g *globals) openTokens(ctx context.Context) (*auth.Tokens, func(), error) {
	if err := os.MkdirAll(g.dataDir, 0o700); err != nil {
		return nil, nil, err
	}
	st, err := store.Open(ctx, filepath.Join(g.dataDir, "quro.db"))
	if err != nil {
		return nil, nil, err
	}
	return auth.New(st), func() { st.Close() }, nil
}

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
a token is shown once, when it is created.`,
	}
	var tenant, scopes, label string
	var asJSON bool
	create := &cobra.Command{
		Use:   "create",
		Short: "Create a token and print it (once) on stdout",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			list, err := auth.ParseScopes(scopes)
			if err != nil {
				return err
			}
			t, done, err := g.openTokens(cmd.Context())
			if err != nil {
				return err
			}
			defer done()
			iss, err := t.Create(cmd.Context(), tenant, list, label)
			if err != nil {
				return err
			}
			if asJSON {
				return json.NewEncoder(cmd.OutOrStdout()).Encode(iss)
			}
			fmt.Fprintln(cmd.OutOrStdout(), iss.Token)
			fmt.Fprintf(cmd.ErrOrStderr(), "token %s for tenant %q with scopes %s; it is not shown again\n",
				iss.ID, iss.Tenant, strings.Join(iss.Scopes, ","))
			return nil
		},
	}
	create.Flags().StringVar(&tenant, "tenant", "", `tenant the token acts for ("" is the local tenant, whose sessions the CLI sees)`)
	create.Flags().StringVar(&scopes, "scopes", "read,exec", "comma-separated scopes: read, exec, install, admin")
	create.Flags().StringVar(&label, "label", "", "a note to recognise the token by in lists")
	create.Flags().BoolVar(&asJSON, "json", false, "print the token and its details as JSON")

	list := &cobra.Command{
		Use:   "list",
		Short: "List tokens (ids, tenants, scopes; never the secrets)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			t, done, err := g.openTokens(cmd.Context())
			if err != nil {
				return err
			}
			defer done()
			infos, err := t.List(cmd.Context())
			if err != nil {
				return err
			}
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
	list.Flags().BoolVar(&asJSON, "json", false, "print JSON")

	revoke := &cobra.Command{
		Use:   "revoke ID",
		Short: "Revoke a token: it stops working at once",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			t, done, err := g.openTokens(cmd.Context())
			if err != nil {
				return err
			}
			defer done()
			if err := t.Revoke(cmd.Context(), args[0]); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "revoked %s\n", args[0])
			return nil
		},
	}
	cmd.AddCommand(create, list, revoke)
	return cmd
}

func ago(t time.Time) string {
	if t.IsZero() {
		return "never"
	}
	return t.Format(time.DateTime)
}
