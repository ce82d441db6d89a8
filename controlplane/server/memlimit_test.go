package server

import (
	"io/fs"
	"strings"
	"testing"
)

func TestMemoryLimit(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name       string
		env        map[string]string
		files      map[string]string
		want       int64
		wantSource string
		wantErr    string
	}{
		{name: "GOMEMLIMIT wins", env: map[string]string{"GOMEMLIMIT": "1GiB"}, wantSource: "GOMEMLIMIT"},
		{name: "v2 limit", files: map[string]string{"/proc/self/cgroup": "0::/kubepods/pod1/cp\n",
			"/sys/fs/cgroup/kubepods/pod1/cp/memory.max": "1073741824\n"},
			want: 966367641, wantSource: "/sys/fs/cgroup/kubepods/pod1/cp/memory.max"},
		{name: "v2 no limit", files: map[string]string{"/proc/self/cgroup": "0::/\n", "/sys/fs/cgroup/memory.max": "max\n"}},
		{name: "v1 limit", files: map[string]string{"/proc/self/cgroup": "4:memory:/docker/abc\n3:cpu,cpuacct:/docker/abc\n0::/\n",
			"/sys/fs/cgroup/memory/docker/abc/memory.limit_in_bytes": "2147483648\n"},
			want: 1932735283, wantSource: "/sys/fs/cgroup/memory/docker/abc/memory.limit_in_bytes"},
		{name: "v1 no limit", files: map[string]string{"/proc/self/cgroup": "4:memory:/\n",
			"/sys/fs/cgroup/memory/memory.limit_in_bytes": "9223372036854771712\n"}},
		{name: "garbage", files: map[string]string{"/proc/self/cgroup": "0::/x\n", "/sys/fs/cgroup/x/memory.max": "lots\n"},
			wantErr: `holds "lots", not a byte count`},
		{name: "missing limit file", files: map[string]string{"/proc/self/cgroup": "0::/x\n"}, wantErr: "read /sys/fs/cgroup/x/memory.max"},
		{name: "no cgroup file", wantErr: "read /proc/self/cgroup"},
		{name: "no memory controller", files: map[string]string{"/proc/self/cgroup": "3:cpu:/a\n"}},
	} {
		getenv := func(k string) (string, bool) { v, ok := tc.env[k]; return v, ok }
		readFile := func(p string) ([]byte, error) {
			if v, ok := tc.files[p]; ok {
				return []byte(v), nil
			}
			return nil, &fs.PathError{Op: "open", Path: p, Err: fs.ErrNotExist}
		}
		got, source, err := memoryLimit(getenv, readFile)
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) || got != 0 {
				t.Errorf("%s: %d, %v; want error with %q", tc.name, got, err, tc.wantErr)
			}
			continue
		}
		if err != nil || got != tc.want || source != tc.wantSource {
			t.Errorf("%s: %d from %q, %v; want %d from %q", tc.name, got, source, err, tc.want, tc.wantSource)
		}
	}
}
