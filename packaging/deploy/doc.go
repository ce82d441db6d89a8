// Package deploy holds deploy.sh, which installs or upgrades the levers9
// Helm chart with object-store keys read from files under ~/.levers9 into a
// private temporary values file (never into argv, never left behind), and
// its tests, which run the script against a fake helm. It ships no Go code.
package deploy
