package inventory

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"reflect"
	"sync"
	"testing"
)

// fakeNVML is an nvmlLib standing in for libnvidia-ml on this GPU-less
// machine; errors are injected per call.
type fakeNVML struct {
	initErr, driverErr, cudaErr, countErr error
	driver                                string
	cuda                                  int
	devices                               []fakeDevice
	handleErr                             map[int]error

	mu sync.Mutex // guards the counters below
	// inits and shutdowns count the calls, to check they pair up.
	inits, shutdowns int
}

type fakeDevice struct {
	uuid, name               string
	mem                      uint64
	uuidErr, nameErr, memErr error
}

var _ nvmlLib = (*fakeNVML)(nil)

func (f *fakeNVML) Init() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.inits++
	return f.initErr
}

func (f *fakeNVML) Shutdown() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.shutdowns++
	return nil
}

func (f *fakeNVML) SystemGetDriverVersion() (string, error)  { return f.driver, f.driverErr }
func (f *fakeNVML) SystemGetCudaDriverVersion() (int, error) { return f.cuda, f.cudaErr }
func (f *fakeNVML) DeviceGetCount() (int, error)             { return len(f.devices), f.countErr }

func (f *fakeNVML) DeviceGetHandleByIndex(i int) (nvmlDevice, error) {
	if err := f.handleErr[i]; err != nil {
		return nil, err
	}
	if i < 0 || i >= len(f.devices) {
		return nil, fmt.Errorf("fake: invalid index %d", i)
	}
	return f.devices[i], nil
}

func (d fakeDevice) GetUUID() (string, error)        { return d.uuid, d.uuidErr }
func (d fakeDevice) GetName() (string, error)        { return d.name, d.nameErr }
func (d fakeDevice) GetMemoryTotal() (uint64, error) { return d.mem, d.memErr }

// twoL40S is a fake machine with two GPUs.
func twoL40S() *fakeNVML {
	return &fakeNVML{
		driver: "550.54.15",
		cuda:   12040,
		devices: []fakeDevice{
			{uuid: "GPU-11111111-2222-3333-4444-555555555555", name: "NVIDIA L40S", mem: 48 << 30},
			{uuid: "GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee", name: "NVIDIA L40S", mem: 46068 << 20},
		},
	}
}

// recordingHandler keeps every log record, to check what NVML logs.
type recordingHandler struct {
	mu      sync.Mutex // guards records
	records []slog.Record
}

func (h *recordingHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *recordingHandler) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.records = append(h.records, r)
	return nil
}
func (h *recordingHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *recordingHandler) WithGroup(string) slog.Handler      { return h }

// levels returns the level of every record so far.
func (h *recordingHandler) levels() []slog.Level {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []slog.Level
	for _, r := range h.records {
		out = append(out, r.Level)
	}
	return out
}

func TestNVMLMapsDevices(t *testing.T) {
	t.Parallel()
	lib := twoL40S()
	logs := &recordingHandler{}
	gpus, err := newNVMLWith(lib, slog.New(logs)).GPUs(context.Background())
	if err != nil {
		t.Fatalf("GPUs: %v", err)
	}
	want := []GPU{
		{Index: 0, UUID: "GPU-11111111-2222-3333-4444-555555555555", Name: "NVIDIA L40S", MemoryTotalBytes: 48 << 30, DriverVersion: "550.54.15", CUDADriverVersion: "12.4"},
		{Index: 1, UUID: "GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee", Name: "NVIDIA L40S", MemoryTotalBytes: 46068 << 20, DriverVersion: "550.54.15", CUDADriverVersion: "12.4"},
	}
	if !reflect.DeepEqual(gpus, want) {
		t.Fatalf("GPUs =\n%+v\nwant\n%+v", gpus, want)
	}
	if lib.inits != 1 || lib.shutdowns != 1 {
		t.Errorf("Init called %d times, Shutdown %d: want 1 and 1", lib.inits, lib.shutdowns)
	}
	if l := logs.levels(); len(l) != 0 {
		t.Errorf("logged %v on success, want nothing", l)
	}
}

func TestNVMLNoDriverIsQuiet(t *testing.T) {
	t.Parallel()
	for _, initErr := range []error{errNVMLLibraryNotFound, errNVMLDriverNotLoaded, errNVMLNotBuilt, fmt.Errorf("wrapped: %w", errNVMLLibraryNotFound)} {
		t.Run(initErr.Error(), func(t *testing.T) {
			t.Parallel()
			lib := twoL40S()
			lib.initErr = initErr
			logs := &recordingHandler{}
			n := newNVMLWith(lib, slog.New(logs))
			for range 3 {
				gpus, err := n.GPUs(context.Background())
				if err != nil || len(gpus) != 0 {
					t.Fatalf("GPUs = %v, %v; want none and no error", gpus, err)
				}
			}
			if lib.inits != 3 {
				t.Errorf("Init called %d times for 3 calls; a later driver install must be seen", lib.inits)
			}
			if lib.shutdowns != 0 {
				t.Errorf("Shutdown called %d times after a failed Init", lib.shutdowns)
			}
			if l := logs.levels(); len(l) != 1 || l[0] != slog.LevelDebug {
				t.Errorf("logged levels %v over 3 calls, want exactly one debug line", l)
			}
		})
	}
}

