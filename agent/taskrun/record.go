package taskrun

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"
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
