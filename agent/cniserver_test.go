package agent

// The CNI verbs' logic against the fake datapath: error codes, rollback,
// idempotent DEL, CHECK mismatches, STATUS and GC. The privileged tests in
// cni/ run the same verbs through the real binary on a lab node.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/onc-net/onc/agent/ipam"
	apiv1 "github.com/onc-net/onc/api/v1"
	"github.com/onc-net/onc/datapath"
	"github.com/onc-net/onc/datastore"
	"github.com/onc-net/onc/internal/netaddr"
)

const conf = `{"cniVersion":"1.1.0","name":"onc","type":"onc"}`

func req(container, netns string) *apiv1.CNIRequest {
	return &apiv1.CNIRequest{ContainerId: container, Netns: netns, Ifname: "eth0",
		Args: "K8S_POD_NAMESPACE=default;K8S_POD_NAME=" + container, Config: []byte(conf)}
}

// code is the response's CNI error code, 0 for success.
func code(t *testing.T, r *apiv1.CNIResponse, err error) uint32 {
	t.Helper()
	if err != nil {
		t.Fatalf("gRPC error instead of a CNI result: %v", err)
	}
	if r.Error == nil {
		return 0
	}
	if r.Error.Msg == "" {
		t.Errorf("CNI error %d has no message", r.Error.Code)
	}
	return r.Error.Code
}

func (ta *testAgent) add(t *testing.T, container, netns string) (*apiv1.CNIResponse, uint32) {
	t.Helper()
	r, err := ta.cni.Add(ctx(t), req(container, ta.netns(netns)))
	return r, code(t, r, err)
}

// mustAdd adds a pod that must succeed.
func (ta *testAgent) mustAdd(t *testing.T, container, netns string) *apiv1.CNIResponse {
	t.Helper()
	r, c := ta.add(t, container, netns)
	if c != 0 {
		t.Fatalf("ADD %s: code %d: %v", container, c, r.Error)
	}
	return r
}

// leftovers says what an attachment left behind: its address in the pool
// (memory and file) and its interface in the fake kernel.
func (ta *testAgent) leftovers(t *testing.T, container string) []string {
	t.Helper()
	var out []string
	key := ipam.Key{ContainerID: container, IfName: "eth0"}
	pool, _ := ta.readyPool()
	if att, ok := pool.Get(key); ok {
		out = append(out, "address "+strings.Join(netaddr.Strings(att.IPs), ","))
	}
	if b, err := os.ReadFile(ta.stateFile()); err == nil && strings.Contains(string(b), container) {
		out = append(out, "address in "+filepath.Base(ta.stateFile()))
	}
	ta.dp.mu.Lock()
	defer ta.dp.mu.Unlock()
	if _, ok := ta.dp.pods[datapath.HostIfaceName(container, "eth0")]; ok {
		out = append(out, "interface")
	}
	return out
}

func TestAddResult(t *testing.T) {
	ta := newTestAgent(t)
	ta.bringUp(t, "10.244.7.0/24")
	r := ta.mustAdd(t, "c1", "/run/netns/p1")
	var res current.Result
	if err := json.Unmarshal(r.Result, &res); err != nil {
		t.Fatal(err)
	}
	if len(res.IPs) != 1 || res.IPs[0].Address.String() != "10.244.7.2/32" || res.IPs[0].Gateway.String() != "10.244.7.1" {
		t.Errorf("IPs = %+v, want 10.244.7.2/32 via 10.244.7.1", res.IPs)
	}
	if len(res.Interfaces) != 2 || res.Interfaces[1].Sandbox != "/run/netns/p1" || res.Interfaces[1].Mtu != 1450 ||
		res.Interfaces[0].Name != datapath.HostIfaceName("c1", "eth0") || res.Interfaces[0].Mac == "" || res.Interfaces[1].Mac == "" {
		t.Errorf("interfaces = %+v", res.Interfaces)
	}
	pool, _ := ta.readyPool()
	att, ok := pool.Get(ipam.Key{ContainerID: "c1", IfName: "eth0"})
	if !ok || att.MAC != res.Interfaces[1].Mac || att.K8sName != "c1" || att.K8sNamespace != "default" {
		t.Errorf("recorded attachment = %+v, %v", att, ok)
	}
}

