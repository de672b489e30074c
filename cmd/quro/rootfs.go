package main

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"

	"github.com/quro-dev/quro/internal/rootfs"
)

func newRootfsCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "rootfs",
		Short: "Install, inspect and remove the Debian userlands sessions can run on",
		Long: `A rootfs is a Debian userland (debootstrap --variant=minbase, with python3,
python3-pip and ca-certificates) in the data directory, under rootfs/NAME.
Sessions created with --rootfs NAME run on it, and python_run uses the
session's rootfs or the one named "default". Installing needs root and the
network, and takes a minute or two; an interrupted install resumes.`,
	}
	manager := func() (*rootfs.Manager, error) {
		dir, err := filepath.Abs(g.dataDir)
		if err != nil {
			return nil, err
		}
		return rootfs.New(rootfs.DirIn(dir)), nil
	}
	var o rootfs.InstallOptions
	install := &cobra.Command{
		Use:   "install [NAME]",
		Short: "Build a rootfs with debootstrap (default name: default)",
		Args:  cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			name := rootfs.DefaultName
			if len(args) == 1 {
				name = args[0]
			}
			m, err := manager()
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			start := time.Now()
			_, err = m.Install(cmd.Context(), name, o, func(line string) {
				fmt.Fprintf(out, "[%5.1fs] %s\n", time.Since(start).Seconds(), line)
			})
			if err != nil {
				return err
			}
			st, err := m.Status(name)
			if err != nil {
				return err
			}
			fmt.Fprintln(out, st.Text())
			return nil
		},
	}
	install.Flags().StringVar(&o.Suite, "suite", rootfs.DefaultSuite, "Debian suite")
	install.Flags().StringVar(&o.Mirror, "mirror", "", "Debian mirror (default: the host's apt sources, else "+rootfs.DefaultMirror+")")
	var asJSON bool
	status := &cobra.Command{
		Use:   "status [NAME]",
		Short: "Show one rootfs, or all of them: ready, partial or absent, size, python version",
		Args:  cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			m, err := manager()
			if err != nil {
				return err
			}
			var list []*rootfs.Status
			if len(args) == 1 {
				st, err := m.Status(args[0])
				if err != nil {
					return err
				}
				list = append(list, st)
			} else if list, err = m.List(); err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if asJSON {
				enc := json.NewEncoder(out)
				enc.SetIndent("", "  ")
				if list == nil {
					list = []*rootfs.Status{}
				}
				return enc.Encode(list)
			}
			if len(list) == 0 {
				fmt.Fprintf(out, "no rootfs in %s (`quro rootfs install` builds one)\n", m.Dir)
			}
			for _, st := range list {
				fmt.Fprintln(out, st.Text())
			}
			return nil
		},
	}
	status.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	remove := &cobra.Command{
		Use:   "remove NAME",
		Short: "Delete a rootfs (ready or partial)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			m, err := manager()
			if err != nil {
				return err
			}
			if err := m.Remove(args[0]); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "removed rootfs %s\n", args[0])
			return nil
		},
	}
	cmd.AddCommand(install, status, remove)
	return cmd
}
