package sysctl

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Settings land under the directory given, in order, and read back
// trimmed; a missing entry is an error naming the sysctl.
func TestWriteRead(t *testing.T) {
	dir := t.TempDir()
	conf := filepath.Join(dir, "net/ipv6/conf/eth0")
	if err := os.MkdirAll(conf, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := WriteIPv6Conf(dir, "eth0", "accept_dad=0", "disable_ipv6=0"); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(conf, "accept_ra"), []byte("1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]string{"accept_dad": "0", "disable_ipv6": "0", "accept_ra": "1"} {
		if got, err := Read(dir, "net/ipv6/conf/eth0/"+name); err != nil || got != want {
			t.Errorf("%s = %q (%v), want %q", name, got, err, want)
		}
	}
	if err := Write(dir, "net/ipv4/ip_forward", "1"); err == nil || !strings.Contains(err.Error(), "sysctl net.ipv4.ip_forward=1") {
		t.Errorf("writing a missing sysctl: %v", err)
	}
}
