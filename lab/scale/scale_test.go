package scale

import (
	"bytes"
	"encoding/json"
	"net/netip"
	"strings"
	"testing"
	"time"
)

const etcdMetrics = `# HELP etcd_mvcc_put_total Total number of puts seen by this member.
# TYPE etcd_mvcc_put_total counter
etcd_mvcc_put_total 120
# TYPE etcd_mvcc_delete_total counter
etcd_mvcc_delete_total 3
# TYPE etcd_debugging_lease_renewed_total counter
etcd_debugging_lease_renewed_total 1500
# TYPE etcd_mvcc_range_total counter
etcd_mvcc_range_total 99999
`

func TestEtcdWritesArePutsDeletesAndRenewals(t *testing.T) {
	w, err := etcdWrites([]byte(etcdMetrics))
	if err != nil {
		t.Fatal(err)
	}
	if w["put"] != 120 || w["delete"] != 3 || w[etcdHeartbeat] != 1500 || w.Total() != 1623 {
		t.Fatalf("etcd writes %v", w)
	}
	if _, err := etcdWrites([]byte("etcd_mvcc_put_total 1\n")); err == nil {
		t.Fatal("missing counters not reported")
	}
}

func TestApiserverWritesAreMutatingVerbsByResource(t *testing.T) {
	metrics := `# TYPE apiserver_request_total counter
apiserver_request_total{code="200",component="apiserver",dry_run="",group="coordination.k8s.io",resource="leases",scope="resource",subresource="",verb="PUT",version="v1"} 600
apiserver_request_total{code="409",component="apiserver",dry_run="",group="coordination.k8s.io",resource="leases",scope="resource",subresource="",verb="PUT",version="v1"} 2
apiserver_request_total{code="200",component="apiserver",dry_run="",group="",resource="nodes",scope="resource",subresource="status",verb="PATCH",version="v1"} 5
apiserver_request_total{code="200",component="apiserver",dry_run="",group="",resource="configmaps",scope="resource",subresource="",verb="GET",version="v1"} 7000
apiserver_request_total{code="0",component="apiserver",dry_run="",group="onc.io",resource="oncnodes",scope="cluster",subresource="",verb="WATCH",version="v1"} 4
`
	w, err := apiserverWrites([]byte(metrics))
	if err != nil {
		t.Fatal(err)
	}
	if len(w) != 2 || w[kubeHeartbeat] != 602 || w["PATCH nodes/status"] != 5 {
		t.Fatalf("apiserver writes %v", w)
	}
}

func TestWritesRate(t *testing.T) {
	a := Writes{"put": 10, "lease renewal": 100}
	b := Writes{"put": 10, "lease renewal": 160, "delete": 6}
	r := a.Rate(b, time.Minute)
	if len(r) != 2 || r["lease renewal"] != 1 || r["delete"] != 0.1 {
		t.Fatalf("rate %v", r)
	}
	if got := r.String(); got != "lease renewal 1, delete 0.1" {
		t.Fatalf("String() = %q", got)
	}
}

func TestHeartbeatRate(t *testing.T) {
	if got := HeartbeatRate("kubernetes", 6000, 40*time.Second); got != 500 {
		t.Fatalf("kubernetes: %v/s, want a renewal per node every 12 s", got)
	}
	if got := HeartbeatRate("etcd", 300, 30*time.Second); got != 30 {
		t.Fatalf("etcd: %v/s, want a keepalive per node every 10 s", got)
	}
}

func TestSimulatedNodesAreDistinct(t *testing.T) {
	names, ips, macs := map[string]bool{}, map[netip.Addr]bool{}, map[string]bool{}
	for i := 1; i <= 70000; i++ {
		s := specOf(i)
		if names[s.Name] || ips[s.IP] || macs[s.VTEPMAC.String()] {
			t.Fatalf("node %d repeats a name, address or MAC: %+v", i, s)
		}
		if !nodeIPs.Contains(s.IP) || s.VTEPMAC[0]&0x03 != 0x02 {
			t.Fatalf("node %d: %s outside %s, or MAC %s not locally administered unicast", i, s.IP, nodeIPs, s.VTEPMAC)
		}
		names[s.Name], ips[s.IP], macs[s.VTEPMAC.String()] = true, true, true
	}
	if got := addrOf(256).String(); got != "100.64.1.0" {
		t.Fatalf("addrOf(256) = %s", got)
	}
}