func TestAddErrorCodes(t *testing.T) {
	for _, tc := range []struct {
		name  string
		setup func(t *testing.T, ta *testAgent) *apiv1.CNIRequest
		want  uint32
	}{
		{"malformed config", func(t *testing.T, ta *testAgent) *apiv1.CNIRequest {
			r := req("c1", ta.netns("/ns/1"))
			r.Config = []byte(`{"cniVersion": `)
			return r
		}, errDecoding},
		{"no cniVersion", func(t *testing.T, ta *testAgent) *apiv1.CNIRequest {
			r := req("c1", ta.netns("/ns/1"))
			r.Config = []byte(`{"name":"onc","type":"onc"}`)
			return r
		}, errInvalidConfig},
		{"agent not ready", func(t *testing.T, ta *testAgent) *apiv1.CNIRequest { return req("c1", ta.netns("/ns/1")) }, errTryAgainLater},
		{"attachment exists", func(t *testing.T, ta *testAgent) *apiv1.CNIRequest { // c1's must stay
			ta.bringUp(t, "10.244.7.0/24")
			ta.mustAdd(t, "c1", "/ns/1")
			return req("c1", ta.netns("/ns/1"))
		}, ErrAttachmentExists},
		{"interface exists in the container", func(t *testing.T, ta *testAgent) *apiv1.CNIRequest {
			ta.bringUp(t, "10.244.7.0/24")
			ta.mustAdd(t, "c1", "/ns/1")
			return req("c2", ta.netns("/ns/1")) // another container, same netns and eth0
		}, ErrAttachmentExists},
		{"pool exhausted", func(t *testing.T, ta *testAgent) *apiv1.CNIRequest {
			ta.bringUp(t, "10.244.7.0/30") // one address besides the gateway
			ta.mustAdd(t, "c1", "/ns/1")
			return req("c2", ta.netns("/ns/2"))
		}, ErrPoolExhausted},
		{"no such netns", func(t *testing.T, ta *testAgent) *apiv1.CNIRequest {
			ta.bringUp(t, "10.244.7.0/24")
			return req("c1", "/ns/missing")
		}, errUnknownContainer},
		{"datapath failure", func(t *testing.T, ta *testAgent) *apiv1.CNIRequest {
			ta.bringUp(t, "10.244.7.0/24")
			ta.dp.setFail("AttachPod", errors.New("netlink: operation not permitted"))
			return req("c1", ta.netns("/ns/1"))
		}, ErrInternal},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ta := newTestAgent(t)
			r := tc.setup(t, ta)
			resp, err := ta.cni.Add(ctx(t), r)
			if got := code(t, resp, err); got != tc.want {
				t.Fatalf("code %d (%v), want %d", got, resp.Error, tc.want)
			}
			if tc.name != "attachment exists" && ta.pool != nil {
				if left := ta.leftovers(t, r.ContainerId); len(left) > 0 {
					t.Errorf("a failed ADD left %v behind", left)
				}
			}
		})
	}
}

