package store_test

import (
	"os"
	"testing"

	"github.com/levers9/levers9/controlplane/controlplanetest"
)

// env is the Postgres (and Redis) of this test binary; each test takes a
// freshly migrated database of its own from it (env.NewStore).
var env *controlplanetest.Env

// TestMain starts the services (failing, never skipping, when they cannot
// start) and, after the tests, checks that no goroutine outlived them.
func TestMain(m *testing.M) { os.Exit(controlplanetest.MainNoSkip(m, &env)) }
