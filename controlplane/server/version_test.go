package server_test

import (
	"context"
	"encoding/json"
	"net/http"
	"testing"

	"google.golang.org/grpc"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"

	v1 "github.com/levers9/levers9/api/levers9/v1"
	"github.com/levers9/levers9/controlplane/controlplanetest"
	"github.com/levers9/levers9/internal/version"
)

// TestVersionIsReported: /healthz and the header of every unary gRPC
// answer, a refused one included, carry the controlplane's version, so a
// client or probe learns it without a token.
func TestVersionIsReported(t *testing.T) {
	t.Parallel()
	in := controlplanetest.Start(t, env.Config(t), true)
	want := version.String()

	resp, err := http.Get("http://" + in.Server.RESTAddr() + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	var body struct {
		Version string `json:"version"`
		Healthy bool   `json:"healthy"`
	}
	err = json.NewDecoder(resp.Body).Decode(&body)
	resp.Body.Close()
	if err != nil || body.Version != want || !body.Healthy {
		t.Errorf("/healthz = %+v, %v; want version %q and healthy", body, err, want)
	}

	calls := []struct {
		name string
		call func(ctx context.Context, opt grpc.CallOption) error
	}{
		{"health check", func(ctx context.Context, opt grpc.CallOption) error {
			_, err := healthpb.NewHealthClient(in.Conn).Check(ctx, &healthpb.HealthCheckRequest{}, opt)
			return err
		}},
		{"refused without a token", func(ctx context.Context, opt grpc.CallOption) error {
			_, err := v1.NewAuthServiceClient(in.Conn).Authorize(ctx, &v1.AuthorizeRequest{}, opt)
			if err == nil {
				t.Error("Authorize without a token succeeded")
			}
			return nil
		}},
	}
	for _, tc := range calls {
		var md metadata.MD
		if err := tc.call(context.Background(), grpc.Header(&md)); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if got := md.Get(version.Header); len(got) != 1 || got[0] != want {
			t.Errorf("%s: header %s = %v, want [%q]", tc.name, version.Header, got, want)
		}
	}
}
