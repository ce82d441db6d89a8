package taskrun

import (
	"context"
	"strings"
	"testing"

	"github.com/levers9/levers9/internal/errdefs"
	"github.com/levers9/levers9/volumes"
)

// countingMounter is a VolumeMounter that hands out a path per volume and
// counts holders, so the hook's pairing of Acquire and Release shows.
type countingMounter struct{ held map[string]int }

func (m *countingMounter) Acquire(_ context.Context, v Volume) (string, error) {
	m.held[v.ID]++
	return "/node/volumes/" + v.ID, nil
}

func (m *countingMounter) Release(_ context.Context, v Volume) error {
	m.held[v.ID]--
	return nil
}

func vol(id, ws, taskWS, path string) Volume {
	return Volume{Volume: volumes.Volume{ID: id, Workspace: ws, Name: id}, TaskWorkspace: taskWS, Driver: "seaweedfs", Path: path}
}

func TestVolumeHookRefuses(t *testing.T) {
	for _, tt := range []struct {
		name string
		v    Volume
		want string
	}{
		{"another workspace", vol("v1", "ws_b", "ws_a", "/data"), "another workspace"},
		{"over /proc", vol("v1", "ws_a", "ws_a", "/proc"), "over /proc"},
		{"under /sys", vol("v1", "ws_a", "ws_a", "/sys/fs"), "over /sys"},
		{"the root", vol("v1", "ws_a", "ws_a", "/"), "root"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			m := &countingMounter{held: map[string]int{}}
			h := &volumeHook{mounter: m}
			err := h.Prestart(context.Background(), &PrestartRequest{Task: Task{Volumes: []Volume{tt.v}}}, &PrestartResponse{})
			if err == nil || !strings.Contains(err.Error(), tt.want) || !errdefs.IsPermissionDenied(err) {
				t.Fatalf("Prestart = %v, want permission denied naming %q", err, tt.want)
			}
			if m.held["v1"] != 0 {
				t.Fatal("a refused volume was mounted")
			}
		})
	}
}

func TestVolumeHookBindsAndReleases(t *testing.T) {
	m := &countingMounter{held: map[string]int{}}
	h := &volumeHook{mounter: m}
	task := Task{Volumes: []Volume{vol("v1", "ws_a", "ws_a", "/data"), vol("v2", "ws_a", "ws_a", "/ckpt")}}
	task.Volumes[1].ReadOnly = true
	for range 2 { // idempotent
		resp := &PrestartResponse{}
		if err := h.Prestart(context.Background(), &PrestartRequest{Task: task}, resp); err != nil {
			t.Fatal(err)
		}
		if len(resp.Mounts) != 2 || resp.Mounts[0].Source != "/node/volumes/v1" || resp.Mounts[0].Destination != "/data" ||
			resp.Mounts[0].ReadOnly || !resp.Mounts[1].ReadOnly || resp.Mounts[1].Destination != "/ckpt" {
			t.Fatalf("mounts = %+v", resp.Mounts)
		}
	}
	if m.held["v1"] != 1 || m.held["v2"] != 1 {
		t.Fatalf("held = %v after two prestarts, want each once", m.held)
	}
	if err := h.Stop(context.Background(), &StopRequest{Task: task}); err != nil {
		t.Fatal(err)
	}
	if err := h.Stop(context.Background(), &StopRequest{Task: task}); err != nil {
		t.Fatal(err)
	}
	if m.held["v1"] != 0 || m.held["v2"] != 0 {
		t.Fatalf("held = %v after stop, want none", m.held)
	}
}

func TestVolumeHookWithoutMounter(t *testing.T) {
	h := &volumeHook{}
	err := h.Prestart(context.Background(), &PrestartRequest{Task: Task{Volumes: []Volume{vol("v1", "ws_a", "ws_a", "/data")}}}, &PrestartResponse{})
	if !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("Prestart = %v, want failed precondition", err)
	}
}