// A failed ADD leaves nothing behind, whichever step fails.
func TestAddRollsBackEveryStep(t *testing.T) {
	for _, tc := range []struct {
		name    string
		breakIt func(ta *testAgent)
	}{
		{"interface creation fails", func(ta *testAgent) { ta.dp.setFail("AttachPod", errors.New("boom")) }},
		{"fast path registration fails after the veth exists", func(ta *testAgent) {
			ta.dp.setFail("AttachPod.partial", errors.New("map full"))
		}},
		{"recording the MAC fails", func(ta *testAgent) {
			// The state file is replaced by a directory while the interface
			// is made, so recording the MAC cannot write it; rollback mends
			// it first, as an operator freeing the disk would.
			ta.dp.hook["AttachPod"] = func(datapath.Pod) {
				os.Remove(ta.stateFile())
				os.MkdirAll(filepath.Join(ta.stateFile(), "blocker"), 0o700)
			}
			ta.dp.hook["DetachPod"] = func(datapath.Pod) { os.RemoveAll(ta.stateFile()) }
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ta := newTestAgent(t)
			ta.bringUp(t, "10.244.7.0/30") // one pod address: a leaked one blocks the next ADD
			tc.breakIt(ta)
			if _, c := ta.add(t, "c1", "/ns/1"); c != ErrInternal {
				t.Fatalf("code %d, want %d", c, ErrInternal)
			}
			if left := ta.leftovers(t, "c1"); len(left) > 0 {
				t.Fatalf("the failed ADD left %v behind", left)
			}
			// The one address is free again: the next pod gets it.
			ta.dp.setFail("AttachPod", nil)
			ta.dp.setFail("AttachPod.partial", nil)
			ta.dp.hook = map[string]func(datapath.Pod){}
			r := ta.mustAdd(t, "c2", "/ns/2")
			if !strings.Contains(string(r.Result), `"10.244.7.2/32"`) {
				t.Errorf("ADD after rollback got %s, want the one address 10.244.7.2", r.Result)
			}
		})
	}
}

func TestDelIsIdempotent(t *testing.T) {
	ta := newTestAgent(t)
	if r, err := ta.cni.Del(ctx(t), req("c1", "/ns/1")); code(t, r, err) != errTryAgainLater {
		t.Errorf("DEL before the pod state is loaded: %v, want code %d", r.Error, errTryAgainLater)
	}
	ta.bringUp(t, "10.244.7.0/24")
	ta.mustAdd(t, "c1", "/ns/1")
	for i, r := range []*apiv1.CNIRequest{
		req("c1", "/ns/1"),
		req("c1", "/ns/1"),     // again
		req("c1", ""),          // the runtime lost the netns
		req("never-added", ""), // never known
	} {
		resp, err := ta.cni.Del(ctx(t), r)
		if c := code(t, resp, err); c != 0 {
			t.Errorf("DEL %d (%s): code %d %v", i, r.ContainerId, c, resp.Error)
		}
	}
	if left := ta.leftovers(t, "c1"); len(left) > 0 {
		t.Errorf("DEL left %v", left)
	}
	if r, err := ta.cni.Del(ctx(t), &apiv1.CNIRequest{ContainerId: "c1", Ifname: "eth0", Config: []byte("{")}); code(t, r, err) != errDecoding {
		t.Errorf("DEL with a malformed config: %v", r.Error)
	}
}

// A DEL whose interface cannot be removed keeps the address, so the retry
// finds everything again.
func TestDelKeepsTheAddressWhenTheInterfaceStays(t *testing.T) {
	ta := newTestAgent(t)
	ta.bringUp(t, "10.244.7.0/24")
	ta.mustAdd(t, "c1", "/ns/1")
	ta.dp.setFail("DetachPod", errors.New("device busy"))
	if r, err := ta.cni.Del(ctx(t), req("c1", "/ns/1")); code(t, r, err) != ErrInternal {
		t.Fatalf("DEL with a stuck interface: %v", r.Error)
	}
	if left := ta.leftovers(t, "c1"); len(left) != 3 {
		t.Fatalf("after a failed DEL: %v, want the address, its record and the interface", left)
	}
	ta.dp.setFail("DetachPod", nil)
	if r, err := ta.cni.Del(ctx(t), req("c1", "/ns/1")); code(t, r, err) != 0 {
		t.Fatalf("retried DEL: %v", r.Error)
	}
	if left := ta.leftovers(t, "c1"); len(left) > 0 {
		t.Errorf("retried DEL left %v", left)
	}
}

