package datapath

import (
	"strings"
	"testing"
)

// The fast path's mark must be one bit that none of ONC's fixed marks
// uses: the peer-host chain would clear it before the learning programs
// read it, and the uplink's rules would take it for theirs.
func TestNewRefusesAFastPathMarkONCUses(t *testing.T) {
	for _, mark := range []uint32{0, 0x40001, 0x80000, 0x100000, 0x200000} {
		_, err := New(Config{VNI: 1, Port: 4789, FastPathMark: mark})
		if err == nil || !strings.Contains(err.Error(), "fast-path mark") {
			t.Errorf("mark %#x: error %v, want the fast-path mark refused", mark, err)
		}
	}
}
