package cli

import (
	"fmt"
	"math"
	"regexp"
	"strconv"
	"strings"
	"time"

	v1 "github.com/levers9/levers9/api/levers9/v1"
	"github.com/levers9/levers9/sdk"
	"github.com/levers9/levers9/volumes"
)

// runFlags are the task flags of `levers9 run`, as typed.
type runFlags struct {
	pool, gpuType, image, memory string
	gpus, retries                int
	cpu                          float64
	timeout                      time.Duration
	env, secrets, volumes        []string
	detach                       bool
}

// options turns the flags into SDK function options, reporting every bad
// flag at once so nothing is submitted on bad input.
func (f *runFlags) options() ([]sdk.FunctionOption, error) {
	var problems []string
	opts := []sdk.FunctionOption{sdk.Image(f.image), sdk.Pool(f.pool)}
	if f.gpus < 0 {
		problems = append(problems, fmt.Sprintf("--gpu %d: want a number of GPUs, 0 or more", f.gpus))
	} else if f.gpus > 0 || f.gpuType != "" {
		if f.gpus == 0 {
			problems = append(problems, fmt.Sprintf("--gpu-type %s needs --gpu N", f.gpuType))
		}
		opts = append(opts, sdk.GPU(f.gpus, f.gpuType))
	}
	if f.cpu != 0 {
		if m := math.Round(f.cpu * 1000); math.IsNaN(f.cpu) || m < 1 || m > math.MaxInt32 {
			problems = append(problems, fmt.Sprintf("--cpu %v: want cores, e.g. 0.5 or 4", f.cpu))
		} else {
			opts = append(opts, sdk.CPU(f.cpu))
		}
	}
	if f.memory != "" {
		b, err := parseMemory(f.memory)
		if err != nil {
			problems = append(problems, "--memory "+err.Error())
		} else {
			opts = append(opts, sdk.Memory(b))
		}
	}
	if f.timeout < 0 {
		problems = append(problems, fmt.Sprintf("--timeout %s: want a positive duration, e.g. 10m", f.timeout))
	} else if f.timeout > 0 {
		opts = append(opts, sdk.Timeout(f.timeout))
	}
	if f.retries < 0 {
		problems = append(problems, fmt.Sprintf("--retries %d: want 0 or more", f.retries))
	} else {
		opts = append(opts, sdk.Retries(f.retries))
	}
	for _, kv := range f.env {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || !envName.MatchString(k) {
			problems = append(problems, fmt.Sprintf("--env %q: want KEY=VALUE with KEY of letters, digits and _", kv))
			continue
		}
		opts = append(opts, sdk.Env(k, v))
	}
	for _, n := range f.secrets {
		opts = append(opts, sdk.Secret(n))
	}
	for _, v := range f.volumes {
		ref, err := volumes.ParseRef(v)
		if err != nil {
			problems = append(problems, "--volume "+err.Error())
			continue
		}
		if ref.ReadOnly {
			opts = append(opts, sdk.ReadOnlyVolume(ref.Name, ref.Path))
		} else {
			opts = append(opts, sdk.Volume(ref.Name, ref.Path))
		}
	}
	if len(problems) > 0 {
		return nil, fmt.Errorf("bad flags, nothing was submitted:\n  %s", strings.Join(problems, "\n  "))
	}
	return opts, nil
}

var envName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

var memoryUnits = map[string]uint64{
	"": 1, "b": 1,
	"k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12,
	"ki": 1 << 10, "mi": 1 << 20, "gi": 1 << 30, "ti": 1 << 40,
}

var memoryRe = regexp.MustCompile(`^([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)$`)

// parseMemory reads a size like 512Mi, 2Gi, 1.5G or 1048576 (bytes);
// units are case-insensitive, Ki/Mi/Gi/Ti binary and K/M/G/T decimal.
func parseMemory(s string) (uint64, error) {
	bad := fmt.Errorf("%q: want a size like 512Mi, 2Gi or 1048576 (bytes)", s)
	m := memoryRe.FindStringSubmatch(strings.TrimSpace(s))
	if m == nil {
		return 0, bad
	}
	unit, ok := memoryUnits[strings.ToLower(strings.TrimSuffix(strings.TrimSuffix(m[2], "B"), "b"))]
	if !ok && m[2] != "" {
		unit, ok = memoryUnits[strings.ToLower(m[2])]
	}
	if !ok {
		return 0, bad
	}
	n, err := strconv.ParseFloat(m[1], 64)
	if err != nil {
		return 0, bad
	}
	b := n * float64(unit)
	if b < float64(sdk.MiB) || b > float64(1<<60) {
		return 0, fmt.Errorf("%q: want between 1Mi and 1Ei", s)
	}
	return uint64(b), nil
}

// parseStates reads --state values (comma-separated or repeated).
func parseStates(vals []string) ([]v1.TaskState, error) {
	var out []v1.TaskState
	for _, v := range vals {
		for _, s := range strings.Split(v, ",") {
			s = strings.TrimSpace(s)
			if s == "" {
				continue
			}
			name := "TASK_STATE_" + strings.ToUpper(strings.ReplaceAll(s, "-", "_"))
			st, ok := v1.TaskState_value[name]
			if !ok || st == 0 {
				return nil, fmt.Errorf("--state %q: want one of %s", s, strings.Join(stateNames(), ", "))
			}
			out = append(out, v1.TaskState(st))
		}
	}
	return out, nil
}

func stateNames() []string {
	var names []string
	for i := int32(1); ; i++ {
		if _, ok := v1.TaskState_name[i]; !ok {
			return names
		}
		names = append(names, sdk.StateName(v1.TaskState(i)))
	}
}
