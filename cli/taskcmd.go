package cli

import (
	"cmp"
	"context"
	"fmt"
	"os"
	"slices"
	"strings"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	v1 "github.com/levers9/levers9/api/levers9/v1"
	"github.com/levers9/levers9/sdk"
	"github.com/levers9/levers9/volumes"
)

func (a *app) taskCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "task", Short: "List, inspect, follow and cancel tasks, and read their results"}
	cmd.AddCommand(a.taskListCmd(), a.taskShowCmd(), a.taskLogsCmd(), a.taskCancelCmd(), a.taskResultCmd())
	return cmd
}

// taskListCmd is `task list`: the workspace's tasks, newest first.
func (a *app) taskListCmd() *cobra.Command {
	var (
		states []string
		limit  int
	)
	list := &cobra.Command{
		Use:   "list [--state S]... [--limit N]",
		Short: "List the workspace's tasks, newest first",
		Long: `List tasks, newest first: state, pool, image, attempts, exit code and command.
--state keeps only tasks in these states (repeat it or separate with commas):
pending, scheduled, running, succeeded, failed, cancelled, timed_out.`,
		Example: `  levers9 task list
  levers9 task list --state running,pending
  levers9 task list --state failed -o json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			want, err := parseStates(states)
			if err != nil {
				return err
			}
			if limit < 1 {
				return fmt.Errorf("--limit %d: want 1 or more", limit)
			}
			var tasks []*v1.Task
			token := ""
			for len(tasks) < limit {
				resp, err := rpc(a, func(ctx context.Context, conn *grpc.ClientConn) (*v1.ListTasksResponse, error) {
					return v1.NewTaskServiceClient(conn).ListTasks(ctx, &v1.ListTasksRequest{
						PageSize: int32(min(limit-len(tasks), 500)), PageToken: token, States: want})
				})
				if err != nil {
					return err
				}
				tasks = append(tasks, resp.Tasks...)
				if token = resp.NextPageToken; token == "" || len(resp.Tasks) == 0 {
					break
				}
			}
			if len(tasks) > limit {
				tasks = tasks[:limit]
			}
			if a.output == "json" {
				return a.printJSON(&v1.ListTasksResponse{Tasks: tasks})
			}
			w := newTab(a)
			fmt.Fprintln(w, "ID\tSTATE\tPOOL\tIMAGE\tATTEMPTS\tEXIT\tCREATED\tCOMMAND")
			for _, t := range tasks {
				fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%d\t%s\t%s\t%s\n", t.Id, sdk.StateName(t.State), dash(t.GetSpec().GetPool()),
					dash(t.GetSpec().GetImage()), len(t.Attempts), exitText(t), when(t.CreatedAt), commandText(t.GetSpec().GetCommand(), 60))
			}
			return w.Flush()
		},
	}
	list.Flags().StringArrayVar(&states, "state", nil, "only tasks in this state (repeatable, or comma-separated)")
	list.Flags().IntVar(&limit, "limit", 50, "show at most this many tasks")
	return list
}

// taskShowCmd is `task show`: one task with its attempts.
func (a *app) taskShowCmd() *cobra.Command {
	show := &cobra.Command{
		Use:     "show ID",
		Short:   "Show a task with its attempts",
		Example: `  levers9 task show t_abc123`,
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			resp, err := rpc(a, func(ctx context.Context, conn *grpc.ClientConn) (*v1.GetTaskResponse, error) {
				return v1.NewTaskServiceClient(conn).GetTask(ctx, &v1.GetTaskRequest{Id: args[0]})
			})
			if err != nil {
				return err
			}
			if a.output == "json" {
				return a.printJSON(resp)
			}
			a.printTask(resp.Task)
			return nil
		},
	}
	return show
}

// taskLogsCmd is `task logs`: a task's output so far, or followed to its end.
func (a *app) taskLogsCmd() *cobra.Command {
	var follow bool
	logs := &cobra.Command{
		Use:   "logs ID [-f]",
		Short: "Print a task's output so far, or follow it to its end with -f",
		Long: `Print a task's output (its stdout to stdout, its stderr to stderr, markers where a new
attempt began). Without -f, print what it has written so far and exit. With -f, follow it to
its end and exit with its exit code, as levers9 run does; Ctrl-C stops following and leaves
the task running (cancel it with levers9 task cancel ID).`,
		Example: `  levers9 task logs t_abc123
  levers9 task logs -f t_abc123`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			s, c, err := a.taskClient()
			if err != nil {
				return err
			}
			defer s.Close()
			if follow {
				sigs, stop := a.notify()
				defer stop()
				return a.followToEnd(s, c, args[0], a.io.Out, sigs, false, false)
			}
			return a.logsSoFar(s, c, args[0])
		},
	}
	logs.Flags().BoolVarP(&follow, "follow", "f", false, "follow the task to its end and exit with its exit code")
	return logs
}

// taskResultCmd is `task result`: what a finished task wrote to
// /run/levers9/io/result, as raw bytes.
func (a *app) taskResultCmd() *cobra.Command {
	var out string
	result := &cobra.Command{
		Use:   "result ID [-o FILE]",
		Short: "Print what a finished task wrote to /run/levers9/io/result",
		Long: `Print the result of a task that has ended: the bytes its last attempt wrote to
/run/levers9/io/result (at most 8 MiB), exactly as written, to standard output or, with
-o FILE, to FILE (nothing is printed then). A task started with levers9 run --input-file
finds its input in /run/levers9/io/input.

It fails, saying why, when the task has not ended yet (follow it with levers9 task logs -f
ID), when its last attempt wrote no result, or when it wrote one that was not kept (larger
than 8 MiB, or not a regular file). A task retried after its machine was lost gives the
last attempt's result. -o json prints the whole answer as JSON instead (the result in
base64); write to a file named json with -o ./json.`,
		Example: `  levers9 task result t_abc123
  levers9 task result t_abc123 -o result.bin
  levers9 run --detach --input-file in.txt -- sh -c 'wc -l < /run/levers9/io/input > /run/levers9/io/result'`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			id := args[0]
			s, c, err := a.taskClient()
			if err != nil {
				return err
			}
			defer s.Close()
			ctx, cancel := context.WithTimeout(context.Background(), a.timeout)
			defer cancel()
			r, err := c.TaskResult(ctx, id)
			if status.Code(err) == codes.NotFound && strings.Contains(status.Convert(err).Message(), "has not ended") {
				return fmt.Errorf("%w\nwait for it with: levers9 task logs -f %s", a.explain(s, err), id)
			}
			if err != nil {
				return a.explain(s, err)
			}
			if out == "json" {
				return a.printJSON(r)
			}
			switch {
			case r.Error != "":
				return fmt.Errorf("task %s (attempt %d) wrote a result that was not kept: %s", id, r.Attempt, r.Error)
			case !r.Present:
				return fmt.Errorf("task %s (attempt %d) wrote no result to /run/levers9/io/result", id, r.Attempt)
			}
			if out == "" || out == "-" || out == "table" {
				_, err := a.io.Out.Write(r.Result)
				return err
			}
			if err := os.WriteFile(out, r.Result, 0o644); err != nil {
				return fmt.Errorf("-o %s: %w", out, err)
			}
			return nil
		},
	}
	// -o is a file here (the results are bytes, not a listing): it shadows
	// the global -o format flag, with json still meaning JSON.
	result.Flags().StringVarP(&out, "output", "o", "", "write the result to FILE instead of standard output (json: the whole answer as JSON)")
	return result
}

// taskCancelCmd is `task cancel`.
func (a *app) taskCancelCmd() *cobra.Command {
	cancel := &cobra.Command{
		Use:     "cancel ID",
		Short:   "Cancel a task: a running one is killed and its machine cleaned up",
		Example: `  levers9 task cancel t_abc123`,
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			resp, err := rpc(a, func(ctx context.Context, conn *grpc.ClientConn) (*v1.CancelTaskResponse, error) {
				return v1.NewTaskServiceClient(conn).CancelTask(ctx, &v1.CancelTaskRequest{Id: args[0]})
			})
			if err != nil {
				return err
			}
			if a.output == "json" {
				return a.printJSON(resp)
			}
			t := resp.Task
			switch {
			case t.State == v1.TaskState_TASK_STATE_CANCELLED:
				fmt.Fprintf(a.io.Out, "task %s cancelled\n", t.Id)
			case sdk.IsTerminal(t.State):
				fmt.Fprintf(a.io.Out, "task %s had already finished: %s\n", t.Id, sdk.StateName(t.State))
			default:
				fmt.Fprintf(a.io.Out, "task %s is being cancelled (%s); follow it with: levers9 task logs -f %s\n", t.Id, sdk.StateName(t.State), t.Id)
			}
			return nil
		},
	}
	return cancel
}

func (a *app) printTask(t *v1.Task) {
	sp := t.GetSpec()
	w := newTab(a)
	timeout := "none"
	if sp.GetTimeout() != nil {
		timeout = sp.GetTimeout().AsDuration().String()
	}
	gpus := fmt.Sprint(sp.GetGpus())
	if sp.GetGpuType() != "" {
		gpus += " " + sp.GetGpuType()
	}
	rows := [][2]string{
		{"ID", t.Id}, {"State", sdk.StateName(t.State)}, {"Exit code", exitText(t)}, {"Message", dash(taskMessage(t))},
		{"Pool", dash(sp.GetPool())}, {"Image", dash(sp.GetImage())}, {"Command", dash(commandText(sp.GetCommand(), 0))},
		{"CPU", fmt.Sprintf("%.3g cores", float64(sp.GetCpuMillis())/1000)}, {"Memory", fmt.Sprintf("%d MiB", sp.GetMemoryBytes()>>20)},
		{"GPUs", gpus}, {"Timeout", timeout}, {"Retries", fmt.Sprint(sp.GetRetries())},
		{"Env", dash(strings.Join(envNames(sp.GetEnv()), ", "))},
		{"Created", when(t.CreatedAt)}, {"Finished", when(t.FinishedAt)},
	}
	if len(sp.GetSecrets()) > 0 {
		// Names only: the values never leave the controlplane but in the push.
		rows = append(rows, [2]string{"Secrets", strings.Join(sp.GetSecrets(), ", ")})
	}
	if len(sp.GetVolumes()) > 0 {
		refs := make([]string, 0, len(sp.GetVolumes()))
		for _, v := range sp.GetVolumes() {
			refs = append(refs, volumes.Ref{Name: v.GetName(), Path: v.GetPath(), ReadOnly: v.GetReadOnly()}.String())
		}
		rows = append(rows, [2]string{"Volumes", strings.Join(refs, ", ")})
	}
	for _, kv := range rows {
		fmt.Fprintf(w, "%s:\t%s\n", kv[0], kv[1])
	}
	w.Flush()
	if len(t.Attempts) == 0 {
		fmt.Fprintln(a.io.Out, "\nno attempts yet (waiting for a machine with room)")
		return
	}
	fmt.Fprintln(a.io.Out)
	w = newTab(a)
	fmt.Fprintln(w, "ATTEMPT\tSTATE\tMACHINE\tSCHEDULED\tSTARTED\tFINISHED\tEXIT\tDROPPED\tMESSAGE")
	for _, at := range t.Attempts {
		exit := "-"
		if at.ExitCode != nil {
			exit = fmt.Sprint(at.GetExitCode())
		}
		fmt.Fprintf(w, "%d\t%s\t%s\t%s\t%s\t%s\t%s\t%d\t%s\n", at.Number, sdk.AttemptStateName(at.State), dash(at.MachineId),
			when(at.ScheduledAt), when(at.StartedAt), when(at.FinishedAt), exit, at.DroppedLines, dash(cmp.Or(at.GetSummary(), at.GetMessage())))
	}
	w.Flush()
	a.printTaskSeccomp(t)
	a.printTaskMounts(t)
	a.printApplied(t)
}

// taskMessage is the one sentence saying why a task failed when its final
// attempt has a failure reason (the full chain is in -o json), else the
// task's message.
func taskMessage(t *v1.Task) string {
	if n := len(t.GetAttempts()); n > 0 && t.GetAttempts()[n-1].GetSummary() != "" && t.GetState() == v1.TaskState_TASK_STATE_FAILED {
		return t.GetAttempts()[n-1].GetSummary()
	}
	return t.GetMessage()
}

// envNames lists the keys only: values may be sensitive.
func envNames(env map[string]string) []string {
	names := make([]string, 0, len(env))
	for k := range env {
		names = append(names, k)
	}
	slices.Sort(names)
	return names
}

// exitText is the task's exit code, or "-" when it has none (not ended,
// cancelled, or its last attempt ended without its program's code).
func exitText(t *v1.Task) string {
	if !sdk.IsTerminal(t.State) || t.State == v1.TaskState_TASK_STATE_CANCELLED || t.ExitCode == nil {
		return "-"
	}
	return fmt.Sprint(t.GetExitCode())
}

// commandText quotes argv for display, cut to max runes (0: no limit).
func commandText(argv []string, max int) string {
	parts := make([]string, len(argv))
	for i, s := range argv {
		if s == "" || strings.ContainsAny(s, " \t\n'\"\\$`") {
			s = "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
		}
		parts[i] = s
	}
	out := strings.Join(parts, " ")
	if r := []rune(out); max > 0 && len(r) > max {
		out = string(r[:max-1]) + "…"
	}
	return out
}

// logsSoFar prints a task's events up to now.
func (a *app) logsSoFar(s *session, c *sdk.Client, id string) error {
	p := newStreamPrinter(a.io.Out, a.io.Err, isTerminal(a.io.Err))
	if err := c.Logs(context.Background(), id, "", p.event); err != nil {
		return a.explain(s, err)
	}
	return nil
}
