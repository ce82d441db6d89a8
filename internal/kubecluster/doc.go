// Package kubecluster runs a real Kubernetes control plane on loopback for
// tests and for `make kube-up`: etcd, kube-apiserver, kube-controller-manager
// and kube-scheduler at v1.36.3, and kwok standing in for kubelets on fake
// nodes (kwok-cpu-0, and kwok-gpu-0 with four nvidia.com/gpu). The binaries
// come from packaging/kube/build.sh, which builds them from the Go module
// proxy and caches them outside the repository.
//
// It owns the cluster's directory: its certificates (a CA, the apiserver's
// serving certificate, the service-account key, client certificates for the
// admin in system:masters, the controller manager and the scheduler), the
// kubeconfig files (0600: they hold private keys), etcd's data and one log
// per component. It never binds anything but 127.0.0.1 and never touches a
// cluster it did not start.
//
// The components run in one process group. Stop sends SIGKILL to the group
// (the apiserver takes ~20 s to drain on SIGTERM, and nothing here is worth
// keeping); unless Options.Detached, each component also gets SIGKILL from
// the kernel when the process that started it dies, so a killed test leaves
// nothing behind. The API is internal and may change with its callers.
package kubecluster
