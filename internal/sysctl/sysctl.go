// Package sysctl reads and writes the node's sysctls under a proc/sys
// directory: a container's own /proc/sys is read-only, so the agent's
// DaemonSet mounts the host's net/ subtree elsewhere (--proc-sys). The
// net/ entries are those of the calling thread's network namespace.
package sysctl

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// Write sets name (a path such as net/ipv4/ip_forward) under dir, "" =
// /proc/sys.
func Write(dir, name, value string) error {
	if err := os.WriteFile(path(dir, name), []byte(value), 0o644); err != nil {
		return fmt.Errorf("sysctl %s=%s: %w", strings.ReplaceAll(name, "/", "."), value, err)
	}
	return nil
}

// Read is name's value under dir, trimmed.
func Read(dir, name string) (string, error) {
	b, err := os.ReadFile(path(dir, name))
	return strings.TrimSpace(string(b)), err
}

// WriteIPv6Conf writes IPv6 settings of interface ifname, each
// "name=value" (net/ipv6/conf/<ifname>/<name>), in order.
func WriteIPv6Conf(dir, ifname string, settings ...string) error {
	for _, s := range settings {
		name, value, _ := strings.Cut(s, "=")
		if err := Write(dir, filepath.Join("net/ipv6/conf", ifname, name), value); err != nil {
			return err
		}
	}
	return nil
}

func path(dir, name string) string {
	if dir == "" {
		dir = "/proc/sys"
	}
	return filepath.Join(dir, name)
}
