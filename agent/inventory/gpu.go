package inventory

import (
	"context"
	"fmt"
	"strconv"
	"strings"
)

// GPULister lists the machine's GPUs.
//
// Contract: GPUs blocks until the devices are read (NVML calls are not
// cancellable; ctx is checked between devices) and is safe to call
// concurrently. A machine without GPUs or without a GPU driver returns an
// empty list and a nil error. When some devices cannot be read, GPUs returns
// the ones that could, plus an error naming each failed device index.
type GPULister interface {
	GPUs(ctx context.Context) ([]GPU, error)
}

// NoGPUs is a [GPULister] for machines that must never offer GPUs.
type NoGPUs struct{}

var _ GPULister = NoGPUs{}

// GPUs returns no GPUs.
func (NoGPUs) GPUs(context.Context) ([]GPU, error) { return nil, nil }

// FilterVisible keeps the GPUs selected by spec, which uses the syntax of
// NVIDIA_VISIBLE_DEVICES: "all"; "", "none" or "void" for no GPU; or a comma
// separated list of indices and UUIDs ("0,GPU-5f3c..."). The result keeps
// the order of gpus. An entry naming no GPU, or named twice, is an error
// naming the entry.
func FilterVisible(gpus []GPU, spec string) ([]GPU, error) {
	switch strings.TrimSpace(spec) {
	case "all":
		return gpus, nil
	case "", "none", "void":
		return nil, nil
	}
	want := make(map[int]bool) // by position in gpus
	for i, entry := range strings.Split(spec, ",") {
		entry = strings.TrimSpace(entry)
		pos := -1
		if idx, err := strconv.Atoi(entry); err == nil {
			for p, g := range gpus {
				if g.Index == idx {
					pos = p
					break
				}
			}
		} else if entry != "" {
			for p, g := range gpus {
				if g.UUID == entry {
					pos = p
					break
				}
			}
		}
		if pos < 0 {
			return nil, fmt.Errorf("visible devices: entry %d (%q): no such GPU", i, truncate(entry, 64))
		}
		if want[pos] {
			return nil, fmt.Errorf("visible devices: entry %d (%q): GPU listed twice", i, truncate(entry, 64))
		}
		want[pos] = true
	}
	out := make([]GPU, 0, len(want))
	for p, g := range gpus {
		if want[p] {
			out = append(out, g)
		}
	}
	return out, nil
}
