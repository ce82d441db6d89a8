package sandbox

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// ResolveUser returns the uid and gid BuildSpec gives a task whose rootfs
// is rootfs and whose user is user (the task's, else the image's; "" is
// root), so the agent can make files that process owns.
func ResolveUser(rootfs, user string) (uid, gid uint32, err error) {
	return resolveUser(rootfs, user)
}

// resolveUser turns an image or task user ("uid", "uid:gid", "name",
// "name:group", mixed) into ids, reading the image's /etc/passwd and
// /etc/group for names. The files are opened with RESOLVE_IN_ROOT, so an
// image whose /etc/passwd is a symlink to the host's reads its own (or
// nothing), never the host's.
func resolveUser(rootfs, user string) (uid, gid uint32, err error) {
	if user == "" {
		return 0, 0, nil
	}
	us, gs, hasGroup := strings.Cut(user, ":")
	if us == "" || (hasGroup && gs == "") {
		return 0, 0, fmt.Errorf("%q: empty user or group", user)
	}
	if n, err := strconv.ParseUint(us, 10, 32); err == nil {
		uid, gid = uint32(n), uint32(n)
	} else {
		u, g, err := lookupIDs(rootfs, "/etc/passwd", us, true)
		if err != nil {
			return 0, 0, fmt.Errorf("%q: %w", user, err)
		}
		uid, gid = u, g
	}
	if !hasGroup {
		return uid, gid, nil
	}
	if n, err := strconv.ParseUint(gs, 10, 32); err == nil {
		return uid, uint32(n), nil
	}
	g, _, err := lookupIDs(rootfs, "/etc/group", gs, false)
	if err != nil {
		return 0, 0, fmt.Errorf("%q: %w", user, err)
	}
	return uid, g, nil
}

// lookupIDs finds name in a passwd-format (name:x:uid:gid:...) or
// group-format (name:x:gid:...) file inside rootfs.
func lookupIDs(rootfs, file, name string, passwd bool) (id, gid uint32, err error) {
	root, err := unix.Open(rootfs, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return 0, 0, fmt.Errorf("open rootfs: %w", err)
	}
	defer unix.Close(root)
	fd, err := unix.Openat2(root, file, &unix.OpenHow{Flags: unix.O_RDONLY | unix.O_CLOEXEC, Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS})
	if err != nil {
		return 0, 0, fmt.Errorf("image %s: %w", file, err)
	}
	f := os.NewFile(uintptr(fd), file)
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Split(sc.Text(), ":")
		if len(fields) < 3 || fields[0] != name {
			continue
		}
		n, err := strconv.ParseUint(fields[2], 10, 32)
		if err != nil {
			return 0, 0, fmt.Errorf("image %s: %s has id %q", file, name, fields[2])
		}
		id, gid = uint32(n), uint32(n)
		if passwd && len(fields) > 3 {
			g, err := strconv.ParseUint(fields[3], 10, 32)
			if err != nil {
				return 0, 0, fmt.Errorf("image %s: %s has gid %q", file, name, fields[3])
			}
			gid = uint32(g)
		}
		return id, gid, nil
	}
	if err := sc.Err(); err != nil {
		return 0, 0, fmt.Errorf("image %s: %w", file, err)
	}
	return 0, 0, fmt.Errorf("image %s: no entry for %q", file, name)
}
