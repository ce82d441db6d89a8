// Package api owns the dashboard's HTTP side: the REST and WebSocket API the
// browser app calls (tasks, machines, pools, tokens, secret names, the
// security report), sign-in (Google OpenID Connect with PKCE, and a
// development sign-in that is off unless asked for), signed expiring
// session cookies, CSRF checks on every state-changing request, and the
// mapping of a signed-in email to a role (admin or member) that limits what
// each route does. It reaches the controlplane only through the public gRPC
// API in api/, with one workspace's admin token from its environment, dialed
// by internal/clientconfig as the CLI does.
//
// It must never log, echo or put in an error a secret: the controlplane
// token, the session secret, the OIDC client secret, session or CSRF
// values, or a token's secret beyond the one create response. It keeps no
// state of its own beyond signed cookies, so replicas need only share the
// session secret. The HTTP contract is dashboard/api/API.md; the Go API of
// this package is internal to cmd/levers9-dashboard-api.
package api