// checkReq is a CHECK request whose prevResult is prev ("" for none).
func checkReq(container, netns, prev string) *apiv1.CNIRequest {
	r := req(container, netns)
	if prev != "" {
		r.Config = []byte(fmt.Sprintf(`{"cniVersion":"1.1.0","name":"onc","type":"onc","prevResult":%s}`, prev))
	}
	return r
}

func TestCheck(t *testing.T) {
	ta := newTestAgent(t)
	if r, err := ta.cni.Check(ctx(t), checkReq("c1", "/ns/1", `{"ips":[{"address":"10.244.7.2/32"}]}`)); code(t, r, err) != errTryAgainLater {
		t.Errorf("CHECK before ready: %v", r.Error)
	}
	ta.bringUp(t, "10.244.7.0/24")
	prev := string(ta.mustAdd(t, "c1", "/ns/1").Result)
	otherIP := strings.Replace(prev, "10.244.7.2/32", "10.244.7.99/32", 1)
	for _, tc := range []struct {
		name    string
		req     *apiv1.CNIRequest
		breakIt func()
		want    uint32
	}{
		{"as added", checkReq("c1", "/ns/1", prev), nil, 0},
		{"unknown attachment", checkReq("c9", "/ns/1", prev), nil, ErrCheckFailed},
		{"no prevResult", checkReq("c1", "/ns/1", ""), nil, errInvalidConfig},
		{"malformed prevResult", checkReq("c1", "/ns/1", `{"ips":"nope"}`), nil, errDecoding},
		{"prevResult lacks the pod's address", checkReq("c1", "/ns/1", otherIP), nil, ErrCheckFailed},
		{"interface changed", checkReq("c1", "/ns/1", prev), func() {
			ta.dp.broken[datapath.HostIfaceName("c1", "eth0")] = "pod interface eth0 has MTU 9000, want 1450"
		}, ErrCheckFailed},
		{"netns gone", checkReq("c1", "/ns/1", prev), func() { delete(ta.dp.netns, "/ns/1") }, errUnknownContainer},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.breakIt != nil {
				ta.dp.mu.Lock()
				tc.breakIt()
				ta.dp.mu.Unlock()
			}
			r, err := ta.cni.Check(ctx(t), tc.req)
			if got := code(t, r, err); got != tc.want {
				t.Errorf("code %d (%v), want %d", got, r.Error, tc.want)
			}
		})
	}
}

func TestStatusFollowsReadiness(t *testing.T) {
	ta := newTestAgent(t)
	status := func() uint32 {
		r, err := ta.cni.Status(ctx(t), &apiv1.CNIRequest{Config: []byte(conf)})
		return code(t, r, err)
	}
	if c := status(); c != errNotAvailable {
		t.Errorf("STATUS before the node is up: %d, want %d", c, errNotAvailable)
	}
	// Up, but its first peer sync fails: not ready yet.
	ta.dp.setFail("SyncPeers", errors.New("netlink: no buffer space"))
	ta.addNode(t, self, "192.0.2.1", "10.244.7.0/24", false)
	if err := ta.store.PutClusterConfig(ctx(t), datastore.ClusterConfig{Pools: []datastore.Pool{{CIDR: netip.MustParsePrefix("10.244.0.0/16"), NodePrefixLen: 24}}}); err != nil {
		t.Fatal(err)
	}
	if err := ta.reconcile(ctx(t), true); err == nil {
		t.Fatal("the failed peer sync was not reported")
	}
	if c := status(); c != errNotAvailable {
		t.Errorf("STATUS before the first peer sync: %d, want %d", c, errNotAvailable)
	}
	ta.dp.setFail("SyncPeers", nil)
	if err := ta.reconcile(ctx(t), false); err != nil {
		t.Fatal(err)
	}
	if c := status(); c != 0 {
		t.Errorf("STATUS when ready: %d", c)
	}
	if r, err := ta.cni.Status(ctx(t), &apiv1.CNIRequest{Config: []byte("{")}); code(t, r, err) != errDecoding {
		t.Errorf("STATUS with a malformed config: %v", r.Error)
	}
}

