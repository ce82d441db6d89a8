// Package enroll owns how a machine becomes a trusted agent: the
// single-use join token format, the agent's key pair and certificate
// signing request (the private key never leaves the machine), the
// controlplane's agent CA that signs short-lived client certificates bound
// to a machine ID, reading the machine ID back out of a certificate, and
// the machine's security floor (Floor) that the join script hands to the
// agent. It holds no state, never logs, and never puts a token or key into
// an error. The token and certificate formats are stable.
package enroll
