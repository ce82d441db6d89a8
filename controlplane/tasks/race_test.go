//go:build race

package tasks_test

// raceEnabled is true when the race detector slows everything down.
const raceEnabled = true