func gcReq(valid ...string) *apiv1.CNIRequest {
	keys := make([]ipam.Key, 0, len(valid))
	for _, c := range valid {
		keys = append(keys, ipam.Key{ContainerID: c, IfName: "eth0"})
	}
	b, _ := json.Marshal(map[string]any{"cniVersion": "1.1.0", "name": "onc", "type": "onc", "cni.dev/valid-attachments": keys})
	return &apiv1.CNIRequest{Config: b}
}

func TestGC(t *testing.T) {
	ta := newTestAgent(t)
	if r, err := ta.cni.GC(ctx(t), gcReq()); code(t, r, err) != errTryAgainLater {
		t.Errorf("GC before the pod state is loaded: %v", r.Error)
	}
	ta.bringUp(t, "10.244.7.0/24")
	for i, c := range []string{"keep1", "stale1", "keep2", "stale2", "stuck"} {
		ta.mustAdd(t, c, fmt.Sprintf("/ns/%d", i))
	}
	stuck := datapath.HostIfaceName("stuck", "eth0")
	ta.dp.hook["DetachPod"] = func(p datapath.Pod) {
		if p.HostIface == stuck {
			ta.dp.fail["DetachPod"] = errors.New("device busy")
		} else {
			delete(ta.dp.fail, "DetachPod")
		}
	}
	r, err := ta.cni.GC(ctx(t), gcReq("keep1", "keep2"))
	if c := code(t, r, err); c != ErrInternal || !strings.Contains(r.Error.Details, "stuck") {
		t.Fatalf("GC with one stuck attachment: code %d %v, want %d naming it", c, r.Error, ErrInternal)
	}
	for c, want := range map[string]bool{"keep1": true, "keep2": true, "stale1": false, "stale2": false, "stuck": true} {
		if left := len(ta.leftovers(t, c)) > 0; left != want {
			t.Errorf("%s: still there = %v, want %v", c, left, want)
		}
	}
	ta.dp.hook = map[string]func(datapath.Pod){}
	ta.dp.setFail("DetachPod", nil)
	if r, err := ta.cni.GC(ctx(t), gcReq("keep1", "keep2")); code(t, r, err) != 0 {
		t.Fatalf("second GC: %v", r.Error)
	}
	if n := ta.dp.podCount(); n != 2 {
		t.Errorf("%d pods after GC, want the 2 valid ones", n)
	}
}

// A restarted agent takes over the pods it had.
func TestBringUpAdoptsPods(t *testing.T) {
	ta := newTestAgent(t)
	ta.bringUp(t, "10.244.7.0/24")
	ta.mustAdd(t, "c1", "/ns/1")
	cfg := ta.cfg
	again, err := New(cfg, ta.store, ta.parts())
	if err != nil {
		t.Fatal(err)
	}
	if again.vtepMAC.String() != ta.vtepMAC.String() {
		t.Errorf("VTEP MAC changed across a restart: %s → %s", ta.vtepMAC, again.vtepMAC)
	}
	if err := again.reconcile(ctx(t), false); err != nil {
		t.Fatal(err)
	}
	host := datapath.HostIfaceName("c1", "eth0")
	if !ta.dp.adopted[host] {
		t.Errorf("the restarted agent did not adopt %s", host)
	}
	pool, reason := again.readyPool()
	if reason != "" || len(pool.List()) != 1 {
		t.Errorf("restarted agent: ready=%q, %d pods", reason, len(pool.List()))
	}
}

