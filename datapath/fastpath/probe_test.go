//go:build privileged

package fastpath

import (
	"testing"

	"github.com/onc-net/onc/internal/testutil"
)

// This kernel (6.18) has the flag; the probe must say so, since the
// fallback works but is slower.
func TestDecapProbe(t *testing.T) {
	testutil.Privileged(t)
	ok, err := DecapSetsIPv6()
	if err != nil || !ok {
		t.Fatalf("DecapSetsIPv6() = %v, %v on a kernel that has the flag", ok, err)
	}
}