func TestNVMLErrors(t *testing.T) {
	t.Parallel()
	boom := errors.New("ERROR_UNKNOWN")
	tests := []struct {
		name     string
		break_   func(f *fakeNVML)
		wantErr  string
		wantGPUs []string // UUIDs still returned
	}{
		{name: "init", break_: func(f *fakeNVML) { f.initErr = boom }, wantErr: "nvml init: ERROR_UNKNOWN"},
		{name: "driver version", break_: func(f *fakeNVML) { f.driverErr = boom }, wantErr: "nvml driver version: ERROR_UNKNOWN"},
		{name: "cuda version", break_: func(f *fakeNVML) { f.cudaErr = boom }, wantErr: "nvml cuda driver version: ERROR_UNKNOWN"},
		{name: "count", break_: func(f *fakeNVML) { f.countErr = boom }, wantErr: "nvml device count: ERROR_UNKNOWN"},
		{
			name:     "handle of gpu 1",
			break_:   func(f *fakeNVML) { f.handleErr = map[int]error{1: boom} },
			wantErr:  "nvml gpu 1: handle: ERROR_UNKNOWN",
			wantGPUs: []string{"GPU-11111111-2222-3333-4444-555555555555"},
		},
		{
			name:     "uuid of gpu 0",
			break_:   func(f *fakeNVML) { f.devices[0].uuidErr = boom },
			wantErr:  "nvml gpu 0: uuid: ERROR_UNKNOWN",
			wantGPUs: []string{"GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee"},
		},
		{
			name:     "name of gpu 1",
			break_:   func(f *fakeNVML) { f.devices[1].nameErr = boom },
			wantErr:  "nvml gpu 1 (GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee): name: ERROR_UNKNOWN",
			wantGPUs: []string{"GPU-11111111-2222-3333-4444-555555555555"},
		},
		{
			name: "memory of both",
			break_: func(f *fakeNVML) {
				f.devices[0].memErr = boom
				f.devices[1].memErr = boom
			},
			wantErr: "nvml gpu 0 (GPU-11111111-2222-3333-4444-555555555555): memory: ERROR_UNKNOWN\n" +
				"nvml gpu 1 (GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee): memory: ERROR_UNKNOWN",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			lib := twoL40S()
			tt.break_(lib)
			gpus, err := newNVMLWith(lib, slog.New(&recordingHandler{})).GPUs(context.Background())
			if err == nil || err.Error() != tt.wantErr {
				t.Fatalf("error %v, want %q", err, tt.wantErr)
			}
			if !errors.Is(err, boom) {
				t.Errorf("error %v does not wrap the NVML error", err)
			}
			var uuids []string
			for _, g := range gpus {
				uuids = append(uuids, g.UUID)
			}
			if !reflect.DeepEqual(uuids, tt.wantGPUs) {
				t.Errorf("GPUs returned %v, want %v", uuids, tt.wantGPUs)
			}
			if lib.inits != lib.shutdowns+boolToInt(lib.initErr != nil) {
				t.Errorf("Init called %d times, Shutdown %d: they must pair up", lib.inits, lib.shutdowns)
			}
		})
	}
}

func TestNVMLCancelled(t *testing.T) {
	t.Parallel()
	lib := twoL40S()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	gpus, err := newNVMLWith(lib, slog.New(&recordingHandler{})).GPUs(ctx)
	if !errors.Is(err, context.Canceled) || gpus != nil {
		t.Fatalf("GPUs = %v, %v; want nil, context.Canceled", gpus, err)
	}
	if lib.shutdowns != 1 {
		t.Errorf("Shutdown called %d times, want 1", lib.shutdowns)
	}
}

func TestFormatCUDAVersion(t *testing.T) {
	t.Parallel()
	for in, want := range map[int]string{12040: "12.4", 12000: "12.0", 11080: "11.8", 12090: "12.9", 13010: "13.1", 10010: "10.1", 0: "", -1: ""} {
		if got := formatCUDAVersion(in); got != want {
			t.Errorf("formatCUDAVersion(%d) = %q, want %q", in, got, want)
		}
	}
}

// TestNVMLOnThisMachine runs the real library path. Without an NVIDIA
// driver (this development machine) NVML must report zero GPUs with one debug
// line in all; on a GPU machine what it reports must be well formed.
func TestNVMLOnThisMachine(t *testing.T) {
	t.Parallel()
	_, statErr := os.Stat("/dev/nvidiactl")
	noDriver := errors.Is(statErr, fs.ErrNotExist)
	logs := &recordingHandler{}
	n := NewNVML(slog.New(logs))
	const calls = 2 // the second call runs after a full Init/Shutdown cycle
	for range calls {
		gpus, err := n.GPUs(context.Background())
		if err != nil {
			t.Fatalf("GPUs: %v", err)
		}
		if noDriver && len(gpus) != 0 {
			t.Fatalf("GPUs = %+v without /dev/nvidiactl, want none", gpus)
		}
		for _, g := range gpus {
			if g.UUID == "" || g.MemoryTotalBytes == 0 || g.DriverVersion == "" {
				t.Errorf("GPU %d is missing facts: %+v", g.Index, g)
			}
		}
	}
	levels := logs.levels()
	for _, l := range levels {
		if l != slog.LevelDebug {
			t.Errorf("logged at %v, want debug only", l)
		}
	}
	if noDriver && len(levels) != 1 {
		t.Errorf("logged %d lines for %d calls without a driver, want exactly one", len(levels), calls)
	}
}

func boolToInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// TestNVMLConcurrent runs the real library path from several goroutines and
// NVML values at once; run with -race.
func TestNVMLConcurrent(t *testing.T) {
	t.Parallel()
	listers := []*NVML{NewNVML(slog.New(&recordingHandler{})), NewNVML(slog.New(&recordingHandler{}))}
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for i := range 8 {
		wg.Go(func() {
			if _, err := listers[i%2].GPUs(context.Background()); err != nil {
				errs <- err
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}
