package agent

// Fuzz targets for the CNI API: the network configuration, CNI_ARGS, and
// every verb end to end on the fake datapath (hack/fuzz.sh runs each; the
// seeds and testdata/fuzz run with the unit tests). Malformed input must
// get its own CNI error and leave nothing behind.

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/utils"
	"github.com/containernetworking/cni/pkg/version"
	"github.com/onc-net/onc/agent/ipam"
	apiv1 "github.com/onc-net/onc/api/v1"
	"github.com/onc-net/onc/datapath"
	"github.com/onc-net/onc/datastore"
	"google.golang.org/protobuf/proto"
	"k8s.io/apimachinery/pkg/util/validation"
)

// stubStore is the datastore as bring-up reads it. Anything else panics
// (the embedded interface is nil): no CNI or onctl handler fuzzed here
// may need it.
type stubStore struct{ datastore.Store }

func (stubStore) ClusterConfig(context.Context) (datastore.ClusterConfig, error) {
	return datastore.ClusterConfig{Pools: []datastore.Pool{{CIDR: netip.MustParsePrefix("10.244.0.0/16"), NodePrefixLen: 24}}}, nil
}

// fuzzCIDR is the pod CIDR of newReadyAgent's node.
var fuzzCIDR = netip.MustParsePrefix("10.244.7.0/24")

// newReadyAgent is a ready agent on the fake datapath without etcd, cheap
// enough for every fuzz worker to make its own.
func newReadyAgent(tb testing.TB, edit ...func(*Config)) *testAgent {
	tb.Helper()
	ta := newAgentOn(tb, stubStore{}, edit...)
	cc, _ := stubStore{}.ClusterConfig(context.Background())
	if err := ta.Agent.bringUp(cc, []netip.Prefix{fuzzCIDR}); err != nil {
		tb.Fatal(err)
	}
	ta.setNotReady("")
	return ta
}

// confWith is the test configuration with extra top-level fields.
func confWith(fields map[string]any) []byte {
	m := map[string]any{"cniVersion": "1.1.0", "name": "onc", "type": "onc"}
	maps.Copy(m, fields)
	b, err := json.Marshal(m)
	if err != nil {
		panic(err)
	}
	return b
}

// FuzzNetConf: a network configuration either parses into one whose
// cniVersion ADD can answer in, or gets 6 exactly when it does not
// decode, or 7 or 1 naming cniVersion.
func FuzzNetConf(f *testing.F) {
	for _, seed := range []string{
		conf,
		`{"cniVersion":"0.3.1","name":"onc","type":"onc"}`,
		`{"cniVersion":"1.0.0","name":"onc","plugins":[{"type":"onc","agentSocket":"/var/run/onc/cni.sock"}]}`,
		`{"cniVersion":"0.4.0","name":"onc","type":"onc","prevResult":{"ips":[{"address":"10.244.7.2/32"}]}}`,
		`{"cniVersion":"1.1.0","name":"onc","type":"onc","cni.dev/valid-attachments":[{"containerID":"c1","ifname":"eth0"}]}`,
		`{"cniVersion":"9.9.9","name":"onc","type":"onc"}`,
		`{"name":"onc","type":"onc"}`,
		`{"cniVersion":1}`,
		`{"cniVersion": `,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		c, bad := parseConf(raw)
		var shape netConf
		decodeErr := json.Unmarshal(raw, &shape)
		if bad != nil {
			e := bad.Error
			switch {
			case (e.Code == errDecoding) != (decodeErr != nil):
				t.Fatalf("code %d (%s), but decoding says %v", e.Code, e.Msg, decodeErr)
			case e.Code != errDecoding && e.Code != errInvalidConfig && e.Code != errIncompatibleVersion:
				t.Fatalf("code %d (%s): want %d, %d or %d", e.Code, e.Msg, errDecoding, errInvalidConfig, errIncompatibleVersion)
			case e.Code != errDecoding && !strings.Contains(e.Msg, "cniVersion"):
				t.Fatalf("code %d without naming cniVersion: %s", e.Code, e.Msg)
			}
			return
		}
		if decodeErr != nil {
			t.Fatalf("accepted a configuration that does not decode: %v", decodeErr)
		}
		// ADD answers in this version: a result renders in it and reads back.
		gw, podIdx := net.IPv4(10, 244, 7, 1), 1
		res := &current.Result{CNIVersion: current.ImplementedSpecVersion, Interfaces: []*current.Interface{{Name: "eth0"}},
			IPs: []*current.IPConfig{{Interface: &podIdx, Address: net.IPNet{IP: net.IPv4(10, 244, 7, 2), Mask: net.CIDRMask(32, 32)}, Gateway: gw}}}
		out, err := res.GetAsVersion(c.CNIVersion)
		if err != nil {
			t.Fatalf("accepted cniVersion %q, in which no result can be rendered: %v", c.CNIVersion, err)
		}
		b, err := json.Marshal(out)
		if err == nil {
			_, err = version.NewResult(c.CNIVersion, b)
		}
		if err != nil {
			t.Fatalf("a %s result does not read back: %v", c.CNIVersion, err)
		}
	})
}

