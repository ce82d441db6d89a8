package store

import (
	"errors"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/levers9/levers9/internal/errdefs"
)

func TestTaskMoves(t *testing.T) {
	legal := map[[2]TaskState]bool{}
	for _, from := range TaskStates() {
		for _, to := range taskMoves[from] {
			legal[[2]TaskState{from, to}] = true
		}
	}
	// The documented lifecycle, move by move.
	want := [][2]TaskState{
		{TaskPending, TaskScheduled}, {TaskPending, TaskCancelled},
		{TaskScheduled, TaskRunning}, {TaskScheduled, TaskPending}, {TaskScheduled, TaskSucceeded}, {TaskScheduled, TaskFailed},
		{TaskScheduled, TaskCancelled}, {TaskScheduled, TaskTimedOut},
		{TaskRunning, TaskPending}, {TaskRunning, TaskSucceeded}, {TaskRunning, TaskFailed}, {TaskRunning, TaskCancelled}, {TaskRunning, TaskTimedOut},
	}
	if len(want) != len(legal) {
		t.Errorf("%d legal task moves, want %d", len(legal), len(want))
	}
	for _, m := range want {
		if !legal[m] {
			t.Errorf("%s -> %s should be legal", m[0], m[1])
		}
	}
	for _, from := range TaskStates() {
		for _, to := range append(TaskStates(), "BOGUS") {
			err := from.CanMove(to)
			if (err == nil) != legal[[2]TaskState{from, to}] {
				t.Errorf("%s.CanMove(%s) = %v", from, to, err)
			}
			if err != nil && !errors.Is(err, errdefs.ErrFailedPrecondition) {
				t.Errorf("%s.CanMove(%s): %v is not a failed precondition", from, to, err)
			}
		}
		if from.Terminal() != slices.Contains([]TaskState{TaskSucceeded, TaskFailed, TaskCancelled, TaskTimedOut}, from) {
			t.Errorf("%s.Terminal() = %v", from, from.Terminal())
		}
	}
	if TaskState("BOGUS").Valid() || TaskState("BOGUS").Terminal() {
		t.Error("an unknown state is valid or terminal")
	}
}

func TestAttemptMoves(t *testing.T) {
	for _, from := range AttemptStates() {
		for _, to := range AttemptStates() {
			want := from.Active() && !to.Active() || from == AttemptScheduled && to == AttemptRunning
			if got := from.CanMove(to) == nil; got != want {
				t.Errorf("%s -> %s legal=%v, want %v", from, to, got, want)
			}
		}
		if from.Terminal() == from.Active() {
			t.Errorf("%s: terminal and active must be opposites", from)
		}
		_, ends := from.TaskEnd()
		if ends != (from.Terminal() && from != AttemptLost) {
			t.Errorf("%s.TaskEnd() ok=%v", from, ends)
		}
	}
}

// The SQL of each move selects exactly the rows the table lets move.
func TestSources(t *testing.T) {
	tests := []struct {
		got, want []string
	}{
		{TaskScheduled.sources(), []string{"PENDING"}},
		{TaskRunning.sources(), []string{"SCHEDULED"}},
		{TaskPending.sources(), []string{"SCHEDULED", "RUNNING"}},
		{TaskCancelled.sources(), []string{"PENDING", "SCHEDULED", "RUNNING"}},
		{AttemptRunning.sources(), []string{"SCHEDULED"}},
		{AttemptLost.sources(), []string{"SCHEDULED", "RUNNING"}},
		{AttemptSucceeded.sources(), []string{"SCHEDULED", "RUNNING"}},
		{AttemptScheduled.sources(), nil},
	}
	for i, tt := range tests {
		if !slices.Equal(tt.got, tt.want) {
			t.Errorf("%d: sources %v, want %v", i, tt.got, tt.want)
		}
	}
	if sqlActiveAttempts != "('SCHEDULED', 'RUNNING')" || sqlActiveTasks != "('SCHEDULED', 'RUNNING')" || sqlPending != "'PENDING'" {
		t.Error("the SQL spellings of the active and pending sets drifted from the constants")
	}
	for _, s := range AttemptStates() {
		if s.Active() != slices.Contains(activeSet(sqlActiveAttempts), string(s)) {
			t.Errorf("attempt %s: Active() disagrees with the SQL set", s)
		}
	}
	for _, s := range TaskStates() {
		if s.Active() != slices.Contains(activeSet(sqlActiveTasks), string(s)) {
			t.Errorf("task %s: Active() disagrees with the SQL set", s)
		}
	}
}

// activeSet is the states a SQL set literal names.
func activeSet(sql string) []string {
	var out []string
	for _, s := range TaskStates() {
		if strings.Contains(sql, "'"+string(s)+"'") {
			out = append(out, string(s))
		}
	}
	return out
}

// The CHECK constraints list exactly the Go constants.
func TestCheckConstraintsListTheStates(t *testing.T) {
	sql, err := migrations.ReadFile("migrations/00004_task_state_checks.sql")
	if err != nil {
		t.Fatal(err)
	}
	lists := regexp.MustCompile(`(?s)CONSTRAINT (\w+)_state_known\s+CHECK \(state IN \(([^)]*)\)\)`).FindAllStringSubmatch(string(sql), -1)
	got := map[string][]string{}
	for _, m := range lists {
		for _, v := range strings.Split(m[2], ",") {
			got[m[1]] = append(got[m[1]], strings.Trim(strings.TrimSpace(v), "'"))
		}
	}
	var tasks, attempts []string
	for _, s := range TaskStates() {
		tasks = append(tasks, string(s))
	}
	for _, s := range AttemptStates() {
		attempts = append(attempts, string(s))
	}
	if !slices.Equal(got["tasks"], tasks) || !slices.Equal(got["task_attempts"], attempts) {
		t.Fatalf("CHECK lists %v, want tasks %v and task_attempts %v", got, tasks, attempts)
	}
}

// The reasons' CHECK constraint lists exactly the Go constants.
func TestCheckConstraintListsTheReasons(t *testing.T) {
	sql, err := migrations.ReadFile("migrations/00008_attempt_reasons.sql")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?s)CHECK \(reason IN \(([^)]*)\)\)`).FindStringSubmatch(string(sql))
	if m == nil {
		t.Fatal("no reason CHECK in 00008")
	}
	var got, want []string
	for _, v := range strings.Split(m[1], ",") {
		got = append(got, strings.Trim(strings.TrimSpace(v), "'"))
	}
	for _, r := range Reasons() {
		want = append(want, string(r))
		if r.MachineFault() && !r.NotStarted() {
			t.Errorf("%q: a machine's fault must mean the program never ran", r)
		}
	}
	if !slices.Equal(got, want) {
		t.Fatalf("CHECK lists %v, want %v", got, want)
	}
	if Reason("bogus").Valid() {
		t.Error("an unknown reason is valid")
	}
}
