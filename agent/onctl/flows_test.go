package onctl_test

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/onc-net/onc/agent/flows"
	apiv1 "github.com/onc-net/onc/api/v1"
)

// flowsAgent answers GetFlows with its records, keeping the request.
type flowsAgent struct {
	apiv1.UnimplementedAgentServer
	records []*apiv1.FlowRecord
	req     *apiv1.GetFlowsRequest
}

func (f *flowsAgent) GetFlows(req *apiv1.GetFlowsRequest, stream grpc.ServerStreamingServer[apiv1.FlowRecord]) error {
	f.req = req
	for _, r := range f.records {
		if err := stream.Send(r); err != nil {
			return err
		}
	}
	return nil
}

// The eBPF programs' records print their event, path, the backend chosen
// or the sending node, the reason and what was held back; --event and
// --verdict reach the agent.
func TestOnctlFlowsPrintsEventRecords(t *testing.T) {
	pod := func(ns, name, ip string, port uint32) *apiv1.FlowEndpoint {
		return &apiv1.FlowEndpoint{Kind: "pod", Namespace: ns, Name: name, Ip: ip, Port: port}
	}
	f := &flowsAgent{records: []*apiv1.FlowRecord{
		{Node: "n1", Event: "translate", Verdict: "translated", Path: "socket-lb", Protocol: "TCP",
			Source:      pod("app", "client", "10.244.1.5", 0),
			Destination: &apiv1.FlowEndpoint{Kind: "service", Namespace: "app", Name: "web:http", Ip: "10.96.0.10", Port: 80},
			Translated:  pod("app", "web-1", "10.244.2.7", 8080), Suppressed: 3},
		{Node: "n1", Event: "drop", Verdict: "dropped", Path: "fast", Protocol: "TCP", Reason: "overlay_drop_inner_source",
			Source: &apiv1.FlowEndpoint{Kind: "ip", Ip: "10.244.9.3", Port: 80}, Destination: pod("app", "client", "10.244.1.5", 40000),
			Translated: &apiv1.FlowEndpoint{Kind: "node", Name: "n2", Ip: "192.0.2.2"}},
		{Node: "n1", Event: "refuse", Verdict: "refused", Path: "socket-lb", Protocol: "TCP", Reason: "connect_refused",
			Source: &apiv1.FlowEndpoint{Kind: "node", Name: "n1"}, Destination: &apiv1.FlowEndpoint{Kind: "service", Namespace: "app", Name: "none", Ip: "10.96.0.11", Port: 80}},
	}}
	out, err := run("-s", serve(t, f), "flows", "--event", "translate", "--verdict", "translated")
	if err != nil {
		t.Fatal(err)
	}
	if f.req.Event != "translate" || f.req.Verdict != "translated" {
		t.Errorf("request %+v, want event translate and verdict translated", f.req)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	for i, want := range []string{
		"n1 TRANSLATED translate socket-lb TCP app/client (10.244.1.5) → service app/web:http (10.96.0.10:80) ⇒ app/web-1 (10.244.2.7:8080) (+3 suppressed)",
		"n1 DROPPED drop fast TCP 10.244.9.3:80 → app/client (10.244.1.5:40000) from node n2 (192.0.2.2): overlay_drop_inner_source",
		"n1 REFUSED refuse socket-lb TCP node n1 → service app/none (10.96.0.11:80): connect_refused",
	} {
		if i >= len(lines) || !strings.HasSuffix(lines[i], want) {
			t.Errorf("line %d of\n%s\nwant it to end %q", i, out, want)
		}
	}
}

// storeAgent answers GetFlows from a store, as the agent does.
type storeAgent struct {
	apiv1.UnimplementedAgentServer
	store *flows.Store
}

func (s storeAgent) GetFlows(req *apiv1.GetFlowsRequest, stream grpc.ServerStreamingServer[apiv1.FlowRecord]) error {
	return flows.Serve(s.store, req, stream)
}

// The denials an agent recorded before a flood of the fast path's open
// records are still what onctl flows --verdict denied shows.
func TestOnctlFlowsDenialsOutliveAFlood(t *testing.T) {
	store := flows.NewStore(8192)
	dst := flows.Endpoint{Kind: flows.KindIP, Addr: netip.MustParseAddrPort("10.244.2.7:80")}
	for i := range 10 {
		store.Add(flows.Record{Time: time.Unix(int64(i), 0), Node: "n1", Event: flows.EventPolicy, Verdict: flows.VerdictDenied, Proto: 6,
			Src: flows.Endpoint{Kind: flows.KindPod, Namespace: "app", Name: fmt.Sprint("client-", i), Addr: netip.MustParseAddrPort("10.244.1.5:40000")}, Dst: dst})
	}
	for i := range 100_000 {
		store.Add(flows.Record{Time: time.Unix(int64(100+i), 0), Node: "n1", Event: flows.EventOpen, Verdict: flows.VerdictCached, Path: flows.PathFast, Src: dst, Dst: dst})
	}
	out, err := run("-s", serve(t, storeAgent{store: store}), "flows", "--verdict", "denied")
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 10 || !strings.Contains(lines[0], "app/client-0 ") || !strings.Contains(lines[9], "app/client-9 ") {
		t.Fatalf("onctl flows --verdict denied after 100000 open records:\n%s\nwant the 10 denials", out)
	}
}
