package image

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/levers9/levers9/internal/errdefs"
)

// maxAccountFile bounds /etc/passwd and /etc/group read from an image.
const maxAccountFile = 4 << 20

// User is a resolved image user.
type User struct {
	UID, GID uint32
	// AdditionalGIDs are the groups that list the user as a member.
	AdditionalGIDs []uint32
}

// ResolveUser turns an image config's User ("", "name", "uid", "name:group",
// "uid:gid", ...) into numeric IDs using the image's /etc/passwd and
// /etc/group, read with ReadFile so no link can reach the host's files. As
// Docker does: "" is root; a numeric uid needs no passwd entry (its group is
// then 0); a name must exist.
func ResolveUser(rootfs, spec string) (User, error) {
	userPart, groupPart, hasGroup := strings.Cut(spec, ":")
	if spec == "" {
		userPart = "0"
	}
	if userPart == "" || (hasGroup && groupPart == "") {
		return User{}, fmt.Errorf("image user %q: %w", spec, errdefs.ErrInvalidArgument)
	}
	passwd, err := readAccounts(rootfs, "/etc/passwd")
	if err != nil {
		return User{}, fmt.Errorf("image user %q: %w", spec, err)
	}
	var u User
	var name string
	found := false
	uidNum, numErr := parseID(userPart)
	for _, f := range passwd {
		if len(f) < 4 {
			continue
		}
		uid, err1 := parseID(f[2])
		gid, err2 := parseID(f[3])
		if err1 != nil || err2 != nil {
			continue
		}
		// A numeric spec matches by uid only, so "1000" never means a user
		// named "1000" with another uid.
		if (numErr != nil && f[0] == userPart) || (numErr == nil && uid == uidNum) {
			u, name, found = User{UID: uid, GID: gid}, f[0], true
			break
		}
	}
	if !found {
		if numErr != nil {
			return User{}, fmt.Errorf("image user %q: no such user in the image's /etc/passwd: %w", spec, errdefs.ErrInvalidArgument)
		}
		u = User{UID: uidNum}
	}
	groups, err := readAccounts(rootfs, "/etc/group")
	if err != nil {
		return User{}, fmt.Errorf("image user %q: %w", spec, err)
	}
	if hasGroup {
		gidNum, gErr := parseID(groupPart)
		found := gErr == nil
		for _, f := range groups {
			if len(f) >= 3 && f[0] == groupPart {
				if gid, err := parseID(f[2]); err == nil {
					gidNum, found = gid, true
					break
				}
			}
		}
		if !found {
			return User{}, fmt.Errorf("image user %q: no such group in the image's /etc/group: %w", spec, errdefs.ErrInvalidArgument)
		}
		u.GID = gidNum
	}
	if name != "" {
		for _, f := range groups {
			if len(f) < 4 {
				continue
			}
			gid, err := parseID(f[2])
			if err != nil || gid == u.GID {
				continue
			}
			for _, m := range strings.Split(f[3], ",") {
				if m == name {
					u.AdditionalGIDs = append(u.AdditionalGIDs, gid)
					break
				}
			}
		}
	}
	return u, nil
}

// readAccounts reads a colon-separated account file; a missing file is empty.
func readAccounts(rootfs, name string) ([][]string, error) {
	b, err := ReadFile(rootfs, name, maxAccountFile)
	if errors.Is(err, errdefs.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out [][]string
	for _, line := range strings.Split(string(b), "\n") {
		if line = strings.TrimSpace(line); line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		out = append(out, strings.Split(line, ":"))
	}
	return out, nil
}

func parseID(s string) (uint32, error) {
	n, err := strconv.ParseUint(s, 10, 32)
	if err != nil || n == math.MaxUint32 {
		return 0, fmt.Errorf("id %q: not a number below 2^32-1", s)
	}
	return uint32(n), nil
}
