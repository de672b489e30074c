package main

import (
	"encoding/json"
	"fmt"
	"text/tabwriter"

	"github.com/spf13/cobra"
)

func newDoctorCmd(g *globals) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "doctor",
		Short: "Show which engines and isolation features this machine offers",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			a, err := g.open(cmd.Context())
			if err != nil {
				return err
			}
			defer a.Close()
			st, err := a.Status(cmd.Context())
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if asJSON {
				enc := json.NewEncoder(out)
				enc.SetIndent("", "  ")
				return enc.Encode(map[string]any{"version": st.Version, "data_dir": st.DataDir, "engines": st.Engines, "isolation": st.Isolation})
			}
			fmt.Fprintf(out, "quro %s, data %s\n\nENGINES\n", st.Version, st.DataDir)
			tw := tabwriter.NewWriter(out, 2, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "LANG\tTIER\tENGINE\tSTATUS")
			for _, e := range st.Engines {
				status := "ok"
				if !e.Available {
					status = "unavailable: " + e.Reason
				}
				fmt.Fprintf(tw, "%s\t%d\t%s\t%s\n", e.Lang, e.Tier, e.Engine, status)
			}
			tw.Flush()
			fmt.Fprintln(out, "\nISOLATION")
			tw = tabwriter.NewWriter(out, 2, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "FEATURE\tON MACHINE\tUSED\tDETAIL")
			for _, f := range st.Isolation {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", f.Name, yesNo(f.Available), yesNo(f.Used), f.Detail)
			}
			return tw.Flush()
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the report as JSON")
	return cmd
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}
