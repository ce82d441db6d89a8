//go:build !amd64

package sandbox

// kernelRunsX32: the x32 ABI exists only on amd64.
func kernelRunsX32() bool { return false }
