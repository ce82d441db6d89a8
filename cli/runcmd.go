package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"sync/atomic"

	"github.com/spf13/cobra"

	v1 "github.com/levers9/levers9/api/levers9/v1"
	"github.com/levers9/levers9/sdk"
)

// exitInterrupted is the exit code after a Ctrl-C detach (128+SIGINT, as
// shells report it).
const exitInterrupted = 130

func (a *app) runCmd() *cobra.Command {
	var f runFlags
	var imageFile, inputFile string
	cmd := &cobra.Command{
		Use:   "run [flags] -- CMD [ARG...]",
		Short: "Run a command as a task on your machines and stream its output",
		Long: `Submit CMD as a task, stream its output as if it ran here (its stdout to stdout, its
stderr to stderr) and exit with its exit code: 124 when it timed out (like timeout(1)), 1 with
a message when it was cancelled or failed without an exit code (its machine lost with no
retries left, its image not found, ...). A program killed at its memory limit exits 137 with
a message saying so (out of memory: limit 64 MiB).

A machine lost mid-task (reclaimed, unplugged, its agent killed) starts a new attempt on
another machine while --retries remain; the stream goes on, with a marker line on stderr:
  --- attempt 2 on machine m_xyz (attempt 1 lost: ...)

Ctrl-C once cancels the task and keeps streaming to its end; Ctrl-C again detaches, leaving
the task as it is, and prints how to resume: levers9 task logs -f ID.

--input-file FILE hands FILE's bytes (- reads standard input; at most 1 MiB) to the task as
the read-only file /run/levers9/io/input. The task may write its answer to
/run/levers9/io/result (at most 8 MiB; the directory is the task's own, writable by its user,
and needs no network); once the task ended, levers9 task result ID prints it.

Flags stop at CMD (or at --), so CMD's own flags need no quoting. --env values are stored
with the task: keep secrets out of them. LEVERS9_SECURITY_PROFILE and LEVERS9_SECCOMP (in
--env or in your environment) tighten the pool's security for this task; a looser setting
is refused.`,
		Example: `  levers9 run -- sh -c 'echo hello from $(hostname)'
  levers9 run --pool gpu --gpu 1 --image registry.local/train:1 --timeout 2h --retries 2 -- python train.py
  levers9 run --cpu 2 --memory 4Gi --env EPOCHS=3 -- ./bench
  levers9 run --detach -- sleep 600      # prints the task ID and returns
  levers9 run --image-file image.yaml -- python3 -m app
  levers9 run --detach --input-file words.txt -- sh -c 'tr a-z A-Z < /run/levers9/io/input > /run/levers9/io/result'
  levers9 task result t_abc123   # the uppercased words, once the task ended`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				return errors.New("nothing to run: give the command after --, e.g. levers9 run -- echo hi")
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			if imageFile != "" {
				if f.image != "" {
					return errors.New("give --image or --image-file, not both")
				}
				// The build's output goes to stderr: stdout is the task's.
				img, err := a.buildImage(imageFile, false, a.io.Err)
				if err != nil {
					return err
				}
				f.image = img.Ref
			}
			opts, err := f.options()
			if err != nil {
				return err
			}
			if inputFile != "" {
				in, err := a.readInput(inputFile)
				if err != nil {
					return err
				}
				opts = append(opts, sdk.Input(in))
			}
			return a.run(f.detach, opts, args)
		},
	}
	fl := cmd.Flags()
	// CMD's own flags belong to CMD.
	fl.SetInterspersed(false)
	fl.StringVar(&f.pool, "pool", "", `pool to run in (default "default")`)
	fl.IntVar(&f.gpus, "gpu", 0, "whole GPUs to reserve (never shared)")
	fl.StringVar(&f.gpuType, "gpu-type", "", "only machines whose GPUs have this name (needs --gpu)")
	fl.StringVar(&f.image, "image", "", "image reference (default: the controlplane's worker.defaultImage)")
	fl.StringVar(&imageFile, "image-file", "", "build the image from this recipe first (levers9 image build -f; cached when built before)")
	fl.StringVar(&inputFile, "input-file", "", "give the task FILE's bytes (- for standard input; at most 1 MiB) as /run/levers9/io/input")
	fl.StringArrayVar(&f.env, "env", nil, "KEY=VALUE in the task's environment (repeatable)")
	fl.StringArrayVar(&f.volumes, "volume", nil, "mount workspace volume NAME:/path[:ro] into the task (repeatable; levers9 volume create NAME)")
	fl.StringArrayVar(&f.secrets, "secret", nil, "workspace secret NAME whose keys become the task's environment variables (repeatable; levers9 secret put NAME)")
	fl.Float64Var(&f.cpu, "cpu", 0, "cores to reserve, e.g. 0.5 (default 0.5)")
	fl.StringVar(&f.memory, "memory", "", "memory to reserve and limit to, e.g. 512Mi or 4Gi (default 256Mi)")
	fl.DurationVar(&f.timeout, "timeout", 0, "run time limit of each attempt, e.g. 10m (default: none)")
	fl.IntVar(&f.retries, "retries", sdk.DefaultRetries, "new attempts when the machine running the task is lost (0: none)")
	fl.BoolVar(&f.detach, "detach", false, "print the task ID and return instead of streaming")
	return cmd
}