// FuzzCNIArgs: CNI_ARGS either names no pod or one pod, both namespace and
// name as given, each a Kubernetes name, so that "namespace/name" keys
// exactly that pod; else an error naming CNI_ARGS.
func FuzzCNIArgs(f *testing.F) {
	for _, seed := range []string{
		"",
		"K8S_POD_NAMESPACE=default;K8S_POD_NAME=web",
		"IgnoreUnknown=1;K8S_POD_NAMESPACE=lab;K8S_POD_NAME=onclab-n1-p1;K8S_POD_INFRA_CONTAINER_ID=0cd6601b7750;K8S_POD_UID=7c4e-11",
		"IgnoreUnknown=1",
		"K8S_POD_NAME=web",
		"K8S_POD_NAMESPACE=a/b;K8S_POD_NAME=c",
		"K8S_POD_NAMESPACE=default;K8S_POD_NAME=web;K8S_POD_NAME=db",
		"K8S_POD_NAMESPACE=default;K8S_POD_NAME=web;",
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, args string) {
		ns, name, err := k8sArgs(args)
		if err != nil {
			if !strings.HasPrefix(err.Error(), "CNI_ARGS: ") {
				t.Fatalf("error without naming CNI_ARGS: %v", err)
			}
			return
		}
		if (ns == "") != (name == "") {
			t.Fatalf("namespace %q, name %q: a pod needs both", ns, name)
		}
		if ns == "" {
			for _, kv := range strings.Split(args, ";") {
				if k, _, _ := strings.Cut(kv, "="); k == "K8S_POD_NAMESPACE" || k == "K8S_POD_NAME" {
					t.Fatalf("%q names a pod, but none was read", args)
				}
			}
			return
		}
		// The key splits back into what was given: no other pod shares it.
		if n, m, _ := strings.Cut(ns+"/"+name, "/"); n != ns || m != name {
			t.Fatalf("namespace %q, name %q: key %s/%s is another pod's too", ns, name, ns, name)
		}
		if errs := append(validation.IsDNS1123Label(ns), validation.IsDNS1123Subdomain(name)...); len(errs) > 0 {
			t.Fatalf("namespace %q, name %q: Kubernetes has no such pod: %v", ns, name, errs)
		}
		// Every pair that names the pod says exactly this.
		for _, kv := range strings.Split(args, ";") {
			k, v, _ := strings.Cut(kv, "=")
			if (k == "K8S_POD_NAMESPACE" && v != ns) || (k == "K8S_POD_NAME" && v != name) {
				t.Fatalf("%q: read %s/%s, but it also says %s", args, ns, name, kv)
			}
		}
	})
}

