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
	"github.com/levers9/levers9/internal/errdefs"
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
	return demoTask(ctx, p, v1.NewTaskServiceClient(conn), "demo task", out, say,
		&v1.TaskSpec{Command: []string{"sh", "-c", `echo "hello from a levers9 task on $(uname -n), in a hardened container"; id`}})
}

// demoVolume is the volume the volume demo writes and reads.
const demoVolume = "demo"

// runVolumeDemo makes the volume demo (once) and has one task write a
// file to it and a second one, mounting it read-only, read it back.
func runVolumeDemo(ctx context.Context, p Paths, st *State, out io.Writer, say func(string, ...any)) error {
	conn, err := dialLocal(p, st)
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+st.AdminToken), 3*time.Minute)
	defer cancel()
	_, err = v1.NewVolumeServiceClient(conn).CreateVolume(ctx, &v1.CreateVolumeRequest{Name: demoVolume})
	switch {
	case err == nil:
		say("volume %s created (SeaweedFS)", demoVolume)
	case errdefs.IsAlreadyExists(errdefs.FromGRPC(err)):
	default:
		return fmt.Errorf("create the volume %s: %w (%s=0 runs make up without volumes)", demoVolume, err, VolumesEnv)
	}
	say("volume demo: a task appends a line to %s:/data/hello, a second task reads it", demoVolume)
	tasks := v1.NewTaskServiceClient(conn)
	if err := demoTask(ctx, p, tasks, "volume demo, writer", out, say, &v1.TaskSpec{
		Volumes: []*v1.VolumeRef{{Name: demoVolume, Path: "/data"}},
		Command: []string{"sh", "-c", `echo "written by task $(uname -n) at $(date -u +%H:%M:%S)" >> /data/hello; echo wrote /data/hello`},
	}); err != nil {
		return err
	}
	return demoTask(ctx, p, tasks, "volume demo, reader (read-only)", out, say, &v1.TaskSpec{
		Volumes: []*v1.VolumeRef{{Name: demoVolume, Path: "/data", ReadOnly: true}},
		Command: []string{"sh", "-c", "tail -n 3 /data/hello"},
	})
}

// demoTask submits spec with the CLI's defaults (retries included, as
// `levers9 run` would send), prints its output and waits for it to
// succeed.
func demoTask(ctx context.Context, p Paths, tasks v1.TaskServiceClient, what string, out io.Writer, say func(string, ...any), spec *v1.TaskSpec) error {
	spec.Retries = sdk.DefaultRetries
	sub, err := tasks.SubmitTask(ctx, &v1.SubmitTaskRequest{Spec: spec})
	if err != nil {
		return fmt.Errorf("submit the %s: %w", what, err)
	}
	say("%s %s submitted; its output:", what, sub.Task.Id)
	stream, err := tasks.FollowTask(ctx, &v1.FollowTaskRequest{Id: sub.Task.Id})
	if err != nil {
		return fmt.Errorf("follow the %s: %w", what, err)
	}
	var final *v1.StateChange
	for {
		ev, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return fmt.Errorf("follow the %s %s: %w", what, sub.Task.Id, err)
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
		return fmt.Errorf("the %s %s did not succeed (%s); see %s", what, sub.Task.Id, msg, p.file("agent.log"))
	}
	say("%s succeeded", what)
	return nil
}
