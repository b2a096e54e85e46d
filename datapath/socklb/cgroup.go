package socklb

import (
	"bufio"
	"fmt"
	"os"
	"strings"

	"golang.org/x/sys/unix"
)

// OwnCgroupMount is where ONC mounts a cgroup v2 hierarchy when the host
// has none mounted (a cgroup v1 host), as Cilium does: its root is the
// root every socket belongs to.
const OwnCgroupMount = "/run/onc/cgroupv2"

// ResolveCgroup returns the cgroup v2 directory to attach to: path if it
// is one, else the root of a mounted cgroup v2 hierarchy, mounting one at
// OwnCgroupMount where none is.
func ResolveCgroup(path string) (string, error) {
	if path != "" {
		if !onCgroup2(path) {
			return "", fmt.Errorf("socket-LB cgroup %s: not a cgroup v2 directory", path)
		}
		return path, nil
	}
	if root, err := cgroup2Root(); err != nil || root != "" {
		return root, err
	}
	if err := os.MkdirAll(OwnCgroupMount, 0o755); err != nil {
		return "", err
	}
	if !onCgroup2(OwnCgroupMount) {
		if err := unix.Mount("none", OwnCgroupMount, "cgroup2", 0, ""); err != nil {
			return "", fmt.Errorf("mount cgroup2 on %s: %w", OwnCgroupMount, err)
		}
	}
	return OwnCgroupMount, nil
}

// cgroup2Root is the mount point of the cgroup v2 hierarchy's root in
// this mount namespace, "" if none is mounted.
func cgroup2Root() (string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return "", err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// id parent major:minor root mountpoint options... - fstype source super
		fields := strings.Fields(sc.Text())
		sep := -1
		for i, f := range fields {
			if f == "-" {
				sep = i
				break
			}
		}
		if sep < 0 || sep+1 >= len(fields) || len(fields) < 5 {
			continue
		}
		if fields[sep+1] == "cgroup2" && fields[3] == "/" {
			return fields[4], nil
		}
	}
	return "", sc.Err()
}

func onCgroup2(dir string) bool {
	var st unix.Statfs_t
	return unix.Statfs(dir, &st) == nil && st.Type == unix.CGROUP2_SUPER_MAGIC
}
