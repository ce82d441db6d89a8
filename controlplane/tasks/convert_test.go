package tasks

import (
	"testing"

	v1 "github.com/levers9/levers9/api/levers9/v1"
	"github.com/levers9/levers9/controlplane/store"
)

// Every store state has exactly one API enum and every API enum but
// UNSPECIFIED one store state, both ways, and terminal means the same on
// both sides.
func TestStateMappingIsExhaustive(t *testing.T) {
	seen := map[v1.TaskState]store.TaskState{}
	for _, st := range store.TaskStates() {
		pb := taskStatePB(st)
		if pb == v1.TaskState_TASK_STATE_UNSPECIFIED {
			t.Errorf("task state %s has no API enum", st)
		}
		if other, dup := seen[pb]; dup {
			t.Errorf("task states %s and %s both map to %v", st, other, pb)
		}
		seen[pb] = st
		if back, ok := taskStateOf(pb); !ok || back != st {
			t.Errorf("%v maps back to %q, want %s", pb, back, st)
		}
		if terminal(pb) != st.Terminal() {
			t.Errorf("%s: terminal in the API %v, in the store %v", st, terminal(pb), st.Terminal())
		}
	}
	for n := range v1.TaskState_name {
		pb := v1.TaskState(n)
		if _, ok := taskStateOf(pb); ok != (pb != v1.TaskState_TASK_STATE_UNSPECIFIED) {
			t.Errorf("API task state %v: mapped=%v", pb, ok)
		}
	}
	if len(taskStatesPB) != len(store.TaskStates()) {
		t.Errorf("the mapping has %d task states, the store %d", len(taskStatesPB), len(store.TaskStates()))
	}

	seenA := map[v1.AttemptState]store.AttemptState{}
	for _, st := range store.AttemptStates() {
		pb := attemptStatePB(st)
		if pb == v1.AttemptState_ATTEMPT_STATE_UNSPECIFIED {
			t.Errorf("attempt state %s has no API enum", st)
		}
		if other, dup := seenA[pb]; dup {
			t.Errorf("attempt states %s and %s both map to %v", st, other, pb)
		}
		seenA[pb] = st
		if back, ok := attemptStateOf(pb); !ok || back != st {
			t.Errorf("%v maps back to %q, want %s", pb, back, st)
		}
		// An attempt's end gives its task the state of the same name.
		if end, ok := st.TaskEnd(); ok && taskStatePB(end).String()[len("TASK_STATE_"):] != pb.String()[len("ATTEMPT_STATE_"):] {
			t.Errorf("attempt %s ends its task as %s", st, end)
		}
	}
	for n := range v1.AttemptState_name {
		pb := v1.AttemptState(n)
		if _, ok := attemptStateOf(pb); ok != (pb != v1.AttemptState_ATTEMPT_STATE_UNSPECIFIED) {
			t.Errorf("API attempt state %v: mapped=%v", pb, ok)
		}
	}
	if len(attemptStatesPB) != len(store.AttemptStates()) {
		t.Errorf("the mapping has %d attempt states, the store %d", len(attemptStatesPB), len(store.AttemptStates()))
	}
}

func TestParsePageToken(t *testing.T) {
	tests := []struct {
		token   string
		wantID  string
		wantErr bool
	}{
		{"", "", false},
		{"1700000000000000000_t_abc", "t_abc", false},
		{"garbage", "", true},
		{"12abc_t_x", "", true},
		{"_t_x", "", true},
	}
	for _, tt := range tests {
		_, id, err := parsePageToken(tt.token)
		if (err != nil) != tt.wantErr || id != tt.wantID {
			t.Errorf("parsePageToken(%q) = %q, %v", tt.token, id, err)
		}
	}
}

func TestReasonMapping(t *testing.T) {
	for _, r := range store.Reasons() {
		if got, ok := reasonOf(reasonPB(r)); !ok || got != r {
			t.Errorf("reason %q does not round-trip: %q", r, got)
		}
	}
	for n := range v1.FailureReason_name {
		if _, ok := reasonOf(v1.FailureReason(n)); !ok {
			t.Errorf("API reason %v is not mapped", v1.FailureReason(n))
		}
	}
	if len(reasonsPB) != len(store.Reasons()) {
		t.Errorf("the mapping has %d reasons, the store %d", len(reasonsPB), len(store.Reasons()))
	}
}
