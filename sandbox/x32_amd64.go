package sandbox

import "golang.org/x/sys/unix"

// x32SyscallBit marks a syscall number of the x32 ABI.
const x32SyscallBit = 0x40000000

// kernelRunsX32 asks the kernel once, with getpid in the x32 numbering,
// whether it carries out x32 syscalls. It asks only when this process runs
// without a seccomp filter, since a filter that lacks the x32 architecture
// kills the asking thread; under one it answers true, which keeps Docker's
// profile as it is.
func kernelRunsX32() bool {
	if !seccompUnfiltered("/proc/self/status") {
		return true
	}
	_, _, errno := unix.RawSyscall(x32SyscallBit|unix.SYS_GETPID, 0, 0, 0)
	return errno == 0
}
