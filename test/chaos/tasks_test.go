package chaos

import (
	"context"
	"fmt"
	"math/rand/v2"
	"time"

	v1 "github.com/levers9/levers9/api/levers9/v1"
	"github.com/levers9/levers9/sdk"
)

// kind is what a task does and what must come of it.
type kind int

const (
	kindOK      kind = iota // prints a little, exits 0
	kindExit                // exits with its own non-zero code
	kindTimeout             // sleeps past its timeout
	kindCancel              // sleeps until the test cancels it
	kindLines               // prints numbered lines for a while, exits 0
)

func (k kind) String() string {
	return [...]string{"ok", "exit", "timeout", "cancel", "lines"}[k]
}

// job is one submitted task and everything its follower saw.
type job struct {
	n     int
	kind  kind
	code  int // kindExit's exit code
	lines int // kindLines' line count
	// via is the replica index the task was submitted and followed through.
	via int

	id        string
	submitErr error
	followErr error
	// cancelled says the test cancelled it (kindCancel, after its first
	// line), cancelErr what the cancel answered.
	cancelled bool
	cancelErr error

	// Filled by the follower (one goroutine) and read after it ends.
	events []*v1.TaskEvent
	recv   []time.Time // when each event arrived
	final  *v1.Task
}

// pick chooses n jobs' kinds from rng.
func pick(rng *rand.Rand, n int) []*job {
	jobs := make([]*job, n)
	for i := range jobs {
		j := &job{n: i, via: i % 2}
		switch p := rng.IntN(100); {
		case p < 15:
			j.kind = kindOK
		case p < 40:
			j.kind, j.code = kindExit, 1+rng.IntN(120)
		case p < 50:
			j.kind = kindTimeout
		case p < 62:
			j.kind = kindCancel
		default:
			j.kind, j.lines = kindLines, 200+rng.IntN(400)
		}
		jobs[i] = j
	}
	return jobs
}

// function is the SDK function that runs j.
func (j *job) function(c *sdk.Client) *sdk.Function {
	opts := []sdk.FunctionOption{sdk.Retries(6), sdk.CPU(0.05), sdk.Memory(32 * sdk.MiB)}
	var script string
	switch j.kind {
	case kindOK:
		script = "echo begin; sleep 1; echo end"
	case kindExit:
		script = fmt.Sprintf("echo begin; sleep 2; echo end; exit %d", j.code)
	case kindTimeout:
		script = "echo begin; sleep 60"
		opts = append(opts, sdk.Timeout(3*time.Second))
	case kindCancel:
		script = "echo begin; sleep 120"
	case kindLines:
		// About 5 s of output, so faults land in the middle of it.
		script = fmt.Sprintf("echo begin; i=1; while [ $i -le %d ]; do echo line$i; i=$((i+1)); [ $((i %% 40)) = 0 ] && sleep 0.3; done; echo end", j.lines)
	}
	opts = append(opts, sdk.Command("sh", "-c", script))
	return c.Function(fmt.Sprintf("chaos-%s-%d", j.kind, j.n), opts...)
}

// run submits j through c, follows it to the end (cancelling kindCancel
// once it printed), and reads its final record.
func (j *job) run(ctx context.Context, c *sdk.Client) {
	task, err := j.function(c).Submit(ctx)
	if err != nil {
		j.submitErr = err
		return
	}
	j.id = task.GetId()
	j.followErr = c.Follow(ctx, j.id, "", func(ev *v1.TaskEvent) error {
		j.events, j.recv = append(j.events, ev), append(j.recv, time.Now())
		if ev.GetLog() != nil && j.kind == kindCancel && !j.cancelled {
			// Inside the callback: the stream waits, nothing races.
			j.cancelled = true
			_, j.cancelErr = c.Cancel(ctx, j.id)
		}
		return nil
	})
	if j.followErr != nil {
		return
	}
	j.final, j.followErr = c.Task(ctx, j.id)
}
