package sandbox

import (
	"fmt"
	"slices"

	mobyseccomp "github.com/moby/profiles/seccomp"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// gpuSyscalls are what CUDA and NCCL need beyond Docker's profile: the NUMA
// calls and pidfd_getfd (CUDA IPC). Docker grants them only with
// CAP_SYS_NICE / CAP_SYS_PTRACE, which a GPU task must not gain.
var gpuSyscalls = []string{
	"get_mempolicy", "set_mempolicy", "mbind", "set_mempolicy_home_node",
	"move_pages", "migrate_pages", "pidfd_getfd",
}

// goToSeccompArch maps GOARCH to the libseccomp names moby's filters use,
// and to the spec's native architecture.
var goToSeccompArch = map[string]struct {
	native string
	arch   specs.Arch
}{
	"amd64": {"amd64", specs.ArchX86_64},
	"arm64": {"arm64", specs.ArchAARCH64},
	"386":   {"x86", specs.ArchX86},
}

// resolveSeccomp turns Docker's default profile into the spec's seccomp for
// the given bounding capabilities, architecture and kernel, the way moby's
// setupSeccomp does, but with the architecture and kernel injected so golden
// specs do not depend on the build host. TestSeccompMatchesMoby checks the
// two agree on this host.
func resolveSeccomp(bounding []string, goarch string, kernel mobyseccomp.KernelVersion) (*specs.LinuxSeccomp, error) {
	prof := mobyseccomp.DefaultProfile()
	a, ok := goToSeccompArch[goarch]
	if !ok {
		return nil, fmt.Errorf("seccomp: architecture %q is not supported", goarch)
	}
	out := prof.LinuxSeccomp
	out.Syscalls = nil
	for _, m := range prof.ArchMap {
		if m.Arch == a.arch {
			out.Architectures = append(append(out.Architectures, m.Arch), m.SubArches...)
			break
		}
	}
	atLeast := func(v *mobyseccomp.KernelVersion) bool {
		return kernel.Kernel > v.Kernel || (kernel.Kernel == v.Kernel && kernel.Major >= v.Major)
	}
next:
	for _, call := range prof.Syscalls {
		// moby also accepts the deprecated single Name; its built-in
		// default profile uses only Names.
		if ex := call.Excludes; ex != nil {
			if slices.Contains(ex.Arches, a.native) {
				continue next
			}
			for _, c := range ex.Caps {
				if slices.Contains(bounding, c) {
					continue next
				}
			}
			if ex.MinKernel != nil && atLeast(ex.MinKernel) {
				continue next
			}
		}
		if in := call.Includes; in != nil {
			if len(in.Arches) > 0 && !slices.Contains(in.Arches, a.native) {
				continue next
			}
			for _, c := range in.Caps {
				if !slices.Contains(bounding, c) {
					continue next
				}
			}
			if in.MinKernel != nil && !atLeast(in.MinKernel) {
				continue next
			}
		}
		out.Syscalls = append(out.Syscalls, call.LinuxSyscall)
	}
	return &out, nil
}

// seccompFor builds the profile a mode asks for, or nil for off.
func seccompFor(mode SeccompMode, bounding []string, gpu bool, h Host) (*specs.LinuxSeccomp, error) {
	if mode == SeccompOff {
		return nil, nil
	}
	sc, err := resolveSeccomp(bounding, h.Arch, h.Kernel)
	if err != nil {
		return nil, err
	}
	if h.Arch == "amd64" && !h.X32 {
		// Each architecture in the list is one more filter runc compiles
		// at every start, in the container's init (x32 costs about 12 ms of
		// a 64 ms `runc run` here). On a kernel without the x32 ABI its
		// syscalls fail anyway; without the architecture the filter kills
		// the thread instead of letting the kernel answer ENOSYS.
		sc.Architectures = slices.DeleteFunc(sc.Architectures, func(a specs.Arch) bool { return a == specs.ArchX32 })
	}
	if gpu {
		sc.Syscalls = append(sc.Syscalls, specs.LinuxSyscall{
			Names:  slices.Clone(gpuSyscalls),
			Action: specs.ActAllow,
		})
	}
	if mode == SeccompLog {
		// Only the default changes: explicit errno rules (clone3 -> ENOSYS
		// and friends) stay, because programs rely on those answers.
		sc.DefaultAction = specs.ActLog
		sc.DefaultErrnoRet = nil
	}
	return sc, nil
}