// FuzzCNIRequest sends one request of any verb, with any fields, to a
// ready agent on the fake datapath that holds one pod. The answer is an
// in-band CNI result, in time; an error names the variable or field and
// leaves the pods, their addresses (in memory and on disk) and their
// interfaces as they were; a success did what its verb says.
func FuzzCNIRequest(f *testing.F) {
	ta := newReadyAgent(f)
	resident := ta.addResident(f)
	prev := json.RawMessage(resident.Result)
	valid := []byte(conf)
	for _, s := range []struct {
		verb                           uint8
		container, netns, ifname, args string
		config                         []byte
	}{
		{fuzzAdd, "c1", "/ns/c1", "eth0", "K8S_POD_NAMESPACE=default;K8S_POD_NAME=c1", valid},
		{fuzzAdd, "c1", "/ns/c1", "eth0", "IgnoreUnknown=1;K8S_POD_NAMESPACE=lab;K8S_POD_NAME=p1;K8S_POD_UID=1", []byte(`{"cniVersion":"0.3.1","name":"onc","type":"onc"}`)},
		{fuzzAdd, "c1", "/ns/c1", "eth0", "", []byte(`{"cniVersion":"9.9.9","name":"onc","type":"onc"}`)},
		{fuzzAdd, "c1", "ns/c1", "eth0", "", valid},
		{fuzzAdd, "c1", "/ns/c1", "eth0/1", "", valid},
		{fuzzAdd, "", "/ns/c1", "eth0", "", valid},
		{fuzzAdd, "c1", "/ns/c1", "eth0", "K8S_POD_NAME=c1", valid},
		{fuzzAdd, residentID, residentNetns, "eth0", "", valid},
		{fuzzAdd, "c2", residentNetns, "eth0", "", valid},
		{fuzzDel, residentID, residentNetns, "eth0", "", valid},
		{fuzzDel, "never-added", "", "eth0", "", valid},
		{fuzzDel, "c1", "", "", "", valid},
		{fuzzCheck, residentID, residentNetns, "eth0", "", confWith(map[string]any{"prevResult": prev})},
		{fuzzCheck, residentID, residentNetns, "eth0", "", valid},
		{fuzzCheck, residentID, residentNetns, "eth0", "", confWith(map[string]any{"prevResult": map[string]any{"ips": "nope"}})},
		{fuzzCheck, residentID, residentNetns, "eth0", "", []byte(`{"cniVersion":"0.3.1","name":"onc","type":"onc"}`)},
		{fuzzStatus, "", "", "", "", valid},
		{fuzzStatus, "", "", "", "", []byte(`{"cniVersion":"1.0.0","name":"onc","type":"onc"}`)},
		{fuzzGC, "", "", "", "", confWith(map[string]any{"cni.dev/valid-attachments": []ipam.Key{{ContainerID: residentID, IfName: "eth0"}}})},
		{fuzzGC, "", "", "", "", confWith(map[string]any{"cni.dev/valid-attachments": nil})},
		{fuzzGC, "", "", "", "", valid},
		{fuzzGC, "", "", "", "", confWith(map[string]any{"cni.dev/valid-attachments": []map[string]string{{"containerID": residentID}}})},
	} {
		f.Add(s.verb, s.container, s.netns, s.ifname, s.args, s.config)
	}
	f.Fuzz(func(t *testing.T, verb uint8, containerID, netns, ifname, args string, config []byte) {
		v := verb % fuzzVerbs
		req := &apiv1.CNIRequest{ContainerId: containerID, Netns: netns, Ifname: ifname, Args: args, Config: config}
		if _, err := proto.Marshal(req); err != nil {
			return // gRPC cannot carry it (a string not UTF-8): it never reaches the agent
		}
		if filepath.IsAbs(netns) {
			ta.netns(netns) // the runtime made it: the verb can act
		}
		before := ta.podState(t)
		c, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		start := time.Now()
		resp, err := ta.verb(v)(c, req)
		if took := time.Since(start); took > 2*time.Second {
			t.Fatalf("%s took %v", verbNames[v], took)
		}
		if err != nil || resp == nil {
			t.Fatalf("%s: gRPC error %v, response %v: CNI answers in band", verbNames[v], err, resp)
		}
		if e := resp.Error; e != nil {
			if after := ta.podState(t); !after.equal(before) {
				t.Fatalf("a failed %s (code %d: %s) changed the pods: %v, were %v", verbNames[v], e.Code, e.Msg, after, before)
			}
			checkCNIError(t, verbNames[v], e)
			return
		}
		ta.checkDone(t, v, req, before, resp)
	})
}

const (
	fuzzAdd uint8 = iota
	fuzzDel
	fuzzCheck
	fuzzStatus
	fuzzGC
	fuzzVerbs
)

// specSince is the cniVersion that brought a verb (ADD and DEL: all).
var specSince = map[uint8]string{fuzzCheck: "0.4.0", fuzzStatus: "1.1.0", fuzzGC: "1.1.0"}

var verbNames = [...]string{fuzzAdd: verbAdd, fuzzDel: verbDel, fuzzCheck: verbCheck, fuzzStatus: verbStatus, fuzzGC: verbGC}

func (ta *testAgent) verb(v uint8) func(context.Context, *apiv1.CNIRequest) (*apiv1.CNIResponse, error) {
	return [...]func(context.Context, *apiv1.CNIRequest) (*apiv1.CNIResponse, error){
		fuzzAdd: ta.cni.Add, fuzzDel: ta.cni.Del, fuzzCheck: ta.cni.Check, fuzzStatus: ta.cni.Status, fuzzGC: ta.cni.GC,
	}[v]
}

