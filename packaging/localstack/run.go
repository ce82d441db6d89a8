package localstack

import (
	"context"
	"fmt"
	"io"
	"os"
)

// Run dispatches `up` or `down`.
func Run(ctx context.Context, args []string, p Paths, out io.Writer) error {
	if len(args) != 1 {
		return fmt.Errorf("usage: stack up|down")
	}
	switch args[0] {
	case "up":
		if err := Up(ctx, p, out); err != nil {
			return err
		}
		st, err := loadState(p)
		if err != nil {
			return err
		}
		printNext(out, st.DashboardWebURL(), st.DashboardURL(), volumesEnabled(os.Getenv) && st.SeaweedFS != nil)
		return nil
	case "down":
		return Down(ctx, p, out)
	}
	return fmt.Errorf("unknown command %q: usage: stack up|down", args[0])
}

func printNext(out io.Writer, webURL, apiURL string, volumes bool) {
	fmt.Fprintf(out, "\ndashboard: %s  (development sign-in on: any email; NAME%s is an admin)\n", webURL, dashboardAdmins)
	fmt.Fprintf(out, "dashboard API: %s  (see dashboard/api/API.md)\n", apiURL)
	fmt.Fprint(out, `
levers9 is up. Try:
  export PATH="$PWD/bin:$PATH"
  levers9 run -- sh -c 'echo hi from $(uname -n)'
  levers9 task list
  levers9 machine list
  levers9 token create --name laptop
  printf 'USER=app\nPASSWORD=hunter2\n' | levers9 secret put db
Python functions on levers9-runner:latest (README "Python SDK"):
  export PYTHONPATH="$PWD/sdk/python"
  python3 -m levers9 tasks
`)
	if volumes {
		fmt.Fprint(out, `Volumes (SeaweedFS under .levers9-dev/seaweedfs/):
  levers9 volume create data
  levers9 run --volume data:/data -- sh -c 'date > /data/x'
  levers9 run --volume data:/data:ro -- cat /data/x
  levers9 volume ls data
`)
	} else {
		fmt.Fprintf(out, "Volumes are off (%s=0): make up without it runs SeaweedFS for them.\n", VolumesEnv)
	}
	fmt.Fprint(out, "Stop it with: make down   (data stays in .levers9-dev/)\n")
}
