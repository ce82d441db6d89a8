package store_test

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/levers9/levers9/controlplane/store"
	"github.com/levers9/levers9/internal/errdefs"
)

// TestTaskInput: a task's input is kept apart from its spec and read back
// only by TaskInput; a task without one has none; more than 1 MiB is
// refused by the column's CHECK.
func TestTaskInput(t *testing.T) {
	t.Parallel()
	b := setupTasks(t)
	in := bytes.Repeat([]byte{0, 1, 0xfe}, 1000)
	with := newTask(t, b.st, b.ws.ID, "default", func(tk *store.Task) { tk.Input = in })
	without := newTask(t, b.st, b.ws.ID, "default", nil)
	if got, err := b.st.TaskInput(b.ctx, with.ID); err != nil || !bytes.Equal(got, in) {
		t.Fatalf("TaskInput = %d bytes, %v; want the %d given", len(got), err, len(in))
	}
	if got, err := b.st.TaskInput(b.ctx, without.ID); err != nil || got != nil {
		t.Fatalf("TaskInput of a task without one = %q, %v", got, err)
	}
	if tk, _ := b.task(t, with.ID); tk.Input != nil || strings.Contains(string(tk.Spec), "input") {
		t.Errorf("GetTask carries the input: %d bytes, spec %s", len(tk.Input), tk.Spec)
	}
	if _, err := b.st.TaskInput(b.ctx, "t_nope"); !errdefs.IsNotFound(err) {
		t.Errorf("TaskInput of a missing task: %v", err)
	}
	_, _, err := b.st.InsertTask(b.ctx, store.Task{ID: "t_big", WorkspaceID: b.ws.ID, Pool: "default", Spec: []byte(`{}`),
		CreatedAt: time.Now(), Input: make([]byte, store.MaxInputBytes+1)})
	if !errdefs.IsInvalidArgument(err) {
		t.Errorf("an input over 1 MiB: %v, want invalid argument", err)
	}
}

// TestTaskResult: the result of a task's latest attempt, stored with its
// end; an empty file is a result, none is not; a result over 8 MiB is
// refused by the column's CHECK; an earlier attempt's result never shows
// once a later attempt exists; and another workspace sees no task.
func TestTaskResult(t *testing.T) {
	t.Parallel()
	b := setupTasks(t)
	end := func(t *testing.T, id string, n int, r store.AttemptResult) error {
		t.Helper()
		code := 0
		_, _, err := b.st.EndAttempt(b.ctx, id, n, store.AttemptEnd{State: store.AttemptSucceeded, ExitCode: &code, Result: r, At: time.Now()})
		return err
	}
	get := func(t *testing.T, ws, id string) store.TaskResult {
		t.Helper()
		r, err := b.st.GetTaskResult(b.ctx, ws, id)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}

	t.Run("never placed", func(t *testing.T) {
		tk := newTask(t, b.st, b.ws.ID, "default", nil)
		if r := get(t, b.ws.ID, tk.ID); r.State != store.TaskPending || r.Attempt != 0 || r.Result.Present || r.Result.Err != "" {
			t.Fatalf("result = %+v", r)
		}
	})
	for _, tc := range []struct {
		name string
		in   store.AttemptResult
	}{
		{"bytes", store.AttemptResult{Present: true, Data: []byte("\x00result\xff")}},
		{"an empty file", store.AttemptResult{Present: true, Data: []byte{}}},
		{"an empty file given as nil", store.AttemptResult{Present: true}},
		{"none", store.AttemptResult{}},
		{"too large for the agent", store.AttemptResult{Err: "the result is 9437184 bytes; the limit is 8 MiB"}},
		{"the largest", store.AttemptResult{Present: true, Data: bytes.Repeat([]byte{7}, store.MaxResultBytes)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tk := newTask(t, b.st, b.ws.ID, "default", nil)
			a := b.place(t, tk.ID)
			if r := get(t, b.ws.ID, tk.ID); r.State != store.TaskScheduled || r.Attempt != 1 || r.Result.Present {
				t.Fatalf("before the end: %+v", r)
			}
			if err := end(t, tk.ID, a.Number, tc.in); err != nil {
				t.Fatal(err)
			}
			r := get(t, b.ws.ID, tk.ID)
			if r.State != store.TaskSucceeded || r.Attempt != 1 || r.Result.Present != tc.in.Present ||
				!bytes.Equal(r.Result.Data, tc.in.Data) || r.Result.Err != tc.in.Err {
				t.Fatalf("result = state %s attempt %d present %v, %d bytes, %q; want %+v", r.State, r.Attempt, r.Result.Present,
					len(r.Result.Data), r.Result.Err, tc.in.Err)
			}
			if tc.in.Present && r.Result.Data == nil {
				t.Error("a present result came back as nil")
			}
			// The attempt lists never carry it.
			if _, atts := b.task(t, tk.ID); len(atts) != 1 || atts[0].State != store.AttemptSucceeded {
				t.Fatalf("attempts = %+v", atts)
			}
		})
	}

	t.Run("over 8 MiB", func(t *testing.T) {
		tk := newTask(t, b.st, b.ws.ID, "default", nil)
		a := b.place(t, tk.ID)
		err := end(t, tk.ID, a.Number, store.AttemptResult{Present: true, Data: make([]byte, store.MaxResultBytes+1)})
		if !errdefs.IsInvalidArgument(err) {
			t.Fatalf("a result over 8 MiB: %v, want invalid argument", err)
		}
	})

	t.Run("the last attempt's", func(t *testing.T) {
		tk := newTask(t, b.st, b.ws.ID, "default", func(tk *store.Task) { tk.Retries = 1 })
		a1 := b.place(t, tk.ID)
		// The first attempt ends on its machine only after the controlplane
		// gave it up as lost: its report changes nothing.
		if _, _, err := b.st.LoseAttempt(b.ctx, tk.ID, a1.Number, "agent gone"); err != nil {
			t.Fatal(err)
		}
		if err := end(t, tk.ID, a1.Number, store.AttemptResult{Present: true, Data: []byte("stale")}); err != nil {
			t.Fatal(err)
		}
		if r := get(t, b.ws.ID, tk.ID); r.State != store.TaskPending || r.Attempt != 1 || r.Result.Present {
			t.Fatalf("after the lost attempt: %+v", r)
		}
		a2 := b.place(t, tk.ID)
		if r := get(t, b.ws.ID, tk.ID); r.Attempt != 2 || r.Result.Present {
			t.Fatalf("while the second attempt runs: %+v", r)
		}
		if err := end(t, tk.ID, a2.Number, store.AttemptResult{}); err != nil {
			t.Fatal(err)
		}
		if r := get(t, b.ws.ID, tk.ID); r.State != store.TaskSucceeded || r.Attempt != 2 || r.Result.Present {
			t.Fatalf("a last attempt without a result: %+v", r)
		}
	})

	t.Run("workspace scoped", func(t *testing.T) {
		tk := newTask(t, b.st, b.ws.ID, "default", nil)
		other := newWorkspace(t, b.st)
		for _, ws := range []string{other.ID, ""} {
			_, err := b.st.GetTaskResult(b.ctx, ws, tk.ID)
			if !errdefs.IsNotFound(err) || !strings.Contains(err.Error(), "no task "+tk.ID) {
				t.Errorf("workspace %q: %v, want not found", ws, err)
			}
		}
		if _, err := b.st.GetTaskResult(b.ctx, b.ws.ID, "t_nope"); !errors.Is(err, errdefs.ErrNotFound) {
			t.Errorf("a missing task: %v", err)
		}
	})
}
