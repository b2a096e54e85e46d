package bypass

import (
	"net/netip"
	"testing"
)

// Found by FuzzPairConns: a server socket whose two ends are equal was
// taken, by comparing addresses, for the client end.
func TestPairConnsByRole(t *testing.T) {
	end := netip.MustParseAddrPort("10.244.7.5:6")
	conns := pairConns([]socket{{local: end, remote: end, role: roleServer, cookie: 48}}, 0)
	if len(conns) != 1 || conns[0].ServerCookie != 48 || conns[0].ClientCookie != 0 {
		t.Fatalf("a server socket %s->%s paired as %+v, want it the server end", end, end, conns)
	}
}
