package bus_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/levers9/levers9/controlplane/bus"
	"github.com/levers9/levers9/internal/devstack"
	"github.com/levers9/levers9/internal/errdefs"
)

func TestPublish(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := env.NewBus(t)
	if err := b.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	for _, e := range []bus.Event{{Workspace: "ws_1", Kind: "token.created", Object: "tok_1"}, {Workspace: "ws_1", Kind: "secret.deleted", Object: "db"}} {
		if err := b.Publish(ctx, e); err != nil {
			t.Fatal(err)
		}
	}
	msgs, err := b.Redis().XRange(ctx, bus.EventStream, "-", "+").Result()
	if err != nil || len(msgs) != 2 {
		t.Fatalf("stream = %v, %v", msgs, err)
	}
	if v := msgs[1].Values; v["workspace"] != "ws_1" || v["kind"] != "secret.deleted" || v["object"] != "db" || v["at"] == nil {
		t.Errorf("event = %v", v)
	}
}

func TestEgressReports(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := env.NewBus(t)
	if got, err := b.EgressReports(ctx, nil); err != nil || len(got) != 0 {
		t.Errorf("no machines: %v, %v", got, err)
	}
	if err := b.PutEgressReport(ctx, "m_1", []byte(`{"ok":true}`), time.Minute); err != nil {
		t.Fatal(err)
	}
	got, err := b.EgressReports(ctx, []string{"m_1", "m_2"})
	if err != nil || len(got) != 1 || string(got["m_1"]) != `{"ok":true}` {
		t.Errorf("EgressReports = %q, %v; want m_1's only", got, err)
	}
	if ttl := b.Redis().PTTL(ctx, bus.EgressReportKey("m_1")).Val(); ttl <= 0 || ttl > time.Minute {
		t.Errorf("report TTL %v, want within (0, 1m]", ttl)
	}
}

// TestRedisDown: every call says Redis is unavailable, and no error quotes
// the password.
func TestRedisDown(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	port, err := devstack.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	b := bus.New(bus.Options{Addr: "127.0.0.1:" + strconv.Itoa(port), Password: "pw-never-quoted"})
	defer b.Close()
	for name, err := range map[string]error{
		"ping":    b.Ping(ctx),
		"publish": b.Publish(ctx, bus.Event{Kind: "k"}),
		"report":  b.PutEgressReport(ctx, "m", []byte("r"), time.Minute),
		"reports": func() error { _, err := b.EgressReports(ctx, []string{"m"}); return err }(),
	} {
		if !errors.Is(err, errdefs.ErrUnavailable) {
			t.Errorf("%s with Redis down: %v, want unavailable", name, err)
		}
		if err != nil && strings.Contains(err.Error(), "pw-never-quoted") {
			t.Errorf("%s: the error quotes the password", name)
		}
	}
}
