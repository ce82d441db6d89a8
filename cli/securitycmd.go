package cli

import (
	"context"
	"fmt"
	"strings"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"

	v1 "github.com/levers9/levers9/api/levers9/v1"
)

func (a *app) securityCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "security", Short: "Check the hardening of your pools"}
	var pool string
	report := &cobra.Command{
		Use:   "report --pool NAME",
		Short: "What the pool's egress rules, seccomp and volume mount validation refused, or would have in observe/log mode: is enforce safe?",
		Long: `Merge the latest egress readiness reports of the pool's machines: connections the egress
chains refused (enforce) or would have refused (observe), by class, task and sampled destination,
over the agents' report window. "safe to enforce" means machines reported, each could see its
containers' traffic (a machine whose container subnet is routed elsewhere, e.g. through a bridge an
earlier agent left, makes it "unknown"), and nothing would have been refused. Then the pool's
seccomp: the syscalls its log mode let through that enforce would refuse, with counts and tasks,
over the tasks of the last 7 days. Last, volume mount validation: the volume mounts of those tasks
that worker.volumeMountValidation enforce would refuse (over /proc, /etc, "/"...), which log mode
let through.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			resp, err := rpc(a, func(ctx context.Context, conn *grpc.ClientConn) (*v1.GetReadinessReportResponse, error) {
				return v1.NewSecurityServiceClient(conn).GetReadinessReport(ctx, &v1.GetReadinessReportRequest{Pool: pool})
			})
			if err != nil {
				return err
			}
			if a.output == "json" {
				return a.printJSON(resp)
			}
			r := resp.Report
			verdict := "no: see below"
			switch {
			case r.MachinesReporting == 0:
				verdict = "unknown: no machine reported yet"
			case len(r.MachinesBlind) > 0:
				verdict = fmt.Sprintf("unknown: %d machine(s) cannot see their containers' traffic: %s", len(r.MachinesBlind), strings.Join(r.MachinesBlind, "; "))
			case r.SafeToEnforce:
				verdict = "yes: nothing would have been refused"
			}
			fmt.Fprintf(a.io.Out, "pool %s, egress mode %s, %d machine(s) reporting, window %s to %s\n", r.Pool, r.Mode, r.MachinesReporting, when(r.From), when(r.To))
			fmt.Fprintf(a.io.Out, "safe to enforce: %s\n", verdict)
			if len(r.MachinesSilent) > 0 {
				fmt.Fprintf(a.io.Out, "machines without a report: %v\n", r.MachinesSilent)
			}
			if r.Total == 0 {
				if err := a.printSeccompReport(resp.Seccomp); err != nil {
					return err
				}
				return a.printMountReport(resp.Mounts)
			}
			fmt.Fprintf(a.io.Out, "\n%d connection(s) refused or would have been:\n", r.Total)
			w := newTab(a)
			fmt.Fprintln(w, "CLASS\tCOUNT")
			for _, c := range r.ByClass {
				fmt.Fprintf(w, "%s\t%d\n", c.Class, c.Count)
			}
			fmt.Fprintln(w, "\nTASK\tCLASS\tCOUNT")
			for _, t := range r.ByTask {
				fmt.Fprintf(w, "%s\t%s\t%d\n", t.Task, t.Class, t.Count)
			}
			fmt.Fprintln(w, "\nDESTINATION (sampled)\tCLASS\tTASK\tSAMPLES")
			for _, d := range r.Destinations {
				fmt.Fprintf(w, "%s\t%s\t%s\t%d\n", d.Destination, d.Class, d.Task, d.Samples)
			}
			if err := w.Flush(); err != nil {
				return err
			}
			if err := a.printSeccompReport(resp.Seccomp); err != nil {
				return err
			}
			return a.printMountReport(resp.Mounts)
		},
	}
	report.Flags().StringVar(&pool, "pool", "", "the pool to report on")
	_ = report.MarkFlagRequired("pool")
	cmd.AddCommand(report)
	return cmd
}
