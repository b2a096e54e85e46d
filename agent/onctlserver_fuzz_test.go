package agent

// Fuzz targets for the onctl requests that carry input (SetFastPath's one
// bool has nothing to fuzz): a bad argument is InvalidArgument naming it,
// whatever the node's state; a good one does what it says or gets the
// state's status, never Unknown or Internal.

import (
	"context"
	"net"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/onc-net/onc/agent/ipam"
	apiv1 "github.com/onc-net/onc/api/v1"
	"github.com/onc-net/onc/datapath"
	"github.com/onc-net/onc/datapath/bypass"
	"github.com/onc-net/onc/datapath/fastpath"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// oneEntryCache is a loaded fast path whose flow cache has one entry in
// each table; ListCache calls nothing else of it.
type oneEntryCache struct{ datapath.FastPath }

func (oneEntryCache) Dests() ([]fastpath.Dest, error) {
	return []fastpath.Dest{{Pod: netip.MustParseAddr("10.244.1.2"), Node: netip.MustParseAddr("192.0.2.2")}}, nil
}

func (oneEntryCache) Encaps() ([]fastpath.Encap, error) {
	mac := net.HardwareAddr{2, 0, 0, 0, 0, 1}
	return []fastpath.Encap{{Node: netip.MustParseAddr("192.0.2.2"), Ifindex: 1, OuterSrc: mac, OuterDst: mac, InnerSrc: mac, InnerDst: mac,
		OuterSrcIP: netip.MustParseAddr("192.0.2.1"), OuterDstIP: netip.MustParseAddr("192.0.2.2")}}, nil
}

func (oneEntryCache) Locals() ([]fastpath.Local, error) {
	mac := net.HardwareAddr{2, 0, 0, 0, 0, 2}
	return []fastpath.Local{{Pod: netip.MustParseAddr("10.244.7.2"), Ifindex: 1, PodMAC: mac, HostMAC: mac}}, nil
}

func (oneEntryCache) Flows() ([]fastpath.Flow, error) {
	return []fastpath.Flow{{Local: netip.MustParseAddrPort("10.244.7.2:80"), Remote: netip.MustParseAddrPort("10.244.1.2:40000"), Proto: "tcp"}}, nil
}

// onctlCtx is one fuzz input's context: a handler must answer in time.
func onctlCtx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	t.Cleanup(cancel)
	return c
}

// wantCode fails unless err has code want and its message starts with
// field, the request's field it is about ("" for none).
func wantCode(t *testing.T, what string, err error, want codes.Code, field string) {
	t.Helper()
	st := status.Convert(err)
	if st.Code() != want || !strings.HasPrefix(st.Message(), field) {
		t.Fatalf("%s: %v, want %v naming %s", what, err, want, field)
	}
}

// FuzzListCache: a table onctl does not know is InvalidArgument whether
// or not the fast path is loaded; a known one lists exactly its tables,
// or is FailedPrecondition without a fast path.
func FuzzListCache(f *testing.F) {
	for _, table := range []string{"", "egress", "ingress", "filter", "Egress", "encap", "egress "} {
		f.Add(table)
	}
	ta := newReadyAgent(f)
	f.Fuzz(func(t *testing.T, table string) {
		req := &apiv1.ListCacheRequest{Table: table}
		if _, err := proto.Marshal(req); err != nil {
			return // gRPC cannot carry it: it never reaches the agent
		}
		known := slices.Contains([]string{"", "egress", "ingress", "filter"}, table) // onctl cache list [egress|ingress|filter]
		for _, fp := range []datapath.FastPath{nil, oneEntryCache{}} {
			ta.dp.mu.Lock()
			ta.dp.fp = fp
			ta.dp.mu.Unlock()
			resp, err := ta.ctl.ListCache(onctlCtx(t), req)
			switch {
			case !known:
				wantCode(t, "table "+table, err, codes.InvalidArgument, "table")
			case fp == nil:
				wantCode(t, "table "+table+" without a fast path", err, codes.FailedPrecondition, "")
			case err != nil:
				t.Fatalf("table %q: %v", table, err)
			default:
				listed := []bool{len(resp.Egress) > 0 && len(resp.Encap) > 0, len(resp.Ingress) > 0, len(resp.Filter) > 0}
				want := []bool{table == "" || table == "egress", table == "" || table == "ingress", table == "" || table == "filter"}
				if !slices.Equal(listed, want) {
					t.Fatalf("table %q listed egress, ingress, filter = %v, want %v", table, listed, want)
				}
			}
		}
	})
}

