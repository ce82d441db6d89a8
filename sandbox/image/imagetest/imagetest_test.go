package imagetest_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/levers9/levers9/sandbox/image/imagetest"
)

func TestRegistryStartStop(t *testing.T) {
	t.Parallel()
	reg := imagetest.StartRegistry(t, imagetest.RegistryOptions{Users: map[string]string{"l9i": "pw"}})
	resp, err := http.Get("http://" + reg.Host + "/v2/")
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("GET /v2/ without credentials = %d, want 401", resp.StatusCode)
	}
	req, _ := http.NewRequest(http.MethodGet, "http://"+reg.Host+"/v2/", nil)
	req.SetBasicAuth("l9i", "pw")
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("GET /v2/ with credentials = %d, want 200", resp.StatusCode)
	}
	reg.Stop()
	reg.Stop()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := reg.WaitGone(ctx); err != nil {
		t.Errorf("registry still answers after Stop: %v", err)
	}
}
