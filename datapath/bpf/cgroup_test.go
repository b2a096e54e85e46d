package bpf

import (
	"strings"
	"testing"
)

func TestHighestCgroup2(t *testing.T) {
	const (
		proc   = "22 28 0:20 / /proc rw,nosuid - proc proc rw\n"
		own    = "1021 1003 0:26 / /sys/fs/cgroup ro,nosuid - cgroup2 cgroup rw\n"
		host   = "1040 1003 0:26 /../../.. /host/sys/fs/cgroup ro,relatime - cgroup2 cgroup2 rw\n"
		parent = "1041 1003 0:26 /.. /host/parent ro,relatime - cgroup2 cgroup2 rw\n"
		beside = "1042 1003 0:26 /../other /host/other ro,relatime - cgroup2 cgroup2 rw\n"
		below  = "1043 1003 0:26 /sub /host/sub ro,relatime - cgroup2 cgroup2 rw\n"
		v1     = "30 25 0:27 / /sys/fs/cgroup/memory rw shared:9 - cgroup cgroup rw,memory\n"
		tagged = "41 31 0:38 / /sys/fs/cgroup/unified rw,relatime shared:12 master:3 - cgroup2 cgroup2 rw\n"
	)
	for _, tc := range []struct {
		name, mountinfo, want string
	}{
		{"host namespace", proc + tagged + v1, "/sys/fs/cgroup/unified"},
		{"own namespace, the host's hierarchy mounted", proc + own + host, "/host/sys/fs/cgroup"},
		{"listed before the own root", host + own, "/host/sys/fs/cgroup"},
		{"the highest of two ancestors", own + parent + host, "/host/sys/fs/cgroup"},
		{"own namespace only", own + beside + below, "/sys/fs/cgroup"},
		{"beside and below only", beside + below, ""},
		{"cgroup v1 only", proc + v1, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := highestCgroup2(strings.NewReader(tc.mountinfo))
			if err != nil || got != tc.want {
				t.Fatalf("highestCgroup2 = %q, %v; want %q", got, err, tc.want)
			}
		})
	}
}
