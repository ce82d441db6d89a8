package store_test

import (
	"context"
	"errors"
	"testing"

	"github.com/levers9/levers9/controlplane/store"
	"github.com/levers9/levers9/internal/errdefs"
)

// Postgres itself refuses a state outside the closed sets, whatever query
// tries to write it, and says so as a bad argument.
func TestDatabaseRefusesUnknownStates(t *testing.T) {
	t.Parallel()
	st := newStore(t)
	ws := newWorkspace(t, st)
	tk := newTask(t, st, ws.ID, "default", nil)
	tests := []struct {
		name, sql string
	}{
		{"task state", `UPDATE tasks SET state = 'BOGUS' WHERE id = '` + tk.ID + `' RETURNING id`},
		{"negative retries", `UPDATE tasks SET retries = -1 WHERE id = '` + tk.ID + `' RETURNING id`},
		{"attempt state", `INSERT INTO task_attempts (task_id, number, machine_id, state, cpu_millis, memory_bytes)
			VALUES ('` + tk.ID + `', 1, 'm_x', 'DONE', 1, 1) RETURNING task_id`},
		{"attempt number", `INSERT INTO task_attempts (task_id, number, machine_id, state, cpu_millis, memory_bytes)
			VALUES ('` + tk.ID + `', 0, 'm_x', 'SCHEDULED', 1, 1) RETURNING task_id`},
	}
	for _, tt := range tests {
		if _, err := st.QueryStringsForTest(context.Background(), tt.sql); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("%s: %v, want a refused write", tt.name, err)
		}
	}
	got, _, err := st.GetTask(context.Background(), ws.ID, tk.ID)
	if err != nil || got.State != store.TaskPending || got.Retries != tk.Retries {
		t.Fatalf("after the refused writes: %+v, %v", got, err)
	}
}
