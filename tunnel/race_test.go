//go:build race

package tunnel_test

// The race detector slows the fleet test's 500 agents past its bound on a
// small machine; under it the fleet is smaller (the attack is the same).
func init() { fleetAgents = 100 }
