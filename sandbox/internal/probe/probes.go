package main

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

var probes = map[string]probe{
	// Masked and read-only paths.
	"read_proc_kcore":      {run: func() error { return readSome("/proc/kcore") }},
	"read_proc_keys":       {run: func() error { return readSome("/proc/keys") }},
	"read_proc_timer_list": {run: func() error { return readSome("/proc/timer_list") }},
	"read_proc_interrupts": {run: func() error { return readSome("/proc/interrupts") }},
	"list_sys_firmware":    {run: func() error { return listSome("/sys/firmware") }},
	"write_proc_sys":       {run: func() error { return rewrite("/proc/sys/kernel/printk_ratelimit") }},
	"write_sysfs":          {run: func() error { return rewrite("/sys/kernel/mm/transparent_hugepage/khugepaged/pages_to_scan") }},
	"write_core_pattern":   {run: func() error { return rewrite("/proc/sys/kernel/core_pattern") }},
	"write_cgroup_release_agent": {run: func() error {
		for _, p := range []string{"/sys/fs/cgroup/memory/release_agent", "/sys/fs/cgroup/release_agent", "/sys/fs/cgroup/cpu/release_agent"} {
			f, err := os.OpenFile(p, os.O_WRONLY, 0)
			if err == nil {
				f.Close()
				return nil
			}
			if !errors.Is(err, os.ErrNotExist) {
				return err
			}
		}
		return os.ErrNotExist
	}},
	// Mounts and namespaces.
	"mount_tmpfs": {run: func() error { return unix.Mount("tmpfs", "/tmp", "tmpfs", 0, "") }},
	"unshare_user": {logged: true, run: func() error {
		// unshare(CLONE_NEWUSER) refuses multithreaded callers, so clone
		// a fresh child into the new namespace instead.
		cmd := exec.Command("/probe", "whoami")
		cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: unix.CLONE_NEWUSER}
		return cmd.Run()
	}},
	"unshare_net": {run: func() error { return unix.Unshare(unix.CLONE_NEWNET) }},
	"chroot_escape": {run: func() error {
		if err := os.MkdirAll("/tmp/l9s-jail", 0o755); err != nil {
			return err
		}
		if err := unix.Chroot("/tmp/l9s-jail"); err != nil {
			return err
		}
		for i := 0; i < 64; i++ {
			_ = unix.Chdir("..")
		}
		if err := unix.Chroot("."); err != nil {
			return err
		}
		// The host has /etc/os-release; the test rootfs has no /etc.
		if _, err := os.Stat("/etc/os-release"); err != nil {
			return fmt.Errorf("root is still the container's: %w", err)
		}
		return nil
	}},
	// Sockets.
	"raw_socket": {run: func() error {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_RAW, unix.IPPROTO_ICMP)
		if err == nil {
			unix.Close(fd)
		}
		return err
	}},
	"packet_socket": {run: func() error {
		fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW, 0x0300)
		if err == nil {
			unix.Close(fd)
		}
		return err
	}},
	// Kernel objects and privileged calls.
	"keyctl": {logged: true, run: func() error {
		_, err := unix.AddKey("user", "l9s-probe", []byte("x"), unix.KEY_SPEC_PROCESS_KEYRING)
		return err
	}},
	"bpf_map_create": {run: func() error {
		attr := [5]uint32{2 /* BPF_MAP_TYPE_ARRAY */, 4, 4, 1, 0}
		fd, _, e := unix.Syscall(unix.SYS_BPF, 0 /* BPF_MAP_CREATE */, uintptr(unsafe.Pointer(&attr)), unsafe.Sizeof(attr))
		if e != 0 {
			return e
		}
		unix.Close(int(fd))
		return nil
	}},
	"init_module": {run: func() error {
		return unix.InitModule([]byte{0}, "")
	}},
	"finit_module": {run: func() error {
		f, err := os.Open("/probe")
		if err != nil {
			return err
		}
		defer f.Close()
		return unix.FinitModule(int(f.Fd()), "", 0)
	}},
	"kexec_load": {run: func() error {
		_, _, e := unix.Syscall6(unix.SYS_KEXEC_LOAD, 0, 0, 0, 0, 0, 0)
		return errnoOrNil(e)
	}},
	"reboot_cad_off": {run: func() error {
		err := unix.Reboot(unix.LINUX_REBOOT_CMD_CAD_OFF)
		if errors.Is(err, unix.EINVAL) {
			// The capability check passed; only the pid namespace said no.
			return nil
		}
		return err
	}},
	"swapon": {run: func() error {
		p, _ := unix.BytePtrFromString("/l9s-no-such-swap")
		_, _, e := unix.Syscall(unix.SYS_SWAPON, uintptr(unsafe.Pointer(p)), 0, 0)
		if e == unix.ENOENT {
			return nil
		}
		return errnoOrNil(e)
	}},
	"open_by_handle_at": {run: func() error {
		h := unix.NewFileHandle(1, []byte{2, 0, 0, 0, 0, 0, 0, 0})
		fd, err := unix.OpenByHandleAt(unix.AT_FDCWD, h, unix.O_RDONLY)
		if err == nil {
			unix.Close(fd)
		}
		if errors.Is(err, unix.ESTALE) || errors.Is(err, unix.EBADF) || errors.Is(err, unix.EINVAL) {
			return nil
		}
		return err
	}},
	"iopl": {run: func() error {
		_, _, e := unix.Syscall(unix.SYS_IOPL, 3, 0, 0)
		return errnoOrNil(e)
	}},
	"ioperm": {run: func() error { return unix.Ioperm(0x80, 1, 1) }},
	"clock_settime": {run: func() error {
		var ts unix.Timespec
		if err := unix.ClockGettime(unix.CLOCK_REALTIME, &ts); err != nil {
			return err
		}
		return unix.ClockSettime(unix.CLOCK_REALTIME, &ts)
	}},
	"syslog_read": {run: func() error {
		buf := make([]byte, 64)
		_, err := unix.Klogctl(3 /* SYSLOG_ACTION_READ_ALL */, buf)
		return err
	}},
	"perf_event_open": {logged: true, run: func() error {
		attr := unix.PerfEventAttr{Type: unix.PERF_TYPE_SOFTWARE, Config: unix.PERF_COUNT_SW_CPU_CLOCK, Bits: unix.PerfBitExcludeKernel | unix.PerfBitExcludeHv}
		attr.Size = uint32(unsafe.Sizeof(attr))
		fd, err := unix.PerfEventOpen(&attr, 0, -1, -1, 0)
		if err == nil {
			unix.Close(fd)
		}
		return err
	}},
	"userfaultfd": {logged: true, run: func() error {
		fd, _, e := unix.Syscall(unix.SYS_USERFAULTFD, unix.O_CLOEXEC|1 /* UFFD_USER_MODE_ONLY */, 0, 0)
		if e == 0 {
			unix.Close(int(fd))
		}
		return errnoOrNil(e)
	}},
	"set_mempolicy": {logged: true, run: func() error {
		_, _, e := unix.Syscall(unix.SYS_SET_MEMPOLICY, 0 /* MPOL_DEFAULT */, 0, 0)
		return errnoOrNil(e)
	}},
	"ptrace_init": {run: func() error {
		if err := unix.PtraceAttach(1); err != nil {
			return err
		}
		// The attach is what the probe asks about. Detaching can still
		// fail with ESRCH when the tracee has not reached its stop yet
		// (the Go runtime's signals interrupt wait4 with EINTR, and a
		// namespace's init may not stop at all); that does not make
		// ptrace blocked.
		var ws unix.WaitStatus
		for {
			if _, err := unix.Wait4(1, &ws, unix.WALL, nil); err != unix.EINTR {
				break
			}
		}
		if err := unix.PtraceDetach(1); err != nil && err != unix.ESRCH {
			return err
		}
		return nil
	}},
	// Devices.
	"mknod_open_mem": {run: func() error {
		if err := unix.Mknod("/tmp/l9s-mem", unix.S_IFCHR|0o600, int(unix.Mkdev(1, 1))); err != nil {
			return fmt.Errorf("mknod: %w", err)
		}
		f, err := os.Open("/tmp/l9s-mem")
		if err == nil {
			f.Close()
		}
		return err
	}},
	"open_dev_mem":  {run: func() error { return readSome("/dev/mem") }},
	"open_dev_kmsg": {run: func() error { return readSome("/dev/kmsg") }},
	"leaked_fds": {run: func() error {
		// A descriptor the runtime leaked into the container has no
		// close-on-exec (or it would not have reached this process), so
		// busybox inherits it too; the Go runtime's own descriptors do
		// not. ls's directory takes the lowest free number.
		out, err := exec.Command("/bin/busybox", "ls", "/proc/self/fd").Output()
		if err != nil {
			return fmt.Errorf("ls: %w", err)
		}
		fds := strings.Fields(string(out))
		if len(fds) > 4 {
			return nil
		}
		return fmt.Errorf("no descriptors beyond stdio: %v", fds)
	}},
	// Privilege escalation.
	"setuid_escalation": {run: func() error {
		if err := asUser(1000); err != nil {
			return err
		}
		out, err := exec.Command("/suidprobe", "whoami").Output()
		if err != nil {
			return err
		}
		if strings.TrimSpace(string(out)) != "0" {
			return fmt.Errorf("setuid binary ran with euid %s", strings.TrimSpace(string(out)))
		}
		return nil
	}},
	// Things that must keep working.
	"ping_dgram_nonroot": {run: func() error {
		if err := asUser(1000); err != nil {
			return err
		}
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM, unix.IPPROTO_ICMP)
		if err != nil {
			return fmt.Errorf("socket: %w", err)
		}
		defer unix.Close(fd)
		echo := []byte{8, 0, 0, 0, 0, 1, 0, 1, 'l', '9', 's'}
		if err := unix.Sendto(fd, echo, 0, &unix.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
			return fmt.Errorf("sendto: %w", err)
		}
		_ = unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Sec: 2})
		buf := make([]byte, 64)
		n, _, err := unix.Recvfrom(fd, buf, 0)
		if err != nil {
			return fmt.Errorf("recv: %w", err)
		}
		if n < 8 || buf[0] != 0 {
			return fmt.Errorf("not an echo reply: % x", buf[:n])
		}
		return nil
	}},
	"bind_port80_nonroot": {run: func() error {
		if err := asUser(1000); err != nil {
			return err
		}
		l, err := net.Listen("tcp4", "127.0.0.1:80")
		if err != nil {
			return err
		}
		return l.Close()
	}},
	"threads": {run: func() error {
		var wg sync.WaitGroup
		tids := make(chan int, 8)
		for i := 0; i < 8; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				runtime.LockOSThread()
				tids <- unix.Gettid()
				time.Sleep(10 * time.Millisecond)
			}()
		}
		wg.Wait()
		close(tids)
		seen := map[int]bool{}
		for t := range tids {
			seen[t] = true
		}
		if len(seen) < 8 {
			return fmt.Errorf("only %d distinct threads", len(seen))
		}
		return nil
	}},
	"memfd": {run: func() error {
		fd, err := unix.MemfdCreate("l9s", unix.MFD_CLOEXEC)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		_, err = unix.Write(fd, []byte("hello"))
		return err
	}},
}

func errnoOrNil(e unix.Errno) error {
	if e == 0 {
		return nil
	}
	return e
}
