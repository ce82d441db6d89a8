package taskrun

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

func TestRecords(t *testing.T) {
	r := records{dir: filepath.Join(t.TempDir(), "attempts")}
	if recs, names, err := r.list(); err != nil || len(recs)+len(names) != 0 {
		t.Fatalf("list of a missing dir: %v %v %v", recs, names, err)
	}
	rec := record{TaskID: "t1", Attempt: 2, Pool: "p", ContainerID: "l9r-t1.2", ImageDigest: "sha256:ab", Started: fixedNow().UTC()}
	if err := r.save("t1.2", rec); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(r.dir, "torn.json"), []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}
	recs, names, err := r.list()
	if err == nil || !contains(err.Error(), "torn.json") {
		t.Errorf("torn record: %v, want an error naming it", err)
	}
	if len(recs) != 1 || recs[0] != rec || !slices.Equal(names, []string{"t1.2", "torn"}) {
		t.Errorf("list = %+v %v", recs, names)
	}
	if st, err := os.Stat(r.path("t1.2")); err != nil || st.Mode().Perm() != 0o600 {
		t.Errorf("record mode: %v %v", st.Mode(), err)
	}
	for _, n := range append(names, "t1.2") { // removing twice is fine
		if err := r.remove(n); err != nil {
			t.Fatal(err)
		}
	}
	if recs, _, err := r.list(); err != nil || len(recs) != 0 {
		t.Errorf("after remove: %v %v", recs, err)
	}
	if err := (records{}).save("x.1", record{Started: time.Now()}); err != nil {
		t.Errorf("a zero records keeps nothing: %v", err)
	}
}
