package main

import (
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/quro-dev/quro/internal/app"
	"github.com/quro-dev/quro/internal/quota"
)

// snapshotCmds are quro session snapshot, fork, snapshots and
// snapshot-delete: snapshot_session, fork_session, list_snapshots and
// delete_snapshot through the command's backend.
func snapshotCmds(g *globals) []*cobra.Command {
	var name string
	snap := &cobra.Command{
		Use:   "snapshot [--name NAME] [SESSION]",
		Short: "Snapshot a session's workspace and settings (not its processes); prints the snapshot's id and name",
		Long: `Snapshot a session: its workspace's files (symbolic links as links), its
variables, working directory, network policy and rootfs. Running processes,
Python variables and shell state are NOT in a snapshot. quro session fork
makes new sessions from it.`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var s app.SnapshotInfo
			if err := g.sessionOutput(cmd, "snapshot_session", app.SnapshotInput{Session: first(args), Name: name}, &s); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s %s\n", s.ID, s.Name)
			fmt.Fprintf(cmd.ErrOrStderr(), "%d files, %s", s.Files, quota.Human(s.SizeBytes))
			if s.SkippedCount > 0 {
				fmt.Fprintf(cmd.ErrOrStderr(), "; skipped %d: %v", s.SkippedCount, s.Skipped)
			}
			fmt.Fprintln(cmd.ErrOrStderr())
			return nil
		},
	}
	snap.Flags().StringVar(&name, "name", "", "the snapshot's name (default: the session's name and a suffix)")

	var count int
	var prefix string
	fork := &cobra.Command{
		Use:   "fork [--count N] [--prefix P] SNAPSHOT",
		Short: "Make N new sessions from a snapshot, all or nothing; prints each one's id and name",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var r app.ForkResult
			if err := g.sessionOutput(cmd, "fork_session", app.ForkInput{Snapshot: args[0], Count: count, NamePrefix: prefix}, &r); err != nil {
				return err
			}
			for _, c := range r.Copies {
				fmt.Fprintf(cmd.OutOrStdout(), "%s %s\n", c.Session, c.Name)
			}
			return nil
		},
	}
	fork.Flags().IntVar(&count, "count", 1, fmt.Sprintf("how many sessions to make (1 to %d)", app.MaxForkCount))
	fork.Flags().StringVar(&prefix, "prefix", "", "name the sessions PREFIX-1, PREFIX-2… (default: generated names)")

	list := &cobra.Command{
		Use:   "snapshots",
		Short: "List snapshots",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var l app.SnapshotList
			if err := g.sessionOutput(cmd, "list_snapshots", struct{}{}, &l); err != nil {
				return err
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 2, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tNAME\tSESSION\tFILES\tSIZE\tCREATED")
			for _, s := range l.Snapshots {
				state := ""
				if !s.Complete {
					state = " (incomplete)"
				}
				fmt.Fprintf(tw, "%s\t%s%s\t%s\t%d\t%s\t%s\n", s.ID, s.Name, state, s.SessionName, s.Files, quota.Human(s.SizeBytes), s.CreatedAt.Format(time.DateTime))
			}
			return tw.Flush()
		},
	}
	del := &cobra.Command{
		Use:   "snapshot-delete SNAPSHOT",
		Short: "Delete a snapshot and its files",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			text, err := g.sessionText(cmd, "delete_snapshot", app.SnapshotRef{Snapshot: args[0]})
			if err != nil {
				return err
			}
			fmt.Fprintln(cmd.OutOrStdout(), text)
			return nil
		},
	}
	return []*cobra.Command{snap, fork, list, del}
}
