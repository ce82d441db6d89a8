package agents_test

import (
	"os"
	"testing"

	"github.com/levers9/levers9/controlplane/controlplanetest"
)

// env is the Postgres and Redis of this test binary.
var env *controlplanetest.Env

// TestMain starts the services and, after the tests (whose registries and
// agents stop in t.Cleanup), checks that no goroutine outlived them
// (controlplanetest.Main runs goleak).
func TestMain(m *testing.M) { os.Exit(controlplanetest.Main(m, &env)) }