// readInput reads --input-file: a file, or standard input for "-", of at
// most sdk.MaxInputBytes.
func (a *app) readInput(path string) ([]byte, error) {
	var r io.Reader = a.in
	name := "standard input"
	if path != "-" {
		f, err := os.Open(path)
		if err != nil {
			return nil, fmt.Errorf("--input-file: %w", err)
		}
		defer f.Close()
		r, name = f, path
	}
	b, err := io.ReadAll(io.LimitReader(r, sdk.MaxInputBytes+1))
	if err != nil {
		return nil, fmt.Errorf("--input-file: read %s: %w", name, err)
	}
	if len(b) > sdk.MaxInputBytes {
		return nil, fmt.Errorf("--input-file: %s is more than 1 MiB (%d bytes), the most a task may be given; put larger data in a volume (levers9 volume put) and mount it with --volume", name, sdk.MaxInputBytes)
	}
	return b, nil
}

// taskClient connects and wraps the connection in an SDK client.
func (a *app) taskClient() (*session, *sdk.Client, error) {
	s, err := a.connect(true)
	if err != nil {
		return nil, nil, err
	}
	c, err := sdk.NewClient(context.Background(), sdk.WithConn(s.conn, s.ctx.Token), sdk.WithGetenv(a.getenv),
		sdk.WithCallTimeout(a.timeout))
	if err != nil {
		s.Close()
		return nil, nil, err
	}
	return s, c, nil
}

func (a *app) run(detach bool, opts []sdk.FunctionOption, args []string) error {
	s, c, err := a.taskClient()
	if err != nil {
		return err
	}
	defer s.Close()
	fn := c.Function("levers9-run", opts...)
	spec, err := fn.Spec(args...)
	if err != nil {
		return err
	}
	sigs, stop := a.notify()
	defer stop()

	// A first interrupt during the submit waits for it (abandoning it
	// could leave a task running that nobody follows) and then cancels;
	// a second abandons it.
	sctx, cancelSubmit := context.WithCancel(context.Background())
	defer cancelSubmit()
	submitted := make(chan struct{})
	var early atomic.Bool
	go func() {
		for {
			select {
			case <-sigs:
			case <-submitted:
				return
			}
			if early.Swap(true) {
				cancelSubmit()
				return
			}
			fmt.Fprintln(a.io.Err, "levers9: will cancel the task once submitted (Ctrl-C again to give up waiting)")
		}
	}()
	task, err := c.Submit(sctx, spec, sdk.NewIdempotencyKey("levers9-run"))
	close(submitted)
	if err != nil {
		if sctx.Err() != nil {
			return &exitError{code: exitInterrupted, msg: "interrupted while submitting: the task may or may not exist, see `levers9 task list`"}
		}
		return a.explain(s, err)
	}
	if detach {
		if a.output == "json" {
			return a.printJSON(task)
		}
		fmt.Fprintln(a.io.Out, task.GetId())
		return nil
	}
	if isTerminal(a.io.Err) {
		fmt.Fprintf(a.io.Err, "\x1b[2m--- task %s (%s)\x1b[0m\n", task.GetId(), sdk.StateName(task.GetState()))
	}
	return a.followToEnd(s, c, task.GetId(), a.io.Out, sigs, true, early.Load())
}

// followToEnd streams a task to its end (its stdout to out) and exits with its result. With
// cancelOnInterrupt the first interrupt cancels the task and the second
// detaches; without, the first detaches (the task keeps running).
// interrupted says an interrupt already came.
func (a *app) followToEnd(s *session, c *sdk.Client, id string, out io.Writer, sigs <-chan os.Signal, cancelOnInterrupt, interrupted bool) error {
	fctx, stopFollow := context.WithCancel(context.Background())
	defer stopFollow()
	var (
		mu       sync.Mutex
		detached bool
		wg       sync.WaitGroup
	)
	errw := &lockedWriter{w: a.io.Err}
	wg.Add(1)
	go func() {
		defer wg.Done()
		n := 0
		for {
			if !interrupted {
				select {
				case <-fctx.Done():
					return
				case <-sigs:
				}
			}
			interrupted = false
			n++
			if n == 1 && cancelOnInterrupt {
				fmt.Fprintf(errw, "levers9: cancelling task %s (Ctrl-C again to detach and leave it)\n", id)
				wg.Add(1)
				go func() {
					defer wg.Done()
					// Not tied to following: a detach right after still
					// lets the asked-for cancel through.
					cctx, cancel := context.WithTimeout(context.Background(), a.timeout)
					defer cancel()
					if _, err := c.Cancel(cctx, id); err != nil {
						fmt.Fprintf(errw, "levers9: cancel task %s: %v\n", id, a.explain(s, err))
					}
				}()
				continue
			}
			mu.Lock()
			detached = true
			mu.Unlock()
			stopFollow()
			return
		}
	}()
	p := newStreamPrinter(out, errw, isTerminal(a.io.Err))
	err := c.Follow(fctx, id, "", p.event)
	stopFollow()
	wg.Wait()
	mu.Lock()
	wasDetached := detached
	mu.Unlock()
	if wasDetached {
		what := "it goes on"
		if cancelOnInterrupt {
			what = "its cancel was asked for"
		}
		return &exitError{code: exitInterrupted, msg: fmt.Sprintf("detached from task %s (%s); follow it again with: levers9 task logs -f %s", id, what, id)}
	}
	if err != nil {
		return fmt.Errorf("%w\nthe task may still run: levers9 task logs -f %s", a.explain(s, err), id)
	}
	var t *v1.Task
	gctx, cancel := context.WithTimeout(context.Background(), a.timeout)
	defer cancel()
	if t, err = c.Task(gctx, id); err != nil {
		return a.explain(s, err)
	}
	return exitFor(t)
}
