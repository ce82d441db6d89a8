package egress

import (
	"fmt"
	"runtime"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

// netNS runs work inside one network namespace.
type netNS struct {
	path string // "" means the namespace the process runs in
}

// do runs fn on an OS thread switched into the namespace. Child processes
// started by fn (iptables) inherit it. The thread is discarded if it cannot
// be switched back, so no goroutine ever runs in a namespace by surprise.
func (n netNS) do(fn func() error) error {
	if n.path == "" {
		return fn()
	}
	return inNetns(n.path, fn)
}

func inNetns(path string, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("get current netns: %w", err)
			return
		}
		defer orig.Close()
		target, err := netns.GetFromPath(path)
		if err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("open netns %s: %w", path, err)
			return
		}
		defer target.Close()
		if err := netns.Set(target); err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("enter netns %s: %w", path, err)
			return
		}
		ferr := fn()
		if err := netns.Set(orig); err == nil {
			runtime.UnlockOSThread()
		} // else: the locked thread exits with this goroutine.
		errc <- ferr
	}()
	return <-errc
}

// handle returns a netlink handle bound to the namespace.
func (n netNS) handle() (*netlink.Handle, error) {
	if n.path == "" {
		return netlink.NewHandle()
	}
	ns, err := netns.GetFromPath(n.path)
	if err != nil {
		return nil, fmt.Errorf("open netns %s: %w", n.path, err)
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		return nil, fmt.Errorf("netlink handle in %s: %w", n.path, err)
	}
	return h, nil
}