// FuzzSetBypass: a setting is off, on, or size with a minimum of at least
// one byte, and a minimum only with size; anything else is InvalidArgument
// naming the field and switches nothing. A good one is applied exactly,
// or is FailedPrecondition where the bypass did not load.
func FuzzSetBypass(f *testing.F) {
	for _, s := range []struct {
		mode string
		min  uint32
	}{{"off", 0}, {"on", 0}, {"size", 2048}, {"size", 0}, {"on", 256}, {"fast", 0}, {"", 0}} {
		f.Add(s.mode, s.min)
	}
	ta := newReadyAgent(f)
	f.Fuzz(func(t *testing.T, mode string, minSize uint32) {
		req := &apiv1.SetBypassRequest{Mode: mode, MinSize: minSize}
		if _, err := proto.Marshal(req); err != nil {
			return // gRPC cannot carry it
		}
		good := (mode == "off" || mode == "on") && minSize == 0 || mode == "size" && minSize > 0
		for _, loaded := range []bool{false, true} {
			bp := ta.bypassDP
			bp.mu.Lock()
			bp.loaded, bp.cfg = loaded, bypass.Config{Mode: bypass.Off}
			bp.mu.Unlock()
			resp, err := ta.ctl.SetBypass(onctlCtx(t), req)
			switch {
			case !good:
				field := "mode"
				if mode == "off" || mode == "on" || mode == "size" {
					field = "min_size"
				}
				wantCode(t, "bypass "+mode, err, codes.InvalidArgument, field)
				if bp.Config() != (bypass.Config{Mode: bypass.Off}) {
					t.Fatalf("a rejected %v switched the bypass to %v", req, bp.Config())
				}
			case !loaded:
				wantCode(t, "bypass "+mode+" where it did not load", err, codes.FailedPrecondition, "")
			case err != nil:
				t.Fatalf("%v: %v", req, err)
			case bp.Config() != (bypass.Config{Mode: bypass.Mode(mode), MinSize: minSize}) || resp.State.Mode != mode || resp.State.MinSize != minSize:
				t.Fatalf("%v applied as %v, answered %v", req, bp.Config(), resp.State)
			}
		}
	})
}

// FuzzListPolicy: a pod is named as NAMESPACE/POD or POD; the answer is
// that one pod, NotFound when none is so named, InvalidArgument when
// several are; without policy, FailedPrecondition.
func FuzzListPolicy(f *testing.F) {
	for _, pod := range []string{"", "web", "default/web", "other/web", "db", "nope", "default/", "/web", "default/web/x"} {
		f.Add(pod)
	}
	withPolicy := newReadyAgent(f, func(c *Config) { c.Policy = &fakeInputs{snap: denyIngressTo("web", "db")} })
	pool, _ := withPolicy.readyPool()
	for i, p := range []struct{ ns, name string }{{"default", "web"}, {"default", "db"}, {"other", "web"}} {
		key := ipam.Key{ContainerID: p.ns + "-" + p.name, IfName: "eth0"}
		if _, err := pool.Allocate(ipam.Attachment{Key: key, Netns: "/ns/" + key.ContainerID, HostIface: datapath.HostIfaceName(key.ContainerID, key.IfName),
			K8sNamespace: p.ns, K8sName: p.name}); err != nil {
			f.Fatalf("pod %d: %v", i, err)
		}
	}
	run, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { withPolicy.policy.Run(run); close(done) }()
	f.Cleanup(func() { stop(); <-done })
	if err := withPolicy.policy.Await(context.Background()); err != nil {
		f.Fatal(err)
	}
	all, err := withPolicy.ctl.ListPolicy(context.Background(), &apiv1.ListPolicyRequest{})
	if err != nil || len(all.Pods) != 3 {
		f.Fatalf("every pod's policy: %v, %v", all, err)
	}
	without := newReadyAgent(f)
	f.Fuzz(func(t *testing.T, pod string) {
		req := &apiv1.ListPolicyRequest{Pod: pod}
		if _, err := proto.Marshal(req); err != nil {
			return // gRPC cannot carry it
		}
		_, err := without.ctl.ListPolicy(onctlCtx(t), req)
		wantCode(t, "policy of "+pod+" without policy", err, codes.FailedPrecondition, "")
		var named []string
		for _, p := range all.Pods {
			if _, name, _ := strings.Cut(p.Key, "/"); pod == p.Key || pod == name {
				named = append(named, p.Key)
			}
		}
		resp, err := withPolicy.ctl.ListPolicy(onctlCtx(t), req)
		switch {
		case pod == "":
			if err != nil || len(resp.Pods) != len(all.Pods) {
				t.Fatalf("every pod's policy: %v, %v", resp, err)
			}
		case len(named) == 0:
			wantCode(t, "policy of "+pod, err, codes.NotFound, "")
		case len(named) > 1:
			wantCode(t, "policy of "+pod, err, codes.InvalidArgument, "")
		case err != nil || len(resp.Pods) != 1 || resp.Pods[0].Key != named[0]:
			t.Fatalf("policy of %q: %v, %v, want %s", pod, resp, err, named[0])
		}
	})
}
