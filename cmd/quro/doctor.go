package main

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/quro-dev/quro/internal/quota"
	"github.com/quro-dev/quro/internal/rootfs"
	"github.com/quro-dev/quro/internal/runcode"
	"github.com/quro-dev/quro/internal/sandbox"
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
			engines := doctorEngines(st.Engines, st.DataDir)
			isolation := append(slices.Clone(st.Isolation), diskQuotaRow(st.DataDir))
			out := cmd.OutOrStdout()
			if asJSON {
				enc := json.NewEncoder(out)
				enc.SetIndent("", "  ")
				return enc.Encode(map[string]any{"version": st.Version, "data_dir": st.DataDir, "engines": engines, "isolation": isolation, "ceilings": st.Ceilings})
			}
			fmt.Fprintf(out, "quro %s, data %s\n\nENGINES\n", st.Version, st.DataDir)
			tw := tabwriter.NewWriter(out, 2, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "LANG\tTIER\tENGINE\tSTATUS")
			for _, e := range engines {
				status := "ok"
				if e.Available && e.Reason != "" {
					status = "ok, " + e.Reason
				}
				if !e.Available {
					status = "unavailable: " + e.Reason
				}
				fmt.Fprintf(tw, "%s\t%d\t%s\t%s\n", e.Lang, e.Tier, e.Engine, status)
			}
			tw.Flush()
			fmt.Fprintln(out, "\nISOLATION")
			tw = tabwriter.NewWriter(out, 2, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "FEATURE\tON MACHINE\tUSED\tDETAIL")
			for _, f := range isolation {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", f.Name, yesNo(f.Available), yesNo(f.Used), f.Detail)
			}
			if err := tw.Flush(); err != nil {
				return err
			}
			if c := st.Ceilings; c != nil {
				// The defaults of quro serve on this machine (its flags
				// and quro tenant limits set change them).
				fmt.Fprintf(out, "\nCEILINGS %s\n", c.Text())
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the report as JSON")
	return local(cmd, "reads the engines and isolation features of this machine; changes nothing")
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

// doctorEngines is the engine chains as a run gets them. The rootfs tier
// is probed once as "can the box show a rootfs"; whether it runs anything
// depends on a rootfs being installed (and the session created on it), so
// doctor says which are, or how to install one.
func doctorEngines(in []runcode.EngineStatus, dataDir string) []runcode.EngineStatus {
	out := slices.Clone(in)
	for i, e := range out {
		if e.Engine != "python/rootfs" || !e.Available {
			continue
		}
		var ready []string
		list, err := rootfs.New(rootfs.DirIn(dataDir)).List()
		for _, r := range list {
			if r.State == rootfs.Ready {
				ready = append(ready, r.Name)
			}
		}
		switch {
		case err != nil:
			out[i].Available, out[i].Reason = false, "cannot list the installed rootfs: "+err.Error()
		case len(ready) == 0:
			out[i].Available, out[i].Reason = false, "not installed — quro rootfs install NAME (as root; e.g. `quro rootfs install default`), then sessions created with --rootfs NAME run their Python on it"
		default:
			out[i].Reason = "installed: " + strings.Join(ready, ", ") + " (used by sessions created with --rootfs NAME)"
		}
	}
	return out
}

// diskQuotaRow says whether each session's directory gets a disk quota of
// its own, and by which method: a subvolume of the data directory's one
// shared btrfs filesystem (root, loop devices, btrfs in the kernel and
// btrfs-progs), or else a loop-mounted ext4 image (root, loop devices and
// e2fsprogs). What Open mounted for the check it unmounts again.
func diskQuotaRow(dataDir string) sandbox.Feature {
	d := quota.Open(dataDir)
	defer d.Close()
	f := sandbox.Feature{Name: "disk quota", Detail: d.Method()}
	if d.Enforced() == nil {
		f.Available, f.Used = true, true
		f.Detail += ": a session cannot fill more than its tenant's disk per session"
	} else {
		f.Detail += "; usage is measured and new writes refused by admission instead"
	}
	return f
}
