package store_test

import (
	"context"
	"testing"

	"github.com/levers9/levers9/controlplane/store"
	"github.com/levers9/levers9/internal/errdefs"
	"github.com/levers9/levers9/internal/ids"
)

func TestVolumes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st := newStore(t)
	ws, other := newWorkspace(t, st), newWorkspace(t, st)

	v, err := st.InsertVolume(ctx, store.Volume{ID: ids.New("vol"), WorkspaceID: ws.ID, Name: "data", Driver: "seaweedfs", QuotaBytes: 1 << 30})
	if err != nil {
		t.Fatal(err)
	}
	if v.State != store.VolumeReady || v.QuotaBytes != 1<<30 || v.CreatedAt.IsZero() {
		t.Fatalf("inserted %+v", v)
	}
	if _, err := st.InsertVolume(ctx, store.Volume{ID: ids.New("vol"), WorkspaceID: ws.ID, Name: "data", Driver: "seaweedfs"}); !errdefs.IsAlreadyExists(err) {
		t.Fatalf("same name twice: %v, want already exists", err)
	}
	// The same name in another workspace is another volume.
	if _, err := st.InsertVolume(ctx, store.Volume{ID: ids.New("vol"), WorkspaceID: other.ID, Name: "data", Driver: "seaweedfs"}); err != nil {
		t.Fatal(err)
	}
	if _, err := st.InsertVolume(ctx, store.Volume{ID: ids.New("vol"), WorkspaceID: ws.ID, Name: "neg", Driver: "seaweedfs", QuotaBytes: -1}); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("negative quota: %v, want invalid argument", err)
	}
	list, err := st.ListVolumes(ctx, ws.ID)
	if err != nil || len(list) != 1 || list[0].ID != v.ID {
		t.Fatalf("list = %+v, %v", list, err)
	}
	if got, err := st.GetVolume(ctx, other.ID, "data"); err != nil || got.ID == v.ID {
		t.Fatalf("other workspace's data = %+v, %v; want its own", got, err)
	}
	if _, err := st.GetVolume(ctx, ws.ID, "nope"); !errdefs.IsNotFound(err) {
		t.Fatalf("missing volume: %v", err)
	}

	// An unfinished task using it blocks the delete; a task of another
	// workspace naming the same volume does not count.
	user := newTask(t, st, ws.ID, "default", func(tk *store.Task) {
		tk.Spec = []byte(`{"volumes":[{"name":"data","path":"/data"}]}`)
	})
	newTask(t, st, other.ID, "default", func(tk *store.Task) {
		tk.Spec = []byte(`{"volumes":[{"name":"other","path":"/data"}]}`)
	})
	users, err := st.VolumeUsers(ctx, ws.ID, "data")
	if err != nil || len(users) != 1 || users[0] != user.ID {
		t.Fatalf("users = %v, %v; want [%s]", users, err, user.ID)
	}
	if _, err := st.MarkVolumeDeleting(ctx, ws.ID, "data"); !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("delete while used: %v, want failed precondition", err)
	}
	if _, err := st.RequestCancel(ctx, ws.ID, user.ID); err != nil {
		t.Fatal(err)
	}
	d, err := st.MarkVolumeDeleting(ctx, ws.ID, "data")
	if err != nil || d.State != store.VolumeDeleting {
		t.Fatalf("delete once finished: %+v, %v", d, err)
	}
	if err := st.DeleteVolumeRow(ctx, d.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := st.GetVolume(ctx, ws.ID, "data"); !errdefs.IsNotFound(err) {
		t.Fatalf("after delete: %v", err)
	}
	if _, err := st.GetVolume(ctx, other.ID, "data"); err != nil {
		t.Fatalf("the other workspace's volume went too: %v", err)
	}
}
