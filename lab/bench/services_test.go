package bench

import (
	"net/netip"
	"strings"
	"testing"
	"time"

	dpservices "github.com/onc-net/onc/datapath/services"
)

func TestReportNodePorts(t *testing.T) {
	var samples []Sample
	add := func(test, proxy, placement string, vals ...float64) {
		for i, v := range vals {
			samples = append(samples, Sample{Test: test, Config: NodePortConfig(proxy, placement), Rep: i + 1, Value: v, Unit: "Trans/s"})
		}
	}
	for _, pl := range NodePortPlacements {
		add("TCP_RR", ProxyIPTables, pl, 100, 100, 100)
		add("TCP_RR", ProxyNFTables, pl, 110, 110, 110)
		add("TCP_RR", ProxyONC, pl, 140, 130, 120) // ÷ iptables 1.4, 1.3, 1.2: median 1.3
		add("TCP_CRR", ProxyIPTables, pl, 10, 10, 10)
		add("TCP_CRR", ProxyNFTables, pl, 10, 10, 10)
		add("TCP_CRR", ProxyONC, pl, 12, 12, 12)
	}
	for i, v := range []float64{150, 140, 130} { // the reference, ÷ iptables 1.5, 1.4, 1.3
		samples = append(samples, Sample{Test: "TCP_RR", Config: NodePortHost, Rep: i + 1, Value: v, Unit: "Trans/s"})
	}
	// A failed path check: its value counts nowhere, its rep pairs with nothing.
	samples = append(samples, Sample{Test: "TCP_RR", Config: NodePortConfig(ProxyONC, OtherNode), Rep: 4, Value: 1, Unit: "Trans/s",
		Error: "ONC translated 0 connections"})
	samples = append(samples, Sample{Test: "TCP_RR", Config: NodePortConfig(ProxyIPTables, OtherNode), Rep: 4, Value: 100, Unit: "Trans/s"})
	r := NewReport(samples, 4, 2*time.Second, "6.18")

	if len(r.NodePortRatios) != 4 {
		t.Fatalf("ratios %+v", r.NodePortRatios)
	}
	for _, x := range r.NodePortRatios {
		if x.Test == "TCP_RR" && (spread(x.ONCOnIPTables) != Stat{Median: 1.3, Min: 1.2, Max: 1.4, N: 3} || x.NFTablesOnIPTables.Median != 1.1) {
			t.Fatalf("%s %s ratios %+v", x.Test, x.Placement, x)
		}
		// The reference is the backend's node's: no ratio at the other.
		wantHost := x.Test == "TCP_RR" && x.Placement == SameNode
		if (x.HostOnIPTables.N == 3) != wantHost || (wantHost && (x.HostOnIPTables.Median != 1.4 || x.ONCOnHost.Max != 140.0/150)) {
			t.Fatalf("%s %s reference ratios %+v", x.Test, x.Placement, x)
		}
	}
	for _, s := range r.Results {
		if s.Test == "TCP_RR" && s.Config == NodePortConfig(ProxyONC, OtherNode) && (s.N != 3 || s.Failed != 1 || s.Min != 120) {
			t.Fatalf("the failed run is counted: %+v", s)
		}
	}
	b := r.NodePortBar
	if b == nil || len(b.Checks) != 6 || !b.Met {
		t.Fatalf("bar %+v", b)
	}
	md := markdown(t, r, "## NodePort from outside the cluster",
		"| TCP_RR | same node | 1.300 [1.200 – 1.400] (1.200 – 1.400, n = 3) |",
		"| 1.400 [1.300 – 1.500] (1.300 – 1.500, n = 3) | 0.929 [0.923 – 0.933] (0.923 – 0.933, n = 3) |",
		"| TCP_RR | nodeport-same-host | 140.0 |",
		"| TCP_RR | nodeport-other-onc (1 of 4 runs failed) | 130.0 |",
		"- TCP_RR nodeport-same-onc ÷ nodeport-same-iptables = 1.300",
		"| 4 | TCP_RR | nodeport-other-onc | ONC translated 0 connections |")
	if strings.Contains(md, "## Services") {
		t.Fatal("a ClusterIP section without its rows")
	}
	var svg strings.Builder
	r.SVG(&svg)
	if !strings.Contains(svg.String(), "TCP_RR NodePort same") || !strings.Contains(svg.String(), "TCP_RR nodeport-same-onc 1.30") {
		t.Fatal("chart has no NodePort group relative to iptables")
	}
}

func TestNodePortPortsFitTheAPI(t *testing.T) {
	seen := map[string]bool{nodePortCtl.name: true}
	for _, p := range nodePortDataPorts() {
		// IANA_SVC_NAME: at most 15 characters; NodePorts in 30000-32767.
		if len(p.name) > 15 || seen[p.name] || p.nodePort < 30000 || p.nodePort > 32767 || p.port != p.nodePort {
			t.Fatalf("port %+v", p)
		}
		seen[p.name] = true
	}
	if len(seen) != 1+len(NodePortConfigs) {
		t.Fatalf("%d ports", len(seen))
	}
}

