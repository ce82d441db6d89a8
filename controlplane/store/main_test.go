package store_test

import (
	"os"
	"testing"

	"github.com/levers9/levers9/controlplane/controlplanetest"
)

// env is the Postgres (and Redis) of this test binary; each test takes a
// freshly migrated database of its own from it (env.NewStore).
var env *controlplanetest.Env

// TestMain starts the services and, after the tests, checks that no
// goroutine outlived them (controlplanetest.Main runs goleak).
func TestMain(m *testing.M) { os.Exit(controlplanetest.Main(m, &env)) }
