package main

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/quro-dev/quro/internal/app"
	"github.com/quro-dev/quro/internal/rootfs"
	"github.com/quro-dev/quro/internal/runcode"
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
	cmd.AddCommand(newRootfsInstallCmd(g), newRootfsStatusCmd(g), newRootfsRemoveCmd(g),
		newRootfsInstallPackagesCmd(g), newRootfsRepairCmd(g))
	return cmd
}

// newRootfsInstallCmd is `quro rootfs install`.
func newRootfsInstallCmd(g *globals) *cobra.Command {
	var o rootfs.InstallOptions
	cmd := &cobra.Command{
		Use:   "install [NAME]",
		Short: "Build a rootfs with debootstrap (default name: default; code-interpreter has numpy, pandas, matplotlib, scipy, …)",
		Args:  cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			name := rootfs.DefaultName
			if len(args) == 1 {
				name = args[0]
			}
			var st rootfs.Status
			if err := g.rootfsCall(cmd, "install_rootfs", app.InstallRootfsInput{Rootfs: name, Suite: o.Suite, Mirror: o.Mirror}, &st); err != nil {
				return err
			}
			fmt.Fprintln(cmd.OutOrStdout(), st.Text())
			return nil
		},
	}
	cmd.Flags().StringVar(&o.Suite, "suite", rootfs.DefaultSuite, "Debian suite")
	cmd.Flags().StringVar(&o.Mirror, "mirror", "", "Debian mirror (default: the host's apt sources, else "+rootfs.DefaultMirror+")")
	return annotate(cmd, "install_rootfs")
}

// newRootfsStatusCmd is `quro rootfs status`.
func newRootfsStatusCmd(g *globals) *cobra.Command {
	manager := func() (*rootfs.Manager, error) {
		dir, err := filepath.Abs(g.dataDir)
		if err != nil {
			return nil, err
		}
		return rootfs.New(rootfs.DirIn(dir)), nil
	}
	var asJSON bool
	cmd := &cobra.Command{
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
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return local(cmd, "reads the rootfs directory; changes nothing")
}

// newRootfsRemoveCmd is `quro rootfs remove`.
func newRootfsRemoveCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "remove NAME",
		Short: "Delete a rootfs (ready or partial)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var done app.Done
			if err := g.rootfsCall(cmd, "remove_rootfs", app.RootfsRef{Rootfs: args[0]}, &done); err != nil {
				return err
			}
			fmt.Fprintln(cmd.OutOrStdout(), done.Message)
			return nil
		},
	}
	return annotate(cmd, "remove_rootfs")
}

// newRootfsInstallPackagesCmd is `quro rootfs install-packages`.
func newRootfsInstallPackagesCmd(g *globals) *cobra.Command {
	var pkgTimeout time.Duration
	cmd := &cobra.Command{
		Use:   "install-packages NAME PACKAGE...",
		Short: "Install Debian packages into a rootfs with apt (shared by every session on it)",
		Long: `Runs apt-get update (when the lists are missing or older than a day) and
apt-get install -y --no-install-recommends --no-remove PACKAGE... inside the
rootfs, in a box where the rootfs is writable and the network is the host's.
The packages persist: every session on the rootfs has them. Installs into
one rootfs run one at a time. Needs root (like rootfs install). Sessions do
the same with the install_packages capability.`,
		Args: cobra.MinimumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			var res app.InstallPackagesResult
			in := app.InstallRootfsPackagesInput{Rootfs: args[0], Packages: args[1:], TimeoutMS: pkgTimeout.Milliseconds()}
			if err := g.rootfsCall(cmd, "install_rootfs_packages", in, &res); err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			text := res.Text()
			if i := strings.Index(text, "\n--- apt output ---"); i >= 0 {
				text = text[:i] // the output was streamed already
			}
			fmt.Fprintln(out, text)
			if res.ExitCode != 0 || res.TimedOut {
				return fmt.Errorf("apt-get failed (exit code %d)", res.ExitCode)
			}
			return nil
		},
	}
	cmd.Flags().DurationVar(&pkgTimeout, "timeout", 30*time.Minute, "time budget for waiting, apt-get update and install")
	return annotate(cmd, "install_rootfs_packages")
}

// newRootfsRepairCmd is `quro rootfs repair`.
func newRootfsRepairCmd(g *globals) *cobra.Command {
	var repairTimeout time.Duration
	cmd := &cobra.Command{
		Use:   "repair NAME",
		Short: "Settle a rootfs an install left half-configured (dpkg --configure -a, apt-get -f install --no-remove)",
		Long: `Runs dpkg --configure -a, then apt-get -f install -y --no-remove, in the
rootfs's install box under its lock, and says which packages were not fully
installed before and after. install_packages refuses a rootfs in that state
(it would fail for every tenant). It is the repair_rootfs capability (scope
admin), called as the local admin and recorded in the audit log.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var res app.RepairRootfsResult
			if err := g.rootfsCall(cmd, "repair_rootfs", app.RepairRootfsInput{Rootfs: args[0], TimeoutMS: repairTimeout.Milliseconds()}, &res); err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			text := res.Text()
			if i := strings.Index(text, "\n--- output ---"); i >= 0 {
				text = text[:i] // the output was streamed already
			}
			fmt.Fprintln(out, text)
			if res.ExitCode != 0 || len(res.After) > 0 {
				return fmt.Errorf("rootfs %s is not repaired", args[0])
			}
			return nil
		},
	}
	cmd.Flags().DurationVar(&repairTimeout, "timeout", 10*time.Minute, "time budget for waiting and the repair (10s..30m)")
	return annotate(cmd, "repair_rootfs")
}

// rootfsCall calls a rootfs capability in-process, as the operator, with
// its progress and apt's output streamed to stdout as they come.
func (g *globals) rootfsCall(cmd *cobra.Command, name string, in, out any) error {
	b, err := g.localBackend(cmd)
	if err != nil {
		return err
	}
	defer b.close()
	w := cmd.OutOrStdout()
	ctx := runcode.WithOutput(cmd.Context(), func(_ string, p []byte) {
		// Progress only: an install goes on when stdout went away, and its
		// outcome is the call's answer.
		_, _ = w.Write(p)
	})
	return b.output(ctx, name, in, out)
}
