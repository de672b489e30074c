package main

import (
	"fmt"
	"runtime"

	"github.com/spf13/cobra"

	"github.com/quro-dev/quro/internal/version"
)

func newVersionCmd() *cobra.Command {
	return local(&cobra.Command{
		Use:   "version",
		Short: "Print the version",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			fmt.Fprintf(cmd.OutOrStdout(), "quro %s (%s, %s/%s)\n", version.String(), runtime.Version(), runtime.GOOS, runtime.GOARCH)
			return nil
		},
	}, "prints the version; changes nothing")
}
