// Package helmchart holds the tests of the levers9 Helm chart in
// packaging/helm/levers9: rendering it with the helm Go library (required
// values, secrets kept out of ConfigMaps, env values and arguments, RBAC
// shapes, security defaults) and installing it into a real Kubernetes API
// server. It ships no code; the chart is the product. The chart's values are
// documented in its values.yaml and in the README's "Deploy on Kubernetes".
package helmchart