// The pod FuzzCNIRequest's agent holds, so DEL, CHECK and GC find one.
const (
	residentID    = "resident"
	residentNetns = "/ns/resident"
)

// addResident adds the resident pod (again, after a fuzzed DEL or GC
// removed it).
func (ta *testAgent) addResident(tb testing.TB) *apiv1.CNIResponse {
	tb.Helper()
	r, err := ta.cni.Add(context.Background(), &apiv1.CNIRequest{ContainerId: residentID, Netns: ta.netns(residentNetns), Ifname: "eth0",
		Args: "K8S_POD_NAMESPACE=default;K8S_POD_NAME=resident", Config: []byte(conf)})
	if err != nil || r.Error != nil {
		tb.Fatalf("ADD of the resident pod: %v %v", err, r.GetError())
	}
	return r
}

// podState is what a CNI verb may change: the attachments (in memory and
// as stored) and the pod interfaces.
type podState struct {
	pool, stored map[ipam.Key]netip.Addr
	ifaces       []string // host interfaces, sorted
}

func (ta *testAgent) podState(t *testing.T) podState {
	t.Helper()
	pool, _ := ta.readyPool()
	st := podState{pool: addrs(pool.List())}
	stored, dropped, err := ipam.Open(ta.stateFile(), []netip.Prefix{fuzzCIDR})
	if err != nil || len(dropped) > 0 {
		t.Fatalf("stored attachments: %v, inconsistent: %v", err, dropped)
	}
	st.stored = addrs(stored.List())
	ta.dp.mu.Lock()
	st.ifaces = slices.Sorted(maps.Keys(ta.dp.pods))
	ta.dp.mu.Unlock()
	return st
}

func addrs(atts []ipam.Attachment) map[ipam.Key]netip.Addr {
	m := make(map[ipam.Key]netip.Addr, len(atts))
	for _, a := range atts {
		m[a.Key] = a.IPs[0]
	}
	return m
}

// without is s less the attachments gone says are gone, and their
// interfaces.
func (s podState) without(gone func(ipam.Key) bool) podState {
	out := podState{pool: maps.Clone(s.pool), stored: maps.Clone(s.stored)}
	maps.DeleteFunc(out.pool, func(k ipam.Key, _ netip.Addr) bool { return gone(k) })
	maps.DeleteFunc(out.stored, func(k ipam.Key, _ netip.Addr) bool { return gone(k) })
	goneIfaces := map[string]bool{}
	for k := range s.pool {
		if gone(k) {
			goneIfaces[datapath.HostIfaceName(k.ContainerID, k.IfName)] = true
		}
	}
	for _, iface := range s.ifaces {
		if !goneIfaces[iface] {
			out.ifaces = append(out.ifaces, iface)
		}
	}
	return out
}

func (s podState) equal(o podState) bool {
	return maps.Equal(s.pool, o.pool) && maps.Equal(s.stored, o.stored) && slices.Equal(s.ifaces, o.ifaces)
}

func (s podState) String() string {
	return fmt.Sprintf("attachments %v, stored %v, interfaces %v", s.pool, s.stored, s.ifaces)
}

// checkCNIError: a failure of a ready agent on a working datapath is the
// input's fault, so it has a specific code (never 999 or "try again"),
// and one for a bad variable or field names it.
func checkCNIError(t *testing.T, verb string, e *apiv1.CNIError) {
	t.Helper()
	switch {
	case e.Msg == "":
		t.Fatalf("%s: code %d without a message", verb, e.Code)
	case e.Code == errInvalidEnv && !strings.Contains(e.Msg, "CNI_"):
		t.Fatalf("%s: code %d without naming the variable: %s", verb, e.Code, e.Msg)
	case (e.Code == errInvalidConfig || e.Code == errIncompatibleVersion) && !strings.HasPrefix(e.Msg, "network configuration: "):
		t.Fatalf("%s: code %d without naming the configuration: %s", verb, e.Code, e.Msg)
	}
	switch e.Code {
	case errIncompatibleVersion, errInvalidEnv, errDecoding, errInvalidConfig, ErrAttachmentExists, ErrCheckFailed:
	default:
		t.Fatalf("%s: code %d (%s; %s) for a request a ready agent could have served or rejected as such", verb, e.Code, e.Msg, e.Details)
	}
}

