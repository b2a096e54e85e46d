//go:build privileged

package netfilter

import (
	"testing"

	"github.com/onc-net/onc/internal/testutil"
)

// The uplink marks' old chain, which agents of 6365723..087c936 left
// jumped to from mangle FORWARD, goes with the next EnsureUplinkLB, which
// stays idempotent.
func TestEnsureUplinkLBRemovesTheOldMarkChain(t *testing.T) {
	testutil.InNewNetns(t, "nf", func() {
		ipt, err := newIPv4()
		testutil.Must(t, err)
		testutil.Must(t, fill(ipt, "mangle", "ONC-LB-MARK", "FORWARD", [][]string{{"-j", "MARK", "--or-mark", "0x40000"}}))
		for range 2 {
			testutil.Must(t, EnsureUplinkLB(UplinkLB{}))
		}
		if ok, err := ipt.ChainExists("mangle", "ONC-LB-MARK"); err != nil || ok {
			t.Fatalf("ONC-LB-MARK still there (%v)", err)
		}
		rules, err := ipt.List("mangle", "FORWARD")
		testutil.Must(t, err)
		for _, r := range rules {
			if r != "-P FORWARD ACCEPT" {
				t.Fatalf("mangle FORWARD still holds %q", r)
			}
		}
	})
}
