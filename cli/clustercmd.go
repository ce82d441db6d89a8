package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"

	v1 "github.com/levers9/levers9/api/levers9/v1"
	"github.com/levers9/levers9/enroll"
	"github.com/levers9/levers9/internal/version"
)

func (a *app) clusterCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "cluster", Short: "Attach Kubernetes clusters you run: an agent there dials out and makes worker Jobs"}
	cmd.AddCommand(a.clusterJoinCmd(), a.clusterListCmd(), a.clusterShowCmd(), a.clusterDeleteCmd())
	return cmd
}

// kubeTarget is where --apply and delete --uninstall act: a kubeconfig
// file and a context in it (empty: kubectl's defaults).
type kubeTarget struct{ kubeconfig, context string }

func (k *kubeTarget) flags(cmd *cobra.Command) {
	cmd.Flags().StringVar(&k.kubeconfig, "kubeconfig", "", "kubeconfig file (default: $KUBECONFIG or ~/.kube/config)")
	// --context is already the levers9 context; this one is the cluster's.
	cmd.Flags().StringVar(&k.context, "kube-context", "", "context in the kubeconfig (default: its current context)")
}

// clusterJoinCmd is `cluster join`: a cluster agent machine and the
// manifest that runs it.
func (a *app) clusterJoinCmd() *cobra.Command {
	var (
		pool, namespace, name, image string
		joinTTL                      time.Duration
		apply                        bool
		target                       kubeTarget
	)
	join := &cobra.Command{
		Use:   "join --pool NAME [--namespace levers9] [--name NAME] [--image IMAGE] [-o yaml|json | --apply [--kubeconfig PATH] [--kube-context CTX]]",
		Short: "Attach a Kubernetes cluster to a pool: print or apply the cluster agent's manifest",
		Long: `Create the machine of a cluster agent (admins only) with a single-use join token, and print
the manifest that runs it (YAML by default, -o json for a List), or apply it with --apply to the
cluster of the kubeconfig's context. The manifest holds: the namespace, the agent's
ServiceAccount, a Role in that namespace only (Jobs; pods and pods/log read; Secrets create
and delete, for its workers' join tokens), a ClusterRole that only reads nodes, their bindings,
the Secret with the join token and the Deployment of the agent (the worker image,
levers9-agent cluster), which dials out to the controlplane: the controlplane holds no
credential for the cluster.

The printed manifest carries the token (base64, in the Secret): pipe it to kubectl apply -f -
or keep it private. The token works once and expires with --join-ttl (default 1h).

Once online, the agent reports the cluster's Ready nodes (their allocatable CPU, memory and
nvidia.com/gpu, and the largest node) and, when tasks of the pool wait, makes worker Jobs in
its namespace for them; the workers serve the workspace that joined the cluster, with the
worker-wide security (worker.containerSecurity).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			switch a.output {
			case "table", "yaml", "json":
			default:
				return fmt.Errorf("-o %s: cluster join prints yaml or json", a.output)
			}
			if image == "" {
				image = "docker.io/levers9/levers9-worker:" + version.Info().Version
			}
			if namespace == "" {
				namespace = "levers9"
			}
			labels := map[string]string{enroll.ClusterNamespaceLabel: namespace}
			resp, err := rpc(a, func(ctx context.Context, conn *grpc.ClientConn) (*v1.CreateMachineResponse, error) {
				return v1.NewMachineServiceClient(conn).CreateMachine(ctx, &v1.CreateMachineRequest{
					Pool: pool, Name: name, JoinTtlSeconds: int64(joinTTL / time.Second), Labels: labels, ClusterAgent: true})
			})
			if err != nil {
				return err
			}
			m := resp.Machine
			objs, err := enroll.ClusterManifest(enroll.ClusterParams{MachineID: m.Id, Pool: m.Pool, Namespace: namespace,
				Image: image, ControlplaneGRPC: resp.ControlplaneGrpc, CAPEM: resp.CaPem, Token: resp.JoinToken,
				ExpiresAt: m.GetJoinExpiresAt().AsTime()})
			if err != nil {
				return fmt.Errorf("cluster agent %s: %w", m.Id, err)
			}
			if apply {
				ctx, cancel := context.WithTimeout(cmd.Context(), 2*a.timeout)
				defer cancel()
				if err := applyManifest(ctx, target, objs); err != nil {
					return fmt.Errorf("applying the manifest of cluster agent %s (the machine exists; `levers9 cluster delete %s` removes it): %w", m.Id, m.Id, err)
				}
				fmt.Fprintf(a.io.Out, "cluster agent %s (%s) for pool %s applied in namespace %s\n", m.Id, m.Name, m.Pool, namespace)
				fmt.Fprintf(a.io.Out, "its join token %s is single use and expires %s; `levers9 cluster list` shows it online once it dials in\n",
					enroll.MaskJoinToken(resp.JoinToken), when(m.JoinExpiresAt))
				return nil
			}
			var out []byte
			if a.output == "json" {
				out, err = json.MarshalIndent(map[string]any{"apiVersion": "v1", "kind": "List", "items": objs}, "", "  ")
				out = append(out, '\n')
			} else {
				out, err = enroll.ManifestYAML(objs)
			}
			if err != nil {
				return fmt.Errorf("cluster agent %s: %w", m.Id, err)
			}
			fmt.Fprintf(a.io.Err, "levers9: cluster agent %s created in pool %s; the manifest below holds its single-use join token (expires %s): apply it with kubectl apply -f - and keep it private\n",
				m.Id, m.Pool, when(m.JoinExpiresAt))
			_, err = a.io.Out.Write(out)
			return err
		},
	}
	join.Flags().StringVar(&pool, "pool", "", "pool the cluster's workers serve (see `levers9 pool list`)")
	join.Flags().StringVar(&namespace, "namespace", "levers9", "namespace of the agent and its worker Jobs")
	join.Flags().StringVar(&name, "name", "", "the cluster agent's machine name (made up when empty)")
	join.Flags().StringVar(&image, "image", "", "worker image the agent and its workers run (default docker.io/levers9/levers9-worker:VERSION)")
	join.Flags().DurationVar(&joinTTL, "join-ttl", 0, "how long the join token stays valid (default: the controlplane's, 1h)")
	join.Flags().BoolVar(&apply, "apply", false, "apply the manifest to the cluster instead of printing it")
	target.flags(join)
	_ = join.MarkFlagRequired("pool")
	return join
}

func isClusterAgent(m *v1.Machine) bool { return m.GetLabels()[enroll.ClusterAgentLabel] == "true" }

// clusterListCmd is `cluster list`: the machines of cluster agents.
func (a *app) clusterListCmd() *cobra.Command {
	var listPool string
	list := &cobra.Command{
		Use:   "list [--pool NAME]",
		Short: "List attached clusters: their agent, pool, namespace, state and nodes' resources",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			resp, err := rpc(a, func(ctx context.Context, conn *grpc.ClientConn) (*v1.ListMachinesResponse, error) {
				return v1.NewMachineServiceClient(conn).ListMachines(ctx, &v1.ListMachinesRequest{Pool: listPool})
			})
			if err != nil {
				return err
			}
			clusters := &v1.ListMachinesResponse{}
			for _, m := range resp.Machines {
				if isClusterAgent(m) {
					clusters.Machines = append(clusters.Machines, m)
				}
			}
			if a.output == "json" {
				return a.printJSON(clusters)
			}
			w := newTab(a)
			fmt.Fprintln(w, "ID\tNAME\tPOOL\tNAMESPACE\tSTATE\tLAST HEARTBEAT\tAGENT\tCPUS\tGPUS")
			for _, m := range clusters.Machines {
				inv := m.GetInventory()
				fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d\t%d\n", m.Id, m.Name, m.Pool, dash(m.Labels[enroll.ClusterNamespaceLabel]),
					machineState(m.State), ago(m), dash(m.AgentVersion), inv.GetCpus(), len(inv.GetGpus()))
			}
			return w.Flush()
		},
	}
	list.Flags().StringVar(&listPool, "pool", "", "only clusters of this pool")
	return list
}

// getCluster is a machine that must be a cluster agent.
func (a *app) getCluster(id string) (*v1.Machine, error) {
	resp, err := rpc(a, func(ctx context.Context, conn *grpc.ClientConn) (*v1.GetMachineResponse, error) {
		return v1.NewMachineServiceClient(conn).GetMachine(ctx, &v1.GetMachineRequest{Id: id})
	})
	if err != nil {
		return nil, err
	}
	if !isClusterAgent(resp.Machine) {
		return nil, fmt.Errorf("machine %s is not an attached cluster's agent (see `levers9 machine show %s`)", id, id)
	}
	return resp.Machine, nil
}

// clusterShowCmd is `cluster show`.
func (a *app) clusterShowCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "show ID",
		Short: "Show an attached cluster: its agent and the resources of its nodes",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			m, err := a.getCluster(args[0])
			if err != nil {
				return err
			}
			if a.output == "json" {
				return a.printJSON(&v1.GetMachineResponse{Machine: m})
			}
			inv := m.GetInventory()
			w := newTab(a)
			for _, kv := range [][2]string{
				{"ID", m.Id}, {"Name", m.Name}, {"Pool", m.Pool}, {"Namespace", dash(m.Labels[enroll.ClusterNamespaceLabel])},
				{"State", machineState(m.State)}, {"Transport", dash(m.Transport)}, {"Last heartbeat", ago(m)},
				{"Agent", dash(m.AgentVersion)}, {"Enrolled", when(m.EnrolledAt)}, {"Certificate expires", when(m.CertificateExpiresAt)},
				{"CPUs", fmt.Sprint(inv.GetCpus())},
				{"Memory", fmt.Sprintf("%.1f GiB", float64(inv.GetMemoryBytes())/(1<<30))},
				{"GPUs", fmt.Sprint(len(inv.GetGpus()))},
				{"Nodes", fmt.Sprint(inv.GetClusterNodes())},
			} {
				fmt.Fprintf(w, "%s:\t%s\n", kv[0], kv[1])
			}
			if n := inv.GetLargestNode(); n != nil {
				fmt.Fprintf(w, "Largest node:\t%s: %s CPUs, %.1f GiB, %d GPUs\n", n.Name, strconv.FormatFloat(float64(n.CpuMillis)/1000, 'f', -1, 64),
					float64(n.MemoryBytes)/(1<<30), n.Gpus)
			}
			if m.State == v1.MachineState_MACHINE_STATE_PENDING {
				fmt.Fprintf(w, "Join token expires:\t%s\n", when(m.JoinExpiresAt))
			}
			return w.Flush()
		},
	}
}

// clusterDeleteCmd is `cluster delete`: the agent's certificate is
// revoked; with --uninstall the manifest's objects and the worker Jobs go
// from the cluster too.
func (a *app) clusterDeleteCmd() *cobra.Command {
	var (
		uninstall bool
		target    kubeTarget
	)
	del := &cobra.Command{
		Use:   "delete ID [--uninstall [--kubeconfig PATH] [--kube-context CTX]]",
		Short: "Detach a cluster: its agent removes its worker Jobs, then its certificate is revoked (--uninstall also removes the agent)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			m, err := a.getCluster(args[0])
			if err != nil {
				return err
			}
			resp, err := rpc(a, func(ctx context.Context, conn *grpc.ClientConn) (*v1.DeleteMachineResponse, error) {
				return v1.NewMachineServiceClient(conn).DeleteMachine(ctx, &v1.DeleteMachineRequest{Id: m.Id})
			})
			if err != nil {
				return err
			}
			if resp.ClusterAgentOffline {
				fmt.Fprintf(a.io.Out, "cluster agent %s was offline: its worker Jobs were not removed (their machines are; --uninstall removes the Jobs)\n", m.Id)
			} else {
				fmt.Fprintf(a.io.Out, "cluster agent %s removed %d worker Jobs\n", m.Id, resp.ClusterWorkersRemoved)
			}
			fmt.Fprintf(a.io.Out, "cluster agent %s deleted: its certificate is revoked and its tunnel dropped\n", m.Id)
			if !uninstall {
				return nil
			}
			ns := m.Labels[enroll.ClusterNamespaceLabel]
			if ns == "" {
				return fmt.Errorf("cluster agent %s has no %s label: remove its objects by hand", m.Id, enroll.ClusterNamespaceLabel)
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), 2*a.timeout)
			defer cancel()
			removed, err := uninstallCluster(ctx, target, ns)
			if err != nil {
				return fmt.Errorf("removing cluster agent %s from namespace %s: %w", m.Id, ns, err)
			}
			fmt.Fprintf(a.io.Out, "removed from namespace %s: %s\n", ns, strings.Join(removed, ", "))
			return nil
		},
	}
	del.Flags().BoolVar(&uninstall, "uninstall", false, "also remove the agent's Deployment, RBAC, join Secret and worker Jobs from the cluster (the namespace stays)")
	target.flags(del)
	return del
}
