package main

import (
	"encoding/json"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/quro-dev/quro/internal/app"
	"github.com/quro-dev/quro/internal/proc"
	"github.com/quro-dev/quro/internal/quota"
)

// sizeFlag is a byte size flag (2G, 512M, none).
type sizeFlag struct{ v *int64 }

func (f sizeFlag) String() string {
	if f.v == nil || *f.v == 0 {
		return "0"
	}
	return quota.Human(*f.v)
}
func (f sizeFlag) Set(s string) error {
	n, err := quota.ParseSize(s)
	if err == nil {
		*f.v = n
	}
	return err
}
func (f sizeFlag) Type() string { return "size" }

// tenantLimitFlags adds the ceiling flags to cmd, prefixed by prefix.
func tenantLimitFlags(cmd *cobra.Command, prefix string, l *app.TenantLimits) {
	f := cmd.Flags()
	f.Var(sizeFlag{&l.Memory}, prefix+"memory", "memory of all of a tenant's processes together and their kernel memory, no swap (e.g. 8G; none; 0: the default, 3/4 of the machine's memory; kernel-enforced by a tenant cgroup)")
	f.Int64Var(&l.Tasks, prefix+"tasks", 0, "processes and threads of a tenant together (-1: none; 0: the default, half of the kernel's pid_max or threads-max, the lower; kernel-enforced)")
	f.Int64Var(&l.CPUPercent, prefix+"cpu", 0, "CPU of a tenant together, in percent of one CPU (-1: none; 0: the default, every CPU of the machine; kernel-enforced)")
	f.Var(sizeFlag{&l.Disk}, map[bool]string{true: "disk-quota", false: "disk"}[prefix == "tenant-"], "disk of each session: workspace, tmp and saved outputs together (e.g. 2G; 0: the default, 2G; kernel-enforced by a btrfs subvolume per session, or an ext4 image per session, when the server is root)")
	// quro serve's names say whose they are (--runs-per-tenant); quro
	// tenant limits set's are a tenant's own (--runs).
	serve := prefix == "tenant-"
	f.Int64Var(&l.Runs, map[bool]string{true: "runs-per-tenant", false: "runs"}[serve], 0,
		fmt.Sprintf("calls of a tenant running code at once: runs, commands, terminal input, process starts; files, kill, status and lists never count (-1: none; 0: the default, %d)", app.DefaultRunsPerTenant))
	f.Int64Var(&l.Processes, map[bool]string{true: "processes-per-tenant", false: "processes"}[serve], 0,
		fmt.Sprintf("background processes (start_process, E2B's commands and PTYs) of all of a tenant's sessions together (-1: none; 0: the default, %d)", app.DefaultProcessesPerTenant))
	f.Int64Var(&l.SessionProcesses, "processes-per-session", 0,
		fmt.Sprintf("background processes of one session (-1: none; 0: the default, %d)", proc.DefaultMax))
}

func newTenantCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "tenant", Short: "Show and set the ceilings of a tenant",
		Long: `Show and set a tenant's ceilings: the capabilities get_tenant_limits and
set_tenant_limits, recorded in the audit log. They run in-process on the
data directory as its operator (an admin of the local tenant, who alone sets
ceilings); with --server or QURO_URL they go through that server as the
tenant of the token given to it.`}
	limits := &cobra.Command{Use: "limits", Short: "A tenant's ceilings: memory, processes, CPU, sessions, disk per session, runs in flight, background processes, network"}
	var tenant string
	var asJSON bool
	var l app.TenantLimits
	show := &cobra.Command{
		Use: "show", Short: "Show a tenant's ceilings (own and effective)", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var info app.TenantLimitsInfo
			if err := g.operatorOutput(cmd, "get_tenant_limits", app.TenantLimitsInput{Tenant: tenant}, &info); err != nil {
				return err
			}
			own, eff := info.Own, info.Effective
			if asJSON {
				v := map[string]any{"tenant": tenant, "own": own, "effective": eff}
				if info.Unreadable != "" {
					v["unreadable"] = info.Unreadable
				}
				b, _ := json.MarshalIndent(v, "", "  ")
				fmt.Fprintln(cmd.OutOrStdout(), string(b))
				return nil
			}
			if info.Unreadable != "" {
				fmt.Fprintln(cmd.OutOrStdout(), info.Unreadable)
				return nil
			}
			fmt.Fprintf(cmd.OutOrStdout(), "memory %s, tasks %s, cpu %s%%, sessions %s, disk per session %s, runs in flight %s, background processes %s (%s per session), network at most %s\n",
				bytesOrNone(eff.Memory), numOrNone(eff.Tasks), numOrNone(eff.CPUPercent), numOrNone(eff.Sessions), bytesOrNone(eff.Disk),
				numOrNone(eff.Runs), numOrNone(eff.Processes), numOrNone(eff.SessionProcesses), eff.NetworkMax)
			return nil
		},
	}
	set := &cobra.Command{
		Use: "set", Short: "Set a tenant's ceilings (flags not given keep the server's defaults)", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			b, err := g.operatorBackend(cmd)
			if err != nil {
				return err
			}
			defer b.close()
			// set_tenant_limits takes the whole set: the flags given
			// change the tenant's own ceilings, the others stay (stored
			// ceilings that cannot be read: the others are the defaults).
			var info app.TenantLimitsInfo
			if err := b.output(cmd.Context(), "get_tenant_limits", app.TenantLimitsInput{Tenant: tenant}, &info); err != nil {
				return err
			}
			own := info.Own
			fl := cmd.Flags()
			for name, f := range map[string]struct{ dst, src *int64 }{"memory": {&own.Memory, &l.Memory}, "tasks": {&own.Tasks, &l.Tasks},
				"cpu": {&own.CPUPercent, &l.CPUPercent}, "sessions": {&own.Sessions, &l.Sessions}, "disk": {&own.Disk, &l.Disk},
				"runs": {&own.Runs, &l.Runs}, "processes": {&own.Processes, &l.Processes}, "processes-per-session": {&own.SessionProcesses, &l.SessionProcesses}} {
				if fl.Changed(name) {
					*f.dst = *f.src
				}
			}
			if fl.Changed("network-max") {
				own.NetworkMax = l.NetworkMax
			}
			in := app.SetTenantLimitsInput{Tenant: tenant, Memory: own.Memory, Tasks: own.Tasks, CPUPercent: own.CPUPercent, Sessions: own.Sessions, Disk: own.Disk,
				Runs: own.Runs, Processes: own.Processes, SessionProcesses: own.SessionProcesses, NetworkMax: own.NetworkMax}
			text, err := b.text(cmd.Context(), "set_tenant_limits", in)
			if err != nil {
				return err
			}
			fmt.Fprintln(cmd.OutOrStdout(), text)
			return nil
		},
	}
	tenantLimitFlags(set, "", &l)
	set.Flags().Int64Var(&l.Sessions, "sessions", 0, "sessions of a tenant at once (-1: none; 0: the default, quro serve --max-sessions-per-tenant)")
	set.Flags().StringVar(&l.NetworkMax, "network-max", "", `the most network the tenant's sessions may ask for: none, internet or host ("": the server's quro serve --network-max, which this never lifts)`)
	for _, c := range []*cobra.Command{show, set} {
		c.Flags().StringVar(&tenant, "tenant", "", `the tenant ("" is the local tenant)`)
	}
	show.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	annotate(show, "get_tenant_limits")
	annotate(set, "get_tenant_limits", "set_tenant_limits")
	g.serverFlags(cmd, true)
	limits.AddCommand(show, set)
	cmd.AddCommand(limits)
	return cmd
}

func bytesOrNone(v int64) string {
	if v <= 0 {
		return "none"
	}
	return quota.Human(v)
}

func numOrNone(v int64) string {
	if v <= 0 {
		return "none"
	}
	return fmt.Sprint(v)
}
