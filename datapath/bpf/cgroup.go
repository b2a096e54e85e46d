package bpf

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"
)

// OwnCgroupMount is where ONC mounts a cgroup v2 hierarchy when the host
// has none mounted (a cgroup v1 host), as Cilium does: its root is the
// root every socket belongs to.
const OwnCgroupMount = "/run/onc/cgroupv2"

// ResolveCgroup returns the cgroup v2 directory to attach to: path if it
// is one, else the highest mounted cgroup v2 directory (cgroup2Root),
// mounting a hierarchy at OwnCgroupMount where none is.
func ResolveCgroup(path string) (string, error) {
	if path != "" {
		if !onCgroup2(path) {
			return "", fmt.Errorf("cgroup %s: not a cgroup v2 directory", path)
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

// cgroup2Root is the mount point of the highest cgroup v2 directory this
// mount namespace sees, "" if no cgroup v2 hierarchy is mounted.
func cgroup2Root() (string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return "", err
	}
	defer f.Close()
	return highestCgroup2(f)
}

// highestCgroup2 picks, from mountinfo, the cgroup v2 mount whose root is
// highest in the hierarchy. A container in its own cgroup namespace sees
// its own cgroup mounted with root "/", and the host's hierarchy (when the
// DaemonSet mounts it) with root "/../../..", above its namespace's root:
// attaching at the first would balance only the agent's own sockets.
// Mounts of a cgroup beside or below the namespace's root are not
// candidates.
func highestCgroup2(mountinfo io.Reader) (string, error) {
	best, bestHeight := "", -1
	sc := bufio.NewScanner(mountinfo)
	for sc.Scan() {
		// id parent major:minor root mountpoint options... - fstype source super
		fields := strings.Fields(sc.Text())
		sep := slices.Index(fields, "-")
		if sep < 5 || sep+1 >= len(fields) || fields[sep+1] != "cgroup2" {
			continue
		}
		if h, ok := cgroupHeight(fields[3]); ok && h > bestHeight {
			best, bestHeight = fields[4], h
		}
	}
	return best, sc.Err()
}

// cgroupHeight is how many levels above the cgroup namespace's root a
// mount's root is: 0 for "/", 2 for "/../..", not ok for any other path.
func cgroupHeight(root string) (int, bool) {
	if root == "/" {
		return 0, true
	}
	h := 0
	for rest := root; rest != ""; h++ {
		var ok bool
		if rest, ok = strings.CutPrefix(rest, "/.."); !ok {
			return 0, false
		}
	}
	return h, true
}

func onCgroup2(dir string) bool {
	var st unix.Statfs_t
	return unix.Statfs(dir, &st) == nil && st.Type == unix.CGROUP2_SUPER_MAGIC
}

// AttachCgroup puts prog on the cgroup v2 directory through a link pinned
// at pin, or swaps prog into the link an earlier agent pinned there
// (atomically: no socket call misses a program). Other programs on the
// cgroup, other agents' included, stay.
func AttachCgroup(pin, cgroup string, attach ebpf.AttachType, prog *ebpf.Program) error {
	cgid, err := cgroupID(cgroup)
	if err != nil {
		return err
	}
	adopted, err := AdoptPinnedLink(pin, func(info *link.Info) bool {
		return info.Cgroup() != nil && info.Cgroup().CgroupId == cgid
	}, prog)
	if err != nil || adopted {
		return err
	}
	l, err := link.AttachCgroup(link.CgroupOptions{Path: cgroup, Attach: attach, Program: prog})
	if err != nil {
		return fmt.Errorf("attach %s to cgroup %s: %w", prog, cgroup, err)
	}
	defer l.Close()
	if err := l.Pin(pin); err != nil {
		return fmt.Errorf("pin %s: %w", pin, err)
	}
	return nil
}

// cgroupID is the kernel's id of a cgroup v2 directory: its inode.
func cgroupID(path string) (uint64, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return 0, fmt.Errorf("cgroup %s: %w", path, err)
	}
	return st.Ino, nil
}