// A node that comes back with another pod CIDR (its old one was freed
// while it was away) drops the attachments outside it, interfaces too.
func TestBringUpDropsPodsOutsideANewCIDR(t *testing.T) {
	ta := newTestAgent(t)
	ta.bringUp(t, "10.244.7.0/24")
	ta.mustAdd(t, "c1", "/ns/1")
	if err := ta.store.ReleaseCIDR(ctx(t), self); err != nil {
		t.Fatal(err)
	}
	if _, err := datastore.ClaimCIDR(ctx(t), ta.store, self, netip.MustParsePrefix("10.244.9.0/24")); err != nil {
		t.Fatal(err)
	}
	again, err := New(ta.cfg, ta.store, ta.parts())
	if err != nil {
		t.Fatal(err)
	}
	if err := again.reconcile(ctx(t), true); err != nil {
		t.Fatal(err)
	}
	if n := ta.dp.podCount(); n != 0 {
		t.Errorf("%d pod interfaces left of the old CIDR", n)
	}
	if pool, reason := again.readyPool(); reason != "" || len(pool.List()) != 0 {
		t.Errorf("restarted agent: ready=%q, %d attachments, want none", reason, len(pool.List()))
	}
}

// Found by FuzzCNIRequest: ADD in a cniVersion no result can be rendered
// in (".1.0") made the pod, then failed (999) and left its address and
// interface behind. Such a configuration is refused before anything.
func TestAddInAnUnsupportedVersionMakesNothing(t *testing.T) {
	ta := newReadyAgent(t)
	r := req("c1", ta.netns("/ns/1"))
	r.Config = []byte(`{"cniVersion":".1.0","name":"onc","type":"onc"}`)
	if resp, err := ta.cni.Add(ctx(t), r); code(t, resp, err) != errIncompatibleVersion {
		t.Fatalf("ADD in cniVersion .1.0: %v, want code %d", resp.Error, errIncompatibleVersion)
	}
	if left := ta.leftovers(t, "c1"); len(left) > 0 {
		t.Fatalf("the refused ADD left %v behind", left)
	}
}

// Found by FuzzCNIRequest: GC without cni.dev/valid-attachments took every
// attachment for stale and removed it. JSON null, which libcni sends for
// no valid attachment, is still an empty list.
func TestGCNeedsValidAttachments(t *testing.T) {
	ta := newReadyAgent(t)
	ta.mustAdd(t, "c1", "/ns/1")
	resp, err := ta.cni.GC(ctx(t), &apiv1.CNIRequest{Config: []byte(conf)})
	if code(t, resp, err) != errInvalidConfig || !strings.Contains(resp.Error.Msg, "cni.dev/valid-attachments") {
		t.Fatalf("GC without valid attachments: %v, want code %d naming the field", resp.Error, errInvalidConfig)
	}
	if left := ta.leftovers(t, "c1"); len(left) != 3 {
		t.Fatalf("after the refused GC: %v, want the pod whole", left)
	}
	resp, err = ta.cni.GC(ctx(t), &apiv1.CNIRequest{Config: confWith(map[string]any{"cni.dev/valid-attachments": nil})})
	if c := code(t, resp, err); c != 0 {
		t.Fatalf("GC with null valid attachments: %v", resp.Error)
	}
	if left := ta.leftovers(t, "c1"); len(left) > 0 {
		t.Fatalf("GC with none valid left %v", left)
	}
}

