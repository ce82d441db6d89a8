package bus_test

import (
	"os"
	"testing"

	"github.com/levers9/levers9/controlplane/controlplanetest"
)

// env is the Redis (and Postgres) of this test binary.
var env *controlplanetest.Env

// TestMain starts the services and checks for leaked goroutines after the
// tests (controlplanetest.Main runs goleak).
func TestMain(m *testing.M) { os.Exit(controlplanetest.Main(m, &env)) }
