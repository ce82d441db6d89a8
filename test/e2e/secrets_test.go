package e2e

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	"github.com/levers9/levers9/controlplane/controlplanetest"
)

// TestTaskSecrets: `levers9 run --secret NAME` puts a workspace secret's
// keys into that task's environment, and the value is nowhere else: not in
// the controlplane's or the agents' logs, not in the task's events, not in
// any Postgres row outside the sealed secrets table, not in Redis, and not
// in any file under the agents' state directories, during the run or after.
func TestTaskSecrets(t *testing.T) {
	w := setupTaskWorld(t)
	raw := make([]byte, 12)
	_, _ = rand.Read(raw)
	value := "pw-" + hex.EncodeToString(raw)
	sum := sha256.Sum256([]byte(value))
	hash := hex.EncodeToString(sum[:])

	file := filepath.Join(t.TempDir(), "db.env")
	if err := os.WriteFile(file, []byte("DB_PASSWORD="+value+"\nDB_USER=app\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if out, errOut, err := w.cli(t, "secret", "put", "db", "--from-file", file); err != nil {
		t.Fatalf("secret put: %v %s %s", err, out, errOut)
	}
	_ = os.Remove(file)

	// checkNowhere fails when the value is in any place it must not be.
	checkNowhere := func(t *testing.T, when string) {
		t.Helper()
		if strings.Contains(w.in.Logs.String(), value) {
			t.Errorf("%s: the controlplane's log holds the secret value", when)
		}
		for i, out := range w.agentLogs {
			if strings.Contains(out.String(), value) {
				t.Errorf("%s: agent run %d's log holds the secret value", when, i)
			}
		}
		for _, m := range w.runs {
			if where := grepTree(t, m.root, value); len(where) > 0 {
				t.Errorf("%s: files of an agent hold the secret value: %v", when, where)
			}
		}
		if where := grepPostgres(t, w, value); len(where) > 0 {
			t.Errorf("%s: Postgres holds the secret value in %v", when, where)
		}
		if where := grepRedis(t, w, value); len(where) > 0 {
			t.Errorf("%s: Redis holds the secret value in %v", when, where)
		}
	}

	t.Run("value reaches the container and nothing else", func(t *testing.T) {
		r := w.start(t, "run", "--secret", "db", "--", "sh", "-c",
			`echo "user=$DB_USER sha=$(printf %s "$DB_PASSWORD" | sha256sum | cut -d' ' -f1)"; echo started; sleep 4`)
		// While the container runs: its bundle and runtime state exist now.
		controlplanetest.Eventually(t, 90*time.Second, "the task's container started", func() bool {
			so, _ := r.out()
			select {
			case <-r.done:
				return true
			default:
			}
			return strings.Contains(so, "started")
		})
		if so, se := r.out(); !strings.Contains(so, "started") {
			t.Fatalf("the task did not start\nstdout:\n%s\nstderr:\n%s", so, se)
		}
		checkNowhere(t, "while running")
		found := false
		for _, m := range w.runs {
			found = found || len(grepTree(t, m.root, "sha256sum")) > 0
		}
		if !found {
			t.Fatal("no agent file holds the task's command: the file search is blind")
		}
		code := r.wait(t, 60*time.Second)
		so, se := r.out()
		if code != 0 || !strings.Contains(so, "user=app sha="+hash) {
			t.Fatalf("exit %d, want the value's hash %s\nstdout:\n%s\nstderr:\n%s", code, hash, so, se)
		}
		ts := w.tasks(t)
		id := ts[0].ID
		show, _, err := w.cli(t, "task", "show", id)
		if err != nil || !regexp.MustCompile(`(?m)^Secrets:\s+db$`).MatchString(show) {
			t.Fatalf("task show: %v\n%s", err, show)
		}
		var js struct {
			Task struct {
				Spec struct {
					Secrets []string `json:"secrets"`
					Env     map[string]string
				} `json:"spec"`
			} `json:"task"`
		}
		w.cliJSON(t, &js, "task", "show", id)
		if len(js.Task.Spec.Secrets) != 1 || js.Task.Spec.Secrets[0] != "db" || len(js.Task.Spec.Env) != 0 {
			t.Fatalf("task show -o json spec: %+v", js.Task.Spec)
		}
		logs, _, err := w.cli(t, "task", "logs", id)
		if err != nil || strings.Contains(logs, value) || !strings.Contains(logs, hash) {
			t.Fatalf("task logs: %v\n%s", err, logs)
		}
		checkNowhere(t, "after the end")
		// The same searches find what is there: they are not blind.
		if got := grepPostgres(t, w, "DB_PASSWORD"); !slices.Contains(got, "secrets") {
			t.Errorf("the Postgres search does not find the secret's key name in secrets (found it in %v)", got)
		}
		if got := grepRedis(t, w, hash); len(got) == 0 {
			t.Error("the Redis search does not find the task's output")
		}
		if !strings.Contains(w.in.Logs.String(), "migrations applied") {
			t.Error("the controlplane's log is not captured")
		}
		for i, out := range w.agentLogs {
			if out.String() == "" {
				t.Errorf("agent run %d's log is not captured", i)
			}
		}
	})

	t.Run("unknown secret is refused at submit", func(t *testing.T) {
		before := len(w.tasks(t))
		out, errOut, err := w.cli(t, "run", "--secret", "db", "--secret", "nope", "--", "true")
		if err == nil || !strings.Contains(errOut, `"nope"`) || strings.Contains(errOut, `"db"`) {
			t.Fatalf("want a refusal naming nope: %v\nstdout:\n%s\nstderr:\n%s", err, out, errOut)
		}
		t.Logf("levers9 run said: %s", strings.TrimSpace(errOut))
		if n := len(w.tasks(t)); n != before {
			t.Fatalf("a task was stored: %d tasks, %d before", n, before)
		}
	})

	t.Run("secret deleted before the push fails the attempt", func(t *testing.T) {
		// Fill both machines so the task waits in the queue.
		var blockers []string
		for range 2 {
			out, errOut, err := w.cli(t, "run", "--detach", "--cpu", "2", "--", "sleep", "600")
			if err != nil {
				t.Fatalf("blocker: %v %s", err, errOut)
			}
			blockers = append(blockers, strings.TrimSpace(out))
		}
		controlplanetest.Eventually(t, 90*time.Second, "blockers running", func() bool {
			n := 0
			for _, tk := range w.tasks(t) {
				if tk.State == "TASK_STATE_RUNNING" {
					n++
				}
			}
			return n == 2
		})
		if _, errOut, err := w.cli(t, "secret", "put", "gone", "--from-file", writeTemp(t, "K=temporary-"+hex.EncodeToString(raw[:4])+"\n")); err != nil {
			t.Fatalf("secret put: %v %s", err, errOut)
		}
		out, errOut, err := w.cli(t, "run", "--detach", "--secret", "gone", "--", "true")
		if err != nil {
			t.Fatalf("run: %v %s", err, errOut)
		}
		id := strings.TrimSpace(out)
		if _, errOut, err := w.cli(t, "secret", "delete", "gone"); err != nil {
			t.Fatalf("secret delete: %v %s", err, errOut)
		}
		for _, b := range blockers {
			if _, errOut, err := w.cli(t, "task", "cancel", b); err != nil {
				t.Fatalf("cancel %s: %v %s", b, err, errOut)
			}
		}
		var shown shownTask
		controlplanetest.Eventually(t, 60*time.Second, "the task ended", func() bool {
			for _, tk := range w.tasks(t) {
				if tk.ID == id {
					shown = tk
					return tk.State != "TASK_STATE_PENDING" && tk.State != "TASK_STATE_SCHEDULED" && tk.State != "TASK_STATE_RUNNING"
				}
			}
			return false
		})
		atts := w.showAttempts(t, id)
		rawAtts, _ := json.Marshal(atts)
		if shown.State != "TASK_STATE_FAILED" || len(atts) != 1 || atts[0].State != "ATTEMPT_STATE_FAILED" || atts[0].ExitCode != nil ||
			!strings.Contains(atts[0].Summary, `secret "gone"`) || strings.Count(atts[0].Summary, ". ") > 0 {
			t.Fatalf("task %+v\nattempts: %s", shown, rawAtts)
		}
		t.Logf("attempt summary: %s", atts[0].Summary)
	})
}

func writeTemp(t *testing.T, content string) string {
	t.Helper()
	f := filepath.Join(t.TempDir(), "secret.env")
	if err := os.WriteFile(f, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return f
}

// grepTree lists the regular files under root that contain s.
func grepTree(t *testing.T, root, s string) []string {
	t.Helper()
	var hits []string
	_ = filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return nil
		}
		b, err := os.ReadFile(p)
		if err == nil && bytes.Contains(b, []byte(s)) {
			hits = append(hits, p)
		}
		return nil
	})
	return hits
}

