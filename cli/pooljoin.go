package cli

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"

	v1 "github.com/levers9/levers9/api/levers9/v1"
	"github.com/levers9/levers9/enroll"
)

func (a *app) poolJoinCmd() *cobra.Command {
	var (
		dev, foreground                bool
		name, stateDir, etcDir, binDir string
		labelArgs                      []string
	)
	cmd := &cobra.Command{
		Use:   "join NAME [--dev] [--foreground] [--label K=V]...",
		Short: "Join this machine to a pool directly (runs the join script here, as root)",
		Long: `Create a machine in pool NAME and run its join script on this machine, as root: the agent is
installed, enrolled and started (as a systemd service, or in the foreground with --foreground).
With --dev the controlplane hands out an agent built from its own source, which it does only
when it runs with LEVERS9_AGENT_DEV_BUILDS=true. --label labels the machine as in
` + "`machine create`" + `; a pool with a nodeSelector refuses a machine that lacks its labels.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if os.Geteuid() != 0 {
				return errors.New("pool join runs the join script on this machine and needs root: run it with sudo")
			}
			labels, err := parseLabels(labelArgs)
			if err != nil {
				return err
			}
			resp, err := rpc(a, func(ctx context.Context, conn *grpc.ClientConn) (*v1.CreateMachineResponse, error) {
				return v1.NewMachineServiceClient(conn).CreateMachine(ctx, &v1.CreateMachineRequest{Pool: args[0], Name: name, DevBuild: dev, Labels: labels})
			})
			if err != nil {
				return err
			}
			dir, err := Dir(a.getenv)
			if err != nil {
				return err
			}
			script := filepath.Join(dir, "machines", resp.Machine.Id+".sh")
			if err := enroll.WriteSecretFile(script, []byte(resp.JoinScript)); err != nil {
				return fmt.Errorf("save the join script: %w", err)
			}
			fmt.Fprintf(a.io.Err, "machine %s created in pool %s; running %s here\n", resp.Machine.Id, resp.Machine.Pool, script)
			shArgs := []string{script}
			if foreground {
				shArgs = append(shArgs, "--foreground")
			}
			for flag, v := range map[string]string{"--state-dir": stateDir, "--etc-dir": etcDir, "--bin-dir": binDir} {
				if v != "" {
					shArgs = append(shArgs, flag, v)
				}
			}
			run := exec.CommandContext(cmd.Context(), "sh", shArgs...)
			run.Stdin, run.Stdout, run.Stderr = a.io.In, a.io.Out, a.io.Err
			if err := run.Run(); err != nil {
				return fmt.Errorf("the join script failed (machine %s stays pending; delete it with `levers9 machine delete %s`): %w", resp.Machine.Id, resp.Machine.Id, err)
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&dev, "dev", false, "use an agent built from the controlplane's source (LEVERS9_AGENT_DEV_BUILDS)")
	cmd.Flags().BoolVar(&foreground, "foreground", false, "run the agent in the foreground instead of as a systemd service")
	cmd.Flags().StringVar(&name, "name", "", "machine name (made up when empty)")
	cmd.Flags().StringArrayVar(&labelArgs, "label", nil, "label K=V for the machine (repeatable); a pool's nodeSelector selects machines by label")
	cmd.Flags().StringVar(&stateDir, "state-dir", "", "agent state directory (default /var/lib/levers9-agent)")
	cmd.Flags().StringVar(&etcDir, "etc-dir", "", "where the join token and CA go (default /etc/levers9)")
	cmd.Flags().StringVar(&binDir, "bin-dir", "", "where the agent is installed (default /usr/local/bin)")
	return cmd
}
