package taskrun

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/levers9/levers9/egress"
	"github.com/levers9/levers9/sandbox"
)

// record is what the Runner keeps on disk about an attempt whose container
// was started and not yet cleaned up, so an agent that restarts learns
// which attempts it lost (Reconcile) instead of forgetting them.
type record struct {
	TaskID      string    `json:"taskId"`
	Attempt     int       `json:"attempt"`
	Pool        string    `json:"pool"`
	ContainerID string    `json:"containerId"`
	ImageDigest string    `json:"imageDigest"`
	Started     time.Time `json:"started"`
	// What a restarted agent needs to go on with the attempt (Resume):
	// the timeout counts from Started, the resources name a limit kill,
	// the network re-adopts the container's namespace. No environment:
	// it may hold secrets.
	Timeout   time.Duration          `json:"timeout,omitempty"`
	Resources sandbox.Resources      `json:"resources"`
	Network   *egress.SecurityConfig `json:"network,omitempty"`
}

// Shipped is how far an attempt's reports reached the controlplane: the
// last acknowledged record number and the offsets in the container's
// output files just past the last acknowledged line of each stream. A
// restarted agent numbers its records from Seq+1 and reads the files from
// the offsets, so output written while no agent ran is shipped, and none
// twice.
type Shipped struct {
	Seq    uint64 `json:"seq"`
	Stdout int64  `json:"stdout"`
	Stderr int64  `json:"stderr"`
}

// shippedSuffix names the file of an attempt's Shipped beside its record.
const shippedSuffix = ".shipped"

func (r records) saveShipped(runID string, s Shipped) error {
	if r.dir == "" {
		return nil
	}
	if _, err := os.Stat(r.path(runID)); err != nil {
		// The attempt ended and was cleaned up: nothing to resume.
		return nil
	}
	b, _ := json.Marshal(s)
	p := filepath.Join(r.dir, runID+shippedSuffix)
	if err := os.WriteFile(p+".tmp", b, 0o600); err != nil {
		return fmt.Errorf("save shipped offsets of %s: %w", runID, err)
	}
	if err := os.Rename(p+".tmp", p); err != nil {
		return fmt.Errorf("save shipped offsets of %s: %w", runID, err)
	}
	return nil
}

// shipped returns what was saved, zero when nothing was.
func (r records) shipped(runID string) Shipped {
	var s Shipped
	if r.dir == "" {
		return s
	}
	if b, err := os.ReadFile(filepath.Join(r.dir, runID+shippedSuffix)); err == nil {
		_ = json.Unmarshal(b, &s)
	}
	return s
}

// records stores one JSON file per attempt under dir; a zero dir keeps
// nothing.
type records struct{ dir string }

func (r records) path(runID string) string { return filepath.Join(r.dir, runID+".json") }

func (r records) save(runID string, rec record) error {
	if r.dir == "" {
		return nil
	}
	if err := os.MkdirAll(r.dir, 0o700); err != nil {
		return fmt.Errorf("save attempt record %s: %w", runID, err)
	}
	b, err := json.Marshal(rec)
	if err != nil {
		return fmt.Errorf("save attempt record %s: %w", runID, err)
	}
	tmp := r.path(runID) + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return fmt.Errorf("save attempt record %s: %w", runID, err)
	}
	if err := os.Rename(tmp, r.path(runID)); err != nil {
		return fmt.Errorf("save attempt record %s: %w", runID, err)
	}
	return nil
}

func (r records) remove(runID string) error {
	if r.dir == "" {
		return nil
	}
	if err := os.Remove(r.path(runID)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove attempt record %s: %w", runID, err)
	}
	if err := os.Remove(filepath.Join(r.dir, runID+shippedSuffix)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove attempt record %s: %w", runID, err)
	}
	return nil
}

// list reads every record; unreadable ones are returned as errors and
// skipped.
func (r records) list() ([]record, []string, error) {
	if r.dir == "" {
		return nil, nil, nil
	}
	ents, err := os.ReadDir(r.dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil, nil
	}
	if err != nil {
		return nil, nil, fmt.Errorf("list attempt records: %w", err)
	}
	var out []record
	var names []string
	var errs []error
	for _, e := range ents {
		name, ok := strings.CutSuffix(e.Name(), ".json")
		if !ok {
			continue
		}
		b, err := os.ReadFile(filepath.Join(r.dir, e.Name()))
		var rec record
		if err == nil {
			err = json.Unmarshal(b, &rec)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("attempt record %s: %w", e.Name(), err))
			names = append(names, name)
			continue
		}
		out = append(out, rec)
		names = append(names, name)
	}
	return out, names, errors.Join(errs...)
}