// checkDone checks that a successful verb did what it says, then puts
// the agent back as it was for the next input.
func (ta *testAgent) checkDone(t *testing.T, v uint8, req *apiv1.CNIRequest, before podState, resp *apiv1.CNIResponse) {
	t.Helper()
	after := ta.podState(t)
	key := ipam.Key{ContainerID: req.ContainerId, IfName: req.Ifname}
	if v == fuzzAdd || v == fuzzDel || v == fuzzCheck {
		checkSpecIdentity(t, req, v != fuzzDel)
	}
	if since := specSince[v]; since != "" {
		var c types.NetConf
		_ = json.Unmarshal(req.Config, &c)
		if ok, _ := version.GreaterThanOrEqualTo(c.CNIVersion, since); !ok {
			t.Fatalf("%s succeeded in cniVersion %q, which has no %s", verbNames[v], c.CNIVersion, verbNames[v])
		}
	}
	switch v {
	case fuzzAdd:
		ip, ok := after.pool[key]
		if !ok || after.stored[key] != ip || len(after.pool) != len(before.pool)+1 || len(after.ifaces) != len(before.ifaces)+1 {
			t.Fatalf("ADD %s succeeded with %v, was %v", key, after, before)
		}
		checkAddResult(t, req.Config, resp.Result, ip)
		if r, err := ta.cni.Del(context.Background(), &apiv1.CNIRequest{ContainerId: key.ContainerID, Ifname: key.IfName, Config: []byte(conf)}); err != nil || r.Error != nil {
			t.Fatalf("DEL after ADD %s: %v %v", key, err, r.GetError())
		}
		if again := ta.podState(t); !again.equal(before) {
			t.Fatalf("ADD then DEL of %s left %v, was %v", key, again, before)
		}
		return
	case fuzzDel:
		if want := before.without(func(k ipam.Key) bool { return k == key }); !after.equal(want) {
			t.Fatalf("DEL %s left %v, want %v", key, after, want)
		}
	case fuzzGC:
		var fields map[string]json.RawMessage
		_ = json.Unmarshal(req.Config, &fields)
		if !slices.ContainsFunc(slices.Collect(maps.Keys(fields)), func(k string) bool { return strings.EqualFold(k, "cni.dev/valid-attachments") }) {
			t.Fatalf("GC without cni.dev/valid-attachments succeeded: it took every attachment for stale")
		}
		var c netConf
		_ = json.Unmarshal(req.Config, &c)
		if want := before.without(func(k ipam.Key) bool { return !slices.Contains(c.ValidAttachments.keys, k) }); !after.equal(want) {
			t.Fatalf("GC keeping %v left %v, want %v", c.ValidAttachments.keys, after, want)
		}
	case fuzzCheck, fuzzStatus:
		if !after.equal(before) {
			t.Fatalf("%s changed the pods: %v, were %v", verbNames[v], after, before)
		}
	}
	if _, ok := after.pool[ipam.Key{ContainerID: residentID, IfName: "eth0"}]; !ok {
		ta.addResident(t)
	}
}

// checkSpecIdentity: the attachment a verb acted on is one the spec allows,
// by the CNI library's own checks (those skel applies to the variables).
func checkSpecIdentity(t *testing.T, req *apiv1.CNIRequest, needNetns bool) {
	t.Helper()
	if e := utils.ValidateContainerID(req.ContainerId); e != nil {
		t.Fatalf("acted on container %q: %v", req.ContainerId, e)
	}
	if e := utils.ValidateInterfaceName(req.Ifname); e != nil {
		t.Fatalf("acted on interface %q: %v", req.Ifname, e)
	}
	if needNetns && !filepath.IsAbs(req.Netns) {
		t.Fatalf("acted on network namespace %q, not a path the agent can open", req.Netns)
	}
}

// checkAddResult: ADD's result is in the configuration's version and
// gives the pod its address.
func checkAddResult(t *testing.T, config, result []byte, ip netip.Addr) {
	t.Helper()
	var c types.NetConf
	if err := json.Unmarshal(config, &c); err != nil {
		t.Fatal(err)
	}
	r, err := version.NewResult(c.CNIVersion, result)
	if err == nil {
		r, err = r.GetAsVersion(current.ImplementedSpecVersion)
	}
	if err != nil {
		t.Fatalf("ADD result %s in version %q: %v", result, c.CNIVersion, err)
	}
	ips := r.(*current.Result).IPs
	if len(ips) != 1 || !ips[0].Address.IP.Equal(ip.AsSlice()) {
		t.Fatalf("ADD result gives %v, want %s", ips, ip)
	}
}