// grepPostgres lists the tables (other than secrets, whose values are
// sealed, and checked for the plain value too) with a row holding s.
func grepPostgres(t *testing.T, w *taskWorld, s string) []string {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, w.in.Config.Database.Postgres.ConnString())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, `SELECT table_name FROM information_schema.tables WHERE table_schema = 'public'`)
	if err != nil {
		t.Fatal(err)
	}
	tables, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	var hits []string
	for _, tb := range tables {
		var n int
		// Every column as text (bytea as its hex, so check that too).
		q := `SELECT count(*) FROM ` + pgx.Identifier{tb}.Sanitize() + ` t WHERE t::text LIKE '%' || $1 || '%' OR t::text LIKE '%' || $2 || '%'`
		if err := conn.QueryRow(ctx, q, s, hex.EncodeToString([]byte(s))).Scan(&n); err != nil {
			t.Fatalf("%s: %v", tb, err)
		}
		if n > 0 {
			hits = append(hits, tb)
		}
	}
	return hits
}

// grepRedis lists the Redis keys whose value holds s.
func grepRedis(t *testing.T, w *taskWorld, s string) []string {
	t.Helper()
	ctx := context.Background()
	rc := w.in.Config.Database.Redis
	c := redis.NewClient(&redis.Options{Addr: rc.Addr, Password: rc.Password, DB: rc.DB})
	defer c.Close()
	var hits []string
	iter := c.Scan(ctx, 0, "*", 1000).Iterator()
	for iter.Next(ctx) {
		k := iter.Val()
		var dump string
		switch c.Type(ctx, k).Val() {
		case "string":
			dump = c.Get(ctx, k).Val()
		case "hash":
			dump = strings.Join(mapVals(c.HGetAll(ctx, k).Val()), "\n")
		case "list":
			dump = strings.Join(c.LRange(ctx, k, 0, -1).Val(), "\n")
		case "set":
			dump = strings.Join(c.SMembers(ctx, k).Val(), "\n")
		case "zset":
			dump = strings.Join(c.ZRange(ctx, k, 0, -1).Val(), "\n")
		case "stream":
			b, _ := json.Marshal(c.XRange(ctx, k, "-", "+").Val())
			dump = string(b)
		}
		if strings.Contains(dump, s) {
			hits = append(hits, k)
		}
	}
	if err := iter.Err(); err != nil {
		t.Fatal(err)
	}
	return hits
}

func mapVals(m map[string]string) []string {
	out := make([]string, 0, 2*len(m))
	for k, v := range m {
		out = append(out, k, v)
	}
	return out
}
