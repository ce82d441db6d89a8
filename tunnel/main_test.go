package tunnel_test

import (
	"os"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	if dir := os.Getenv("L9T_CHILD_SERVER"); dir != "" {
		if err := runChildServer(dir); err != nil {
			_, _ = os.Stderr.WriteString(err.Error() + "\n")
			os.Exit(1)
		}
		return
	}
	reconcileNetns()
	goleak.VerifyTestMain(m,
		// quic-go keeps one process-wide goroutine for its packet buffers' GC hints.
		goleak.IgnoreAnyFunction("github.com/quic-go/quic-go.(*packetHandlerMap).runCloseQueue"),
	)
	_ = os.Stdout.Sync()
}
