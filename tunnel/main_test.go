package tunnel_test

import (
	"os"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	reconcileNetns()
	goleak.VerifyTestMain(m,
		// quic-go keeps one process-wide goroutine for its packet buffers' GC hints.
		goleak.IgnoreAnyFunction("github.com/quic-go/quic-go.(*packetHandlerMap).runCloseQueue"),
	)
	_ = os.Stdout.Sync()
}
