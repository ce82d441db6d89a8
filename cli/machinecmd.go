package cli

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"

	v1 "github.com/levers9/levers9/api/levers9/v1"
	"github.com/levers9/levers9/enroll"
)

func machineState(s v1.MachineState) string {
	return strings.ToLower(strings.TrimPrefix(s.String(), "MACHINE_STATE_"))
}

func ago(m *v1.Machine) string {
	if m.LastHeartbeat == nil {
		return "-"
	}
	return time.Since(m.LastHeartbeat.AsTime()).Round(time.Second).String() + " ago"
}

func (a *app) machineCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "machine", Short: "Join machines to pools and manage them"}
	cmd.AddCommand(a.machineCreateCmd(), a.machineListCmd(), a.machineShowCmd(), a.machineDeleteCmd())
	return cmd
}

// machineCreateCmd is `machine create`: a machine record and the join script that enrolls it.
func (a *app) machineCreateCmd() *cobra.Command {
	var (
		pool, name string
		joinTTL    time.Duration
		floor      enroll.Floor
		labelArgs  []string
	)
	create := &cobra.Command{
		Use:   "create --pool NAME [--name NAME] [--label K=V]... [--join-ttl 1h] [--min-profile P] [--min-seccomp S] [--min-egress E]",
		Short: "Create a machine and the join script that enrolls it",
		Long: `Create a machine record with a single-use join token (1 hour by default) and write the
join script, token inside, to ~/.levers9/machines/ID.sh with mode 0600. Copy that file to the
machine and run it there as root; the printed command hides the token.

--min-profile, --min-seccomp and --min-egress set the machine's security floor: the script
starts the agent with them, and the agent refuses any task whose container security is looser,
whatever the controlplane sends. The CLI writes them into the script; the controlplane never
sees them.

--label K=V (repeatable) labels the machine, as Kubernetes labels (an optional DNS-subdomain
prefix and "/", a name of up to 63 letters, digits, '-', '_' and '.', a value of the same kind
or empty). The agent reports them in its inventory. A pool whose nodeSelector (in the
controlplane config) names labels the machine lacks refuses it when the script joins.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := floor.Validate(); err != nil {
				return err
			}
			labels, err := parseLabels(labelArgs)
			if err != nil {
				return err
			}
			resp, err := rpc(a, func(ctx context.Context, conn *grpc.ClientConn) (*v1.CreateMachineResponse, error) {
				return v1.NewMachineServiceClient(conn).CreateMachine(ctx, &v1.CreateMachineRequest{
					Pool: pool, Name: name, JoinTtlSeconds: int64(joinTTL / time.Second), Labels: labels})
			})
			if err != nil {
				return err
			}
			dir, err := Dir(a.getenv)
			if err != nil {
				return err
			}
			path := filepath.Join(dir, "machines", resp.Machine.Id+".sh")
			script := resp.JoinScript
			if !floor.IsZero() {
				if script, err = enroll.SetScriptFloor(script, floor); err != nil {
					return fmt.Errorf("machine %s: %w", resp.Machine.Id, err)
				}
			}
			if err := enroll.WriteSecretFile(path, []byte(script)); err != nil {
				return fmt.Errorf("save the join script: %w", err)
			}
			if a.output == "json" {
				resp.JoinToken, resp.JoinScript = "", path
				return a.printJSON(resp)
			}
			m := resp.Machine
			fmt.Fprintf(a.io.Out, "machine %s (%s) created in pool %s\n", m.Id, m.Name, m.Pool)
			if len(m.Labels) > 0 {
				fmt.Fprintf(a.io.Out, "labels: %s\n", labelString(m.Labels))
			}
			if !floor.IsZero() {
				fmt.Fprintf(a.io.Out, "security floor: %s (the agent refuses looser tasks)\n", floor)
			}
			fmt.Fprintf(a.io.Out, "join script: %s (mode 0600: it holds the token %s, single use, expires %s)\n",
				path, enroll.MaskJoinToken(resp.JoinToken), when(m.JoinExpiresAt))
			fmt.Fprintf(a.io.Out, "run it on the machine as root:\n  sudo sh %s.sh            # add --foreground to run without systemd\n", m.Id)
			fmt.Fprintf(a.io.Out, "e.g.  scp %s HOST: && ssh HOST sudo sh %s.sh\n", path, m.Id)
			return nil
		},
	}
	create.Flags().StringVar(&pool, "pool", "", "pool to join (see `levers9 pool list`)")
	create.Flags().StringVar(&name, "name", "", "machine name (made up when empty)")
	create.Flags().StringArrayVar(&labelArgs, "label", nil, "label K=V for the machine (repeatable); a pool's nodeSelector selects machines by label")
	create.Flags().DurationVar(&joinTTL, "join-ttl", 0, "how long the join token stays valid (default: the controlplane's, 1h)")
	create.Flags().StringVar(&floor.Profile, "min-profile", "", "machine's floor for the container profile: legacy < hardened (default none)")
	create.Flags().StringVar(&floor.Seccomp, "min-seccomp", "", "machine's floor for seccomp: off < log < enforce (default none)")
	create.Flags().StringVar(&floor.Egress, "min-egress", "", "machine's floor for the egress mode: observe < enforce (default none)")
	_ = create.MarkFlagRequired("pool")
	return create
}

// machineListCmd is `machine list`.
func (a *app) machineListCmd() *cobra.Command {
	var listPool string
	list := &cobra.Command{
		Use:   "list [--pool NAME]",
		Short: "List machines: state, last heartbeat, agent version, transport, GPUs, pool",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			resp, err := rpc(a, func(ctx context.Context, conn *grpc.ClientConn) (*v1.ListMachinesResponse, error) {
				return v1.NewMachineServiceClient(conn).ListMachines(ctx, &v1.ListMachinesRequest{Pool: listPool})
			})
			if err != nil {
				return err
			}
			if a.output == "json" {
				return a.printJSON(resp)
			}
			w := newTab(a)
			fmt.Fprintln(w, "ID\tNAME\tPOOL\tSTATE\tLAST HEARTBEAT\tAGENT\tTRANSPORT\tCPUS\tGPUS\tLABELS")
			for _, m := range resp.Machines {
				inv := m.GetInventory()
				fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d\t%d\t%s\n", m.Id, m.Name, m.Pool, machineState(m.State), ago(m),
					dash(m.AgentVersion), dash(m.Transport), inv.GetCpus(), len(inv.GetGpus()), dash(labelString(m.Labels)))
			}
			return w.Flush()
		},
	}
	list.Flags().StringVar(&listPool, "pool", "", "only machines of this pool")
	return list
}

// machineShowCmd is `machine show`: a machine with its inventory.
func (a *app) machineShowCmd() *cobra.Command {
	show := &cobra.Command{
		Use:   "show ID",
		Short: "Show a machine with its inventory",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			resp, err := rpc(a, func(ctx context.Context, conn *grpc.ClientConn) (*v1.GetMachineResponse, error) {
				return v1.NewMachineServiceClient(conn).GetMachine(ctx, &v1.GetMachineRequest{Id: args[0]})
			})
			if err != nil {
				return err
			}
			if a.output == "json" {
				return a.printJSON(resp)
			}
			m := resp.Machine
			inv := m.GetInventory()
			w := newTab(a)
			for _, kv := range [][2]string{
				{"ID", m.Id}, {"Name", m.Name}, {"Pool", m.Pool}, {"State", machineState(m.State)},
				{"Labels", dash(labelString(m.Labels))},
				{"Transport", dash(m.Transport)}, {"Last heartbeat", ago(m)}, {"Agent", dash(m.AgentVersion)},
				{"Enrolled", when(m.EnrolledAt)}, {"Certificate expires", when(m.CertificateExpiresAt)},
				{"Hostname", dash(inv.GetHostname())}, {"Kernel", dash(inv.GetKernel())},
				{"CPUs", fmt.Sprintf("%d %s", inv.GetCpus(), inv.GetCpuModel())},
				{"Memory", fmt.Sprintf("%.1f GiB", float64(inv.GetMemoryBytes())/(1<<30))},
				{"Disk", fmt.Sprintf("%.1f GiB free of %.1f GiB", float64(inv.GetDiskFreeBytes())/(1<<30), float64(inv.GetDiskBytes())/(1<<30))},
				{"runc", dash(inv.GetRuncVersion())}, {"runsc", dash(inv.GetRunscVersion())},
				{"AppArmor", fmt.Sprint(inv.GetApparmor())},
			} {
				fmt.Fprintf(w, "%s:\t%s\n", kv[0], kv[1])
			}
			for _, g := range inv.GetGpus() {
				fmt.Fprintf(w, "GPU %d:\t%s %s, %.0f GiB, driver %s, CUDA %s\n", g.Index, g.Name, g.Uuid, float64(g.MemoryBytes)/(1<<30), g.DriverVersion, g.CudaVersion)
			}
			if m.State == v1.MachineState_MACHINE_STATE_PENDING {
				fmt.Fprintf(w, "Join token expires:\t%s\n", when(m.JoinExpiresAt))
			}
			return w.Flush()
		},
	}
	return show
}

// machineDeleteCmd is `machine delete`: the machine's certificate is revoked and its tunnel dropped.
func (a *app) machineDeleteCmd() *cobra.Command {
	del := &cobra.Command{
		Use:   "delete ID",
		Short: "Delete a machine: its certificate is revoked and its tunnel dropped at once",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if _, err := rpc(a, func(ctx context.Context, conn *grpc.ClientConn) (*v1.DeleteMachineResponse, error) {
				return v1.NewMachineServiceClient(conn).DeleteMachine(ctx, &v1.DeleteMachineRequest{Id: args[0]})
			}); err != nil {
				return err
			}
			if dir, err := Dir(a.getenv); err == nil {
				os.Remove(filepath.Join(dir, "machines", args[0]+".sh"))
			}
			fmt.Fprintf(a.io.Out, "machine %s deleted\n", args[0])
			return nil
		},
	}
	return del
}

// parseLabels turns --label K=V flags into a map; the controlplane checks
// each label's syntax.
func parseLabels(args []string) (map[string]string, error) {
	if len(args) == 0 {
		return nil, nil
	}
	out := make(map[string]string, len(args))
	for _, arg := range args {
		k, v, ok := strings.Cut(arg, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("--label %q: want KEY=VALUE (the value may be empty: KEY=)", arg)
		}
		if old, dup := out[k]; dup && old != v {
			return nil, fmt.Errorf("--label %q: label %q is given twice (%q and %q)", arg, k, old, v)
		}
		out[k] = v
	}
	return out, nil
}

// labelString shows labels as k=v,k=v in key order.
func labelString(labels map[string]string) string {
	keys := make([]string, 0, len(labels))
	for k := range labels {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for i, k := range keys {
		keys[i] = k + "=" + labels[k]
	}
	return strings.Join(keys, ",")
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func (a *app) poolCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "pool", Short: "Pools of machines (declared in the controlplane config)"}
	list := &cobra.Command{
		Use:   "list",
		Short: "List pools with their machines, GPUs and effective security",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			resp, err := rpc(a, func(ctx context.Context, conn *grpc.ClientConn) (*v1.ListPoolsResponse, error) {
				return v1.NewPoolServiceClient(conn).ListPools(ctx, &v1.ListPoolsRequest{})
			})
			if err != nil {
				return err
			}
			if a.output == "json" {
				return a.printJSON(resp)
			}
			w := newTab(a)
			fmt.Fprintln(w, "POOL\tMACHINES\tONLINE\tGPUS FREE/TOTAL\tRUNTIME\tPROFILE\tSECCOMP\tNET_RAW\tISOLATION\tEGRESS\tSHARED\tMOUNTS\tNODE SELECTOR\tWORKERS")
			for _, p := range resp.Pools {
				sec := p.GetSecurity()
				netRaw := "kept"
				if sec.GetDropNetRaw() {
					netRaw = "dropped"
				}
				// Machines of a pool that is not shared serve only their own
				// workspace, and the counts are the caller's machines.
				shared := "no"
				if p.Shared {
					shared = "yes"
				}
				// Kubernetes pools: worker Jobs out of maxWorkers, and
				// "waiting for nodes" while a worker pod is unschedulable.
				workers := "-"
				if p.Provider == "kubernetes" {
					workers = fmt.Sprintf("%d/%d (%s)", p.Workers, p.MaxWorkers, p.Status)
				}
				fmt.Fprintf(w, "%s\t%d\t%d\t%d/%d\t%s\t%s\t%s\t%s\t%v\t%s\t%s\t%s\t%s\t%s\n", p.Name, p.Machines, p.MachinesOnline, p.GpusFree, p.GpusTotal,
					sec.GetRuntime(), sec.GetProfile(), sec.GetSeccomp(), netRaw, sec.GetBridgePortIsolation(), sec.GetEgressMode(), shared,
					dash(sec.GetVolumeMountValidation()), dash(labelString(p.NodeSelector)), workers)
			}
			return w.Flush()
		},
	}
	cmd.AddCommand(list, a.poolJoinCmd())
	return cmd
}