func TestSustainedNeedsHeartbeatsAndLiveNodes(t *testing.T) {
	ok := Row{Nodes: 1000, HeartbeatsPerS: 88, HeartbeatsWantPerS: 100, Alive: 1000}
	if ev := sustainEvidence(ok); ev != "" {
		t.Fatalf("sustained run judged not: %s", ev)
	}
	slow := ok
	slow.HeartbeatsPerS, slow.Alive = 50, 990
	ev := sustainEvidence(slow)
	if !strings.Contains(ev, "50 %") || !strings.Contains(ev, "10 of 1000") {
		t.Fatalf("evidence %q lacks the heartbeat share or the lost nodes", ev)
	}
}

func TestReportMergesJudgesAndRenders(t *testing.T) {
	r := Report{Date: "2026-01-01T00:00:00Z", Kernel: "6.18", CPUs: 2, Window: "1m0s", Counts: map[string]string{"etcd": Counts("etcd")}}
	done := len(phases)
	r.Merge([]Row{
		{Datastore: "kubernetes", Nodes: 5000, ColdS: 12, ChangeS: 0.8, AgentCPUPct: 0.4, WritesPerS: 501.3, AllocS: 90, Phases: done, Sustained: true},
		{Datastore: "etcd", Nodes: 5000, ColdS: 45, Phases: 2, Error: "agent exited\nlog..."},
		{Datastore: "etcd", Nodes: 100, ColdS: 1, ChangeS: 0.1, AgentCPUPct: 1, WritesPerS: 8, Phases: done, Sustained: true},
	})
	r.Merge([]Row{{Datastore: "etcd", Nodes: 100, ColdS: 2, ChangeS: 0.1, AgentCPUPct: 0.1, WritesPerS: 8, Phases: done, Sustained: true}})
	if len(r.Rows) != 3 || r.Rows[0].Nodes != 100 || r.Rows[0].ColdS != 2 || r.Rows[2].Datastore != "kubernetes" {
		t.Fatalf("merged rows %+v", r.Rows)
	}
	judge := func(row Row, field string) string {
		for _, b := range Bars {
			if b.Field == field {
				met, ok := b.Judge(row)
				return map[bool]string{true: "met", false: "missed"}[met] + map[bool]string{true: "", false: " unmeasured"}[ok]
			}
		}
		t.Fatalf("no bar %s", field)
		return ""
	}
	k8s, etcd5k := r.Rows[2], r.Rows[1]
	if judge(k8s, "writes_per_s") != "missed" || judge(k8s, "cold_s") != "met" || judge(k8s, "change_s") != "met" {
		t.Fatal("kubernetes 5000: 501.3 writes/s must miss N/10, cold 12 s and change 0.8 s meet theirs")
	}
	if judge(etcd5k, "cold_s") != "missed" || judge(etcd5k, "change_s") != "missed unmeasured" {
		t.Fatal("etcd 5000: cold 45 s misses; changes were never reached")
	}
	if judge(Row{Nodes: 100, AgentCPUPct: 1, Phases: done}, "agent_cpu_pct") != "missed" {
		t.Fatal("1 % of a core is not under 1 %")
	}

	var js bytes.Buffer
	if err := r.JSON(&js); err != nil {
		t.Fatal(err)
	}
	var shape struct {
		Rows []map[string]any `json:"rows"`
	}
	if err := json.Unmarshal(js.Bytes(), &shape); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"datastore", "nodes", "cold_s", "change_s", "agent_cpu_pct", "agent_rss_mb", "writes_per_s", "alloc_s"} {
		if _, ok := shape.Rows[0][k]; !ok {
			t.Fatalf("scale.json row lacks %q: %s", k, js.String())
		}
	}
	var md, svg strings.Builder
	r.Markdown(&md)
	r.SVG(&svg)
	for _, want := range []string{
		"| kubernetes | 5000 | datastore writes/s ≤ N ÷ 10 | 501.3/s | **missed** |",
		"| etcd | 5000 | one node's change on the agent ≤ 2 s | – | not measured |",
		"| etcd | 5000 | 45.0 | – |",
		"**etcd**: the largest N measured that this machine sustained: 100.",
		"Failed during steady state: agent exited.",
	} {
		if !strings.Contains(md.String(), want) {
			t.Errorf("markdown lacks %q:\n%s", want, md.String())
		}
	}
	if !strings.HasPrefix(svg.String(), "<svg") || strings.Count(svg.String(), "<rect") < 3+len(r.Rows) {
		t.Fatalf("chart has no bars:\n%s", svg.String())
	}
}
