// Package inventory owns the agent's description of the machine it runs on:
// hostname, OS and architecture, kernel release, CPUs, memory, the disk that
// holds the agent's state directory, the runc and runsc versions, whether
// AppArmor is enabled, and the NVIDIA GPUs seen through NVML.
//
// It only reads: it must never change host state, start anything that keeps
// running, or talk to the network. It knows nothing of protobuf or the
// controlplane; the agent maps [Inventory] onto its wire types. An absent
// optional part (no runc binary, no AppArmor, no NVIDIA driver) is a normal
// machine, reported as an empty value and never logged above debug level.
//
// GPUs are read through the [GPULister] interface; [NVML] is the real
// implementation. go-nvml needs cgo: a binary built with CGO_ENABLED=0 still
// compiles and its [NVML] reports no GPUs.
//
// Stability: the exported structs may gain fields; existing fields keep
// their meaning. Unexported parsers may change freely.
package inventory