// Found by FuzzCNIArgs: CNI_ARGS was read loosely (a pair without "=",
// only a name, a name given twice, a namespace with "/"), so a pod could
// be keyed as another ("a/b" + "c" and "a" + "b/c"), or as one ADD would
// wait on policy for in vain.
func TestAddRejectsMalformedCNIArgs(t *testing.T) {
	ta := newReadyAgent(t)
	for _, args := range []string{
		"K8S_POD_NAME",
		"K8S_POD_NAME=",
		"K8S_POD_NAME=web",
		"K8S_POD_NAMESPACE=A;K8S_POD_NAME=web",
		"K8S_POD_NAMESPACE=a/b;K8S_POD_NAME=c",
		"K8S_POD_NAMESPACE=default;K8S_POD_NAME=web;K8S_POD_NAME=db",
	} {
		r := req("c1", ta.netns("/ns/1"))
		r.Args = args
		resp, err := ta.cni.Add(ctx(t), r)
		if code(t, resp, err) != errInvalidEnv || !strings.HasPrefix(resp.Error.Msg, "CNI_ARGS: ") {
			t.Errorf("CNI_ARGS %q: %v, want code %d naming CNI_ARGS", args, resp.Error, errInvalidEnv)
		}
		if left := ta.leftovers(t, "c1"); len(left) > 0 {
			t.Fatalf("the refused ADD left %v behind", left)
		}
	}
}

// Found by FuzzCNIRequest: the attachment's identity was taken as given,
// so DEL of container " " succeeded; the spec's checks (as skel makes
// them) now apply to every verb that has one.
func TestVerbsRejectMalformedAttachments(t *testing.T) {
	ta := newReadyAgent(t)
	for _, tc := range []struct {
		verb                     func(context.Context, *apiv1.CNIRequest) (*apiv1.CNIResponse, error)
		container, netns, ifname string
		variable                 string
	}{
		{ta.cni.Del, " ", "", "eth0", "CNI_CONTAINERID"},
		{ta.cni.Add, "", "/ns/1", "eth0", "CNI_CONTAINERID"},
		{ta.cni.Add, "c1", "/ns/1", "", "CNI_IFNAME"},
		{ta.cni.Add, "c1", "/ns/1", "eth0/1", "CNI_IFNAME"},
		{ta.cni.Add, "c1", "/ns/1", "a-very-long-ifname", "CNI_IFNAME"},
		{ta.cni.Add, "c1", "ns/1", "eth0", "CNI_NETNS"},
		{ta.cni.Check, "c1", "", "eth0", "CNI_NETNS"},
	} {
		r := &apiv1.CNIRequest{ContainerId: tc.container, Netns: tc.netns, Ifname: tc.ifname, Config: []byte(conf)}
		resp, err := tc.verb(ctx(t), r)
		if code(t, resp, err) != errInvalidEnv || !strings.HasPrefix(resp.Error.Msg, tc.variable) {
			t.Errorf("container %q, netns %q, ifname %q: %v, want code %d naming %s", tc.container, tc.netns, tc.ifname, resp.Error, errInvalidEnv, tc.variable)
		}
	}
	if n := ta.dp.podCount(); n != 0 {
		t.Errorf("%d pod interfaces made", n)
	}
}

// CHECK, STATUS and GC came in CNI 0.4.0, 1.1.0 and 1.1.0: a configuration
// of an earlier version is refused as the spec says (1).
func TestVerbsNeedTheirCNIVersion(t *testing.T) {
	ta := newReadyAgent(t)
	ta.mustAdd(t, "c1", "/ns/1")
	for _, tc := range []struct {
		verb    func(context.Context, *apiv1.CNIRequest) (*apiv1.CNIResponse, error)
		name    string
		version string
	}{
		{ta.cni.Check, "CHECK", "0.3.1"},
		{ta.cni.Status, "STATUS", "1.0.0"},
		{ta.cni.GC, "GC", "1.0.0"},
	} {
		r := req("c1", "/ns/1")
		r.Config = confWith(map[string]any{"cniVersion": tc.version, "cni.dev/valid-attachments": []ipam.Key{},
			"prevResult": map[string]any{"ips": []map[string]any{{"version": "4", "address": "10.244.7.2/32"}}}})
		resp, err := tc.verb(ctx(t), r)
		if code(t, resp, err) != errIncompatibleVersion || !strings.Contains(resp.Error.Msg, tc.name) {
			t.Errorf("%s in cniVersion %s: %v, want code %d", tc.name, tc.version, resp.Error, errIncompatibleVersion)
		}
	}
	if left := ta.leftovers(t, "c1"); len(left) != 3 {
		t.Errorf("after refused verbs: %v, want the pod whole", left)
	}
}

