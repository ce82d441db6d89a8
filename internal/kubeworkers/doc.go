// Package kubeworkers owns levers9's worker Jobs in one Kubernetes
// namespace: it builds a worker Job and its single-use join Secret from a
// pool's settings and a size, creates, lists and deletes them, and watches
// the worker pods so a pod deleted or evicted mid-task is reported at once.
//
// It takes a kubernetes.Interface and a namespace and knows nothing of the
// controlplane's store or scheduler: the controlplane drives it for pools
// with provider kubernetes, and a cluster agent may drive it from inside a
// cluster. It never reads a Secret back (the join token only goes in) and
// never touches objects without its labels.
//
// The Job is a privileged container running the worker image's shell,
// which copies the join token out of the Secret mounted at
// /etc/levers9/join, joins with it (LEVERS9_CONTROLPLANE) and runs the
// agent until it has been idle for the pool's idle timeout. The Secret is
// owned by its Job, so the garbage collector removes it with the Job even
// when Delete is never called. API: internal, may change with its callers.
package kubeworkers
