package agent

// onctl bypass's server side against the fake datapath: the setting and
// connections it reports, runtime switches and the errors of both.

import (
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/onc-net/onc/agent/ipam"
	apiv1 "github.com/onc-net/onc/api/v1"
	"github.com/onc-net/onc/datapath/bpf"
	"github.com/onc-net/onc/datapath/bypass"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// fakeBypass is the intra-node bypass: not loaded until withBypass, then
// its setting, and the connections and counters the test gives it.
type fakeBypass struct {
	mu     sync.Mutex
	loaded bool
	cfg    bypass.Config
	conns  []bypass.Conn
	stats  []bpf.Counter
	keptCT int // KeepConntrack calls
}

func (b *fakeBypass) Controls() bypass.Controls {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.loaded {
		return nil // not a typed nil: the agent tests for nil
	}
	return b
}

func (b *fakeBypass) Status() string {
	if b.Controls() != nil {
		return ""
	}
	return "failed to load, every connection takes the TCP/IP stack: no sockmap here"
}

func (b *fakeBypass) KeepConntrack() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.keptCT++
	return nil
}

func (b *fakeBypass) Config() bypass.Config {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.cfg
}

func (b *fakeBypass) SetConfig(c bypass.Config) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.cfg = c
	return nil
}

func (b *fakeBypass) Cgroup() string { return "/sys/fs/cgroup" }

func (b *fakeBypass) Conns() ([]bypass.Conn, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.conns, nil
}

func (b *fakeBypass) Stats() ([]bpf.Counter, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.stats, nil
}

// withBypass loads the agent's fake bypass, set to cfg.
func (ta *testAgent) withBypass(cfg bypass.Config) *fakeBypass {
	bp := ta.bypassDP
	bp.mu.Lock()
	defer bp.mu.Unlock()
	bp.loaded, bp.cfg = true, cfg
	return bp
}

func (ta *testAgent) podIP(t *testing.T, container string) netip.Addr {
	t.Helper()
	pool, _ := ta.readyPool()
	att, ok := pool.Get(ipam.Key{ContainerID: container, IfName: "eth0"})
	if !ok {
		t.Fatalf("no attachment for %s", container)
	}
	return att.IPv4()
}

// The connections come with the local pods holding their addresses, and
// the counters under the program "bypass".
func TestListBypass(t *testing.T) {
	ta := newTestAgent(t)
	ta.bringUp(t, "10.244.7.0/24")
	ta.mustAdd(t, "client", "/ns/client")
	ta.mustAdd(t, "server", "/ns/server")
	bp := ta.withBypass(bypass.Config{Mode: bypass.On})
	client := netip.AddrPortFrom(ta.podIP(t, "client"), 40000)
	server := netip.AddrPortFrom(ta.podIP(t, "server"), 8080)
	stranger := netip.MustParseAddrPort("10.244.7.200:9000") // no attachment holds it
	bp.conns = []bypass.Conn{
		{Client: client, Server: server, ClientCookie: 1, ServerCookie: 2, Age: 90 * time.Second},
		{Client: client, Server: stranger, ClientCookie: 3, Age: time.Second},
	}
	bp.stats = []bpf.Counter{{Name: "redirected_msgs", Value: 7}, {Name: "fallback_small", Value: 2}}

	resp, err := ta.ctl.ListBypass(ctx(t), &apiv1.ListBypassRequest{})
	if err != nil {
		t.Fatal(err)
	}
	want := &apiv1.ListBypassResponse{
		State: &apiv1.BypassState{Mode: "on", Cgroup: "/sys/fs/cgroup"},
		Conns: []*apiv1.BypassConn{
			{Client: client.String(), Server: server.String(), ClientPod: "default/client", ServerPod: "default/server", Paired: true, AgeSeconds: 90},
			{Client: client.String(), Server: stranger.String(), ClientPod: "default/client", AgeSeconds: 1},
		},
		Counters: []*apiv1.Counter{{Program: "bypass", Name: "redirected_msgs", Value: 7}, {Program: "bypass", Name: "fallback_small", Value: 2}},
	}
	if !proto.Equal(resp, want) {
		t.Errorf("ListBypass:\n got %v\nwant %v", resp, want)
	}
}

// A switch reaches the datapath and shows in the reply and in status.
func TestSetBypass(t *testing.T) {
	ta := newTestAgent(t)
	bp := ta.withBypass(bypass.Config{Mode: bypass.Off})
	resp, err := ta.ctl.SetBypass(ctx(t), &apiv1.SetBypassRequest{Mode: "size", MinSize: 4096})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := bp.Config(), (bypass.Config{Mode: bypass.Size, MinSize: 4096}); got != want {
		t.Errorf("datapath setting %v, want %v", got, want)
	}
	want := &apiv1.BypassState{Mode: "size", MinSize: 4096, Cgroup: "/sys/fs/cgroup"}
	if !proto.Equal(resp.State, want) {
		t.Errorf("SetBypass replied %v, want %v", resp.State, want)
	}
	st, err := ta.ctl.GetStatus(ctx(t), &apiv1.GetStatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(st.Bypass, want) {
		t.Errorf("status bypass %v, want %v", st.Bypass, want)
	}
}

// A bad setting is refused, naming the field, and changes nothing.
func TestSetBypassRejectsBadSettings(t *testing.T) {
	ta := newTestAgent(t)
	bp := ta.withBypass(bypass.Config{Mode: bypass.On})
	for _, tc := range []struct {
		req   *apiv1.SetBypassRequest
		field string
	}{
		{&apiv1.SetBypassRequest{Mode: "fast"}, "mode"},
		{&apiv1.SetBypassRequest{}, "mode"},
		{&apiv1.SetBypassRequest{Mode: "size"}, "min_size"},
		// Found by FuzzSetBypass: a minimum with another mode was dropped.
		{&apiv1.SetBypassRequest{Mode: "on", MinSize: 87}, "min_size"},
	} {
		_, err := ta.ctl.SetBypass(ctx(t), tc.req)
		if status.Code(err) != codes.InvalidArgument || !strings.HasPrefix(status.Convert(err).Message(), tc.field+":") {
			t.Errorf("SetBypass(%v): %v, want InvalidArgument naming %s", tc.req, err, tc.field)
		}
	}
	if got := bp.Config(); got != (bypass.Config{Mode: bypass.On}) {
		t.Errorf("a refused setting changed the datapath's to %v", got)
	}
}

// Without a bypass, listing and status say why, and a switch fails
// saying so too.
func TestBypassUnavailable(t *testing.T) {
	ta := newTestAgent(t)
	why := ta.bypassDP.Status()
	resp, err := ta.ctl.ListBypass(ctx(t), &apiv1.ListBypassRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if want := (&apiv1.ListBypassResponse{State: &apiv1.BypassState{Status: why}}); !proto.Equal(resp, want) {
		t.Errorf("ListBypass without a bypass: %v, want %v", resp, want)
	}
	st, err := ta.ctl.GetStatus(ctx(t), &apiv1.GetStatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if st.Bypass.GetStatus() != why || st.Bypass.GetMode() != "" {
		t.Errorf("status bypass %v, want only the status %q", st.Bypass, why)
	}
	_, err = ta.ctl.SetBypass(ctx(t), &apiv1.SetBypassRequest{Mode: "on"})
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), why) {
		t.Errorf("SetBypass without a bypass: %v, want FailedPrecondition saying %q", err, why)
	}
}