func TestProxyCheck(t *testing.T) {
	for _, c := range []struct {
		proxy string
		kind  dpservices.Frontend
		d     paths
		ok    bool
	}{
		{ProxyONC, dpservices.NodePort, paths{uplink: 5}, true},
		{ProxyONC, dpservices.NodePort, paths{socket: 5}, false}, // not the uplink
		{ProxyONC, dpservices.NodePort, paths{uplink: 5, natted: 1}, false},
		{ProxyONC, dpservices.NodePort, paths{uplink: 5, dsrSent: 9, remote: true}, false}, // DSR without the mode
		{ProxyONCDSR, dpservices.NodePort, paths{uplink: 5, dsrSent: 9, remote: true}, true},
		{ProxyONCDSR, dpservices.NodePort, paths{uplink: 5, remote: true}, false}, // SNAT after all
		{ProxyONCDSR, dpservices.NodePort, paths{uplink: 5}, true},                // a local backend: no DSR
		{ProxyONCDSR, dpservices.NodePort, paths{uplink: 5, dsrSent: 9}, false},   // DSR to a local backend
		{ProxyONCDSR, dpservices.NodePort, paths{uplink: 5, dsrSent: 9, remote: true, natted: 1}, false},
		{ProxyONC, dpservices.ClusterIP, paths{socket: 5}, true},
		{ProxyONC, dpservices.ClusterIP, paths{socket: 5, iptablesRules: 1}, false}, // kube-proxy left rules
		{ProxyIPTables, dpservices.NodePort, paths{iptables: 9, iptablesRules: 1, natted: 3}, true},
		{ProxyIPTables, dpservices.NodePort, paths{iptablesRules: 1, natted: 3}, false},
		{ProxyIPTables, dpservices.NodePort, paths{iptables: 9, uplink: 1}, false},
		{ProxyNFTables, dpservices.ClusterIP, paths{natted: 3}, true},
		{ProxyNFTables, dpservices.ClusterIP, paths{natted: 3, iptablesRules: 1}, false}, // iptables could have done it
		{ProxyNFTables, dpservices.ClusterIP, paths{}, false},
	} {
		if err := proxyCheck(c.proxy, c.kind)(c.d); (err == nil) != c.ok {
			t.Errorf("%s %s %+v: %v, want ok %v", c.proxy, c.kind, c.d, err, c.ok)
		}
	}
}

func TestPathsSince(t *testing.T) {
	d := paths{socket: 10, uplink: 3, iptables: 2, iptablesRules: 1, natted: 4, uplinkAll: 9}.since(paths{socket: 4, uplink: 3, iptables: 7, iptablesRules: 9, natted: 2, uplinkAll: 5})
	// iptables went back (kube-proxy rewrote its chain): counted from 0.
	if want := (paths{socket: 6, uplink: 0, iptables: 2, iptablesRules: 1, natted: 4, uplinkAll: 4}); d != want {
		t.Fatalf("%+v, want %+v", d, want)
	}
}

const natSave = `*nat
:KUBE-NODEPORTS - [0:0]
[7:420] -A KUBE-NODEPORTS -p tcp -m comment --comment "bench/netperf-np:np-s-ipt" -m tcp --dport 30867 -j KUBE-EXT-AAAA
[1:60] -A KUBE-NODEPORTS -p tcp -m comment --comment "bench/netperf-np:np-ctl" -m tcp --dport 30865 -j KUBE-EXT-BBBB
[3:180] -A KUBE-SERVICES -d 10.96.0.7/32 -p tcp -m comment --comment "bench/netperf:np-socklb cluster IP" -m tcp --dport 12866 -j KUBE-SVC-CCCC
[2:120] -A KUBE-SERVICES -d 10.96.0.7/32 -p tcp -m comment --comment "bench/netperf:np-ctl cluster IP" -m tcp --dport 12865 -j KUBE-SVC-DDDD
[0:0] -A KUBE-SERVICES -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS
COMMIT
`

func TestKubeProxyRules(t *testing.T) {
	vip := netip.MustParseAddr("10.96.0.7")
	node := netip.MustParseAddr("172.31.250.12")
	for _, c := range []struct {
		f     frontend
		pkts  uint64
		rules int
	}{
		{frontend{netip.AddrPortFrom(node, 30867), dpservices.NodePort}, 7, 1},
		{frontend{netip.AddrPortFrom(node, 30868), dpservices.NodePort}, 0, 0},
		{frontend{netip.AddrPortFrom(vip, 12866), dpservices.ClusterIP}, 3, 1},
		{frontend{netip.AddrPortFrom(vip, 0), dpservices.ClusterIP}, 5, 2},
		{frontend{netip.AddrPortFrom(netip.MustParseAddr("10.96.0.70"), 0), dpservices.ClusterIP}, 0, 0},
	} {
		pkts, rules, err := countRules(natSave, c.f.kubeProxyRule)
		if err != nil || pkts != c.pkts || rules != c.rules {
			t.Errorf("%s: %d packets in %d rules (%v), want %d in %d", c.f, pkts, rules, err, c.pkts, c.rules)
		}
	}
}