// hostPorts (the portMappings capability) are checked field by field and
// recorded with the attachment, where the services watcher finds them and
// a restarted agent too; a bad one fails ADD naming it, leaving nothing.
func TestAddHostPorts(t *testing.T) {
	withPorts := func(ports ...map[string]any) []byte {
		return confWith(map[string]any{"runtimeConfig": map[string]any{"portMappings": ports}})
	}
	ta := newTestAgent(t)
	ta.bringUp(t, "10.244.7.0/24")
	r := req("c1", ta.netns("/ns/1"))
	r.Config = withPorts(map[string]any{"hostPort": 8080, "containerPort": 80, "protocol": "tcp"},
		map[string]any{"hostPort": 5353, "containerPort": 53, "protocol": "UDP", "hostIP": "192.0.2.1"},
		map[string]any{"hostPort": 9090, "containerPort": 90, "hostIP": "0.0.0.0"},
		map[string]any{"hostPort": 9191, "containerPort": 91, "hostIP": "fd00::1"},
		map[string]any{"hostPort": 9292, "containerPort": 92, "hostIP": "::"})
	if resp, err := ta.cni.Add(ctx(t), r); code(t, resp, err) != 0 {
		t.Fatalf("ADD with hostPorts: %v", resp.Error)
	}
	pool, _ := ta.readyPool()
	att, _ := pool.Get(ipam.Key{ContainerID: "c1", IfName: "eth0"})
	want := []ipam.PortMapping{{HostPort: 8080, ContainerPort: 80, Protocol: "tcp"},
		{HostPort: 5353, ContainerPort: 53, Protocol: "udp", HostIP: netip.MustParseAddr("192.0.2.1")},
		{HostPort: 9090, ContainerPort: 90, Protocol: "tcp", HostIP: netip.IPv4Unspecified()},
		{HostPort: 9191, ContainerPort: 91, Protocol: "tcp", HostIP: netip.MustParseAddr("fd00::1")},
		{HostPort: 9292, ContainerPort: 92, Protocol: "tcp", HostIP: netip.IPv6Unspecified()}}
	if !reflect.DeepEqual(att.PortMappings, want) {
		t.Fatalf("recorded hostPorts %+v, want %+v", att.PortMappings, want)
	}
	reopened, _, err := ipam.Open(ta.stateFile(), []netip.Prefix{netip.MustParsePrefix("10.244.7.0/24")})
	if err != nil {
		t.Fatal(err)
	}
	if again, _ := reopened.Get(att.Key); !reflect.DeepEqual(again.PortMappings, want) {
		t.Fatalf("after a restart: %+v", again.PortMappings)
	}

	for _, bad := range []struct {
		mapping map[string]any
		field   string
	}{
		{map[string]any{"hostPort": 0, "containerPort": 80}, "portMappings[0]: hostPort 0"},
		{map[string]any{"hostPort": 80, "containerPort": 70000}, "containerPort 70000"},
		{map[string]any{"hostPort": 80, "containerPort": 80, "protocol": "sctp"}, `protocol "sctp"`},
		{map[string]any{"hostPort": 80, "containerPort": 80, "hostIP": "host"}, `hostIP "host"`},
	} {
		r := req("c2", ta.netns("/ns/2"))
		r.Config = withPorts(bad.mapping)
		resp, err := ta.cni.Add(ctx(t), r)
		if code(t, resp, err) != errInvalidConfig || !strings.Contains(resp.Error.Msg, bad.field) {
			t.Errorf("ADD with %v: %v, want code %d naming %q", bad.mapping, resp.Error, errInvalidConfig, bad.field)
		}
		if left := ta.leftovers(t, "c2"); len(left) > 0 {
			t.Errorf("a refused ADD left %v behind", left)
		}
	}
}
