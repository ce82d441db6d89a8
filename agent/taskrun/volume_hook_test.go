package taskrun

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/levers9/levers9/internal/errdefs"
	"github.com/levers9/levers9/sandbox"
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
		// mode is the pool's pushed volume mount validation; env the
		// task's.
		mode sandbox.MountValidation
		env  []string
		want string // "" when the hook lets it through
	}{
		{"another workspace", vol("v1", "ws_b", "ws_a", "/data"), "enforce", nil, "another workspace"},
		{"another workspace under log", vol("v1", "ws_b", "ws_a", "/data"), "log", nil, "another workspace"},
		{"over /proc", vol("v1", "ws_a", "ws_a", "/proc"), "enforce", nil, "over /proc"},
		{"under /sys", vol("v1", "ws_a", "ws_a", "/sys/fs"), "enforce", nil, "over /sys"},
		{"the root", vol("v1", "ws_a", "ws_a", "/"), "enforce", nil, "root"},
		{"over /proc, mode unset", vol("v1", "ws_a", "ws_a", "/proc"), "", nil, "over /proc"},
		{"over /proc under log", vol("v1", "ws_a", "ws_a", "/proc"), "log", nil, ""},
		{"under /etc under log", vol("v1", "ws_a", "ws_a", "/etc/data"), "log", nil, ""},
		{"log tightened by the task", vol("v1", "ws_a", "ws_a", "/etc/data"), "log", []string{"LEVERS9_VOLUME_MOUNT_VALIDATION=enforce"}, "over /etc"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			m := &countingMounter{held: map[string]int{}}
			h := &volumeHook{mounter: m}
			task := Task{Volumes: []Volume{tt.v}, Env: tt.env, Security: sandbox.Security{MountValidation: tt.mode}}
			err := h.Prestart(context.Background(), &PrestartRequest{Task: task}, &PrestartResponse{})
			if tt.want == "" {
				if err != nil || m.held["v1"] != 1 {
					t.Fatalf("Prestart = %v, held %d; want it mounted", err, m.held["v1"])
				}
				return
			}
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

// gateMounter is a VolumeMounter that hands out dir for every volume and
// counts holders; began is closed at the first Acquire.
type gateMounter struct {
	dir   string
	began chan struct{}
	once  sync.Once
	mu    sync.Mutex
	held  int
}

func (m *gateMounter) Acquire(context.Context, Volume) (string, error) {
	m.once.Do(func() { close(m.began) })
	m.mu.Lock()
	defer m.mu.Unlock()
	m.held++
	return m.dir, nil
}

func (m *gateMounter) Release(context.Context, Volume) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.held--
	return nil
}

// roundTripFunc is an http.RoundTripper from a function.
type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// TestPullOverlapsVolumeMount: the image's pull and the volume's mount run
// at the same time. The registry's manifest is served only once the mount
// has begun, so hooks run one after the other (the pull first) would wait
// the manifest out and fail the attempt.
func TestPullOverlapsVolumeMount(t *testing.T) {
	m := &gateMounter{dir: t.TempDir(), began: make(chan struct{})}
	b := setup(t, setupOpts{
		cfg: func(c *Config) { c.Volumes = m },
		transport: func(next http.RoundTripper) http.RoundTripper {
			return roundTripFunc(func(r *http.Request) (*http.Response, error) {
				if strings.Contains(r.URL.Path, "/manifests/") {
					select {
					case <-m.began:
					case <-time.After(5 * time.Second):
						return nil, errors.New("the volume's mount had not begun 5s into the pull")
					}
				}
				return next.RoundTrip(r)
			})
		},
	})
	tk := b.task("overlap", "echo mounted")
	tk.Volumes = []Volume{vol("v1", "ws_a", "ws_a", "/data")}
	var rec recorder
	res, err := b.runner.Run(testCtx(t), tk, rec.output())
	if err != nil || res.State != StateSucceeded || !slices.Equal(rec.texts(Stdout), []string{"mounted"}) {
		t.Fatalf("Run = %s, %v, output %q; want SUCCEEDED printing \"mounted\"", res.State, err, rec.texts(Stdout))
	}
	checkPhases(t, rec.running().Phases)
	m.mu.Lock()
	defer m.mu.Unlock()
	if n := m.held; n != 0 {
		t.Errorf("volume still held %d times after the attempt", n)
	}
	b.assertClean(t, tk)
}
