package localstack

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"google.golang.org/grpc/metadata"

	v1 "github.com/levers9/levers9/api/levers9/v1"
	"github.com/levers9/levers9/internal/devstack"
	"github.com/levers9/levers9/sandbox/image/build"
	"github.com/levers9/levers9/sdk"
)

// demoRepo is the demo image's repository in the local registry.
const demoRepo = "levers9/demo"

// ensureRegistry runs the local image registry and pushes the demo image
// (Debian's busybox-static, built with go-containerregistry) to it.
func ensureRegistry(ctx context.Context, p Paths, st *State, say func(string, ...any)) error {
	running := answers(st.RegistryPort) && pidAlive(p.file("registry/registry.pid"))
	var err error
	if st.RegistryPort, err = pickPort(st.RegistryPort, 0, running); err != nil {
		return err
	}
	if running {
		say("image registry already running on 127.0.0.1:%d", st.RegistryPort)
	} else {
		say("starting the image registry on 127.0.0.1:%d", st.RegistryPort)
		if _, err := devstack.StartRegistry(ctx, p.file("registry"), "", st.RegistryPort); err != nil {
			return err
		}
	}
	host := fmt.Sprintf("127.0.0.1:%d", st.RegistryPort)
	res, err := build.BuildBusybox(ctx, host, demoRepo, "latest", nil, build.Options{})
	if err != nil {
		return fmt.Errorf("build the demo image from busybox-static: %w", err)
	}
	st.DemoImage = res.Ref
	say("demo image %s (%s)", res.Ref, res.Digest)
	return st.save(p)
}

// runDemo runs one task through the whole path (queue, scheduler, tunnel,
// agent, sandbox) and prints its output.
func runDemo(ctx context.Context, p Paths, st *State, out io.Writer, say func(string, ...any)) error {
	conn, err := dialLocal(p, st)
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+st.AdminToken), 3*time.Minute)
	defer cancel()
	tasks := v1.NewTaskServiceClient(conn)
	// The CLI's defaults (retries included), as `levers9 run` would send.
	sub, err := tasks.SubmitTask(ctx, &v1.SubmitTaskRequest{Spec: &v1.TaskSpec{Retries: sdk.DefaultRetries,
		Command: []string{"sh", "-c", `echo "hello from a levers9 task on $(uname -n), in a hardened container"; id`}}})
	if err != nil {
		return fmt.Errorf("submit the demo task: %w", err)
	}
	say("demo task %s submitted; its output:", sub.Task.Id)
	stream, err := tasks.FollowTask(ctx, &v1.FollowTaskRequest{Id: sub.Task.Id})
	if err != nil {
		return fmt.Errorf("follow the demo task: %w", err)
	}
	var final *v1.StateChange
	for {
		ev, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return fmt.Errorf("follow the demo task %s: %w", sub.Task.Id, err)
		}
		if l := ev.GetLog(); l != nil {
			fmt.Fprintf(out, "    | %s\n", l.Text)
		}
		if s := ev.GetState(); s != nil {
			final = s
		}
	}
	if final == nil || final.TaskState != v1.TaskState_TASK_STATE_SUCCEEDED {
		msg := "no final state"
		if final != nil {
			msg = strings.TrimPrefix(final.TaskState.String(), "TASK_STATE_") + ": " + final.Message
		}
		return fmt.Errorf("the demo task %s did not succeed (%s); see %s", sub.Task.Id, msg, p.file("agent.log"))
	}
	say("demo task succeeded")
	return nil
}