func TestProgrammedServicesInKubeProxyRules(t *testing.T) {
	ipt := `-N KUBE-SERVICES
-A KUBE-SERVICES -d 10.96.0.7/32 -p tcp -m comment --comment "bench/netperf:np-ctl cluster IP" -m tcp --dport 12865 -j KUBE-SVC-A
-A KUBE-SERVICES -d 10.96.0.7/32 -p tcp -m comment --comment "bench/netperf:np-onc cluster IP" -m tcp --dport 12866 -j KUBE-SVC-B
-A KUBE-SERVICES -d 10.96.0.8/32 -p tcp -m comment --comment "bench/scale-00000:http cluster IP" -m tcp --dport 80 -j KUBE-SVC-C
-A KUBE-SERVICES -d 10.96.0.1/32 -p tcp -m comment --comment "default/kubernetes:https cluster IP" -m tcp --dport 443 -j KUBE-SVC-D
`
	if got := distinct(ipt, iptablesService); got != 2 {
		t.Fatalf("iptables: %d Services, want 2", got)
	}
	nft := `table ip kube-proxy {
	map service-ips {
		type ipv4_addr . inet_proto . inet_service : verdict
		comment "ClusterIP, ExternalIP and LoadBalancer IP traffic"
		elements = { 10.96.0.7 . tcp . 12865 : goto service-ULMVA6XW-bench/netperf/tcp/np-ctl,
			     10.96.0.7 . tcp . 12866 : goto service-4JQ2KE3Z-bench/netperf/tcp/np-onc,
			     10.96.0.8 . tcp . 80 : goto service-2QWERTYU-bench/scale-00000/tcp/http,
			     10.96.0.1 . tcp . 443 : goto service-2QRHZV4L-default/kubernetes/tcp/https }
	}
}
`
	if got := distinct(nft, nftService); got != 2 {
		t.Fatalf("nftables: %d Services, want 2", got)
	}
}

func TestFakeAddr(t *testing.T) {
	cidr := netip.MustParsePrefix("10.244.0.0/16")
	for k, want := range map[int]string{0: "10.244.128.0", 300: "10.244.129.44", 32768: "10.244.128.0"} {
		if got := fakeAddr(cidr, k); got.String() != want {
			t.Errorf("fakeAddr(%d) = %s, want %s", k, got, want)
		}
	}
}

func TestRatioOfMedians(t *testing.T) {
	got := RatioOfMedians([]float64{90, 100, 110}, []float64{100, 100, 200})
	if got.Median != 1 || got.Min != 0.45 || got.Max != 1.1 || got.N != 3 || got.Lo > got.Median || got.Hi < got.Median {
		t.Fatalf("%+v", got)
	}
	if got := RatioOfMedians(nil, []float64{1}); got.N != 0 {
		t.Fatalf("no samples: %+v", got)
	}
}

func TestScaleReport(t *testing.T) {
	crr := func(proxy string, n int, vals ...float64) []Sample {
		var out []Sample
		for i, v := range vals {
			out = append(out, Sample{Test: "TCP_CRR", Config: proxy, Rep: i + 1, Value: v})
		}
		return out
	}
	rows := []ScaleRow{
		{Proxy: ProxyONC, Services: 10, ProgramS: 0.5, Samples: crr(ProxyONC, 10, 100, 100, 100, 100, 100)},
		{Proxy: ProxyONC, Services: 10000, ProgramS: 8, Samples: append(crr(ProxyONC, 10000, 98, 99, 98, 99, 98),
			Sample{Test: "TCP_CRR", Rep: 6, Value: 1, Error: "socket LB translated 0"})},
		{Proxy: ProxyIPTables, Services: 10, ProgramS: 1, Samples: crr(ProxyIPTables, 10, 100, 100, 100)},
		{Proxy: ProxyIPTables, Services: 10000, Error: "kube-proxy programmed 9000 of 10000"},
	}
	r := NewScaleReport(rows)
	if len(r.Ratios) != 1 || r.Ratios[0].Proxy != ProxyONC || r.Ratios[0].CRR.Median != 0.98 || r.Ratios[0].CRR.N != 5 {
		t.Fatalf("ratios %+v", r.Ratios)
	}
	if !r.Bar.Met || len(r.Bar.Checks) != 2 {
		t.Fatalf("bar %+v", r.Bar)
	}
	var md strings.Builder
	r.Markdown(&md)
	for _, want := range []string{"| 10000 | iptables | failed: kube-proxy programmed 9000 of 10000 |",
		"| onc | 10000 | 10 | 0.980", "| 6 |  | socket LB translated 0 |", "**Bar met.**"} {
		if !strings.Contains(md.String(), want) {
			t.Errorf("markdown lacks %q:\n%s", want, md.String())
		}
	}
}
