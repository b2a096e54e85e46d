package policybench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/onc-net/onc/agent/policy"
	apiv1 "github.com/onc-net/onc/api/v1"
	"github.com/onc-net/onc/lab"
	"github.com/onc-net/onc/lab/bench"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
)

// CRROptions are the TCP_CRR measurement's.
type CRROptions struct {
	BinDir   string // onc, onc-agent, onc-controller, onc-lab
	KubeBin  string // kube-apiserver
	Netperf  string // directory holding netperf and netserver
	Prefix   string // the lab's name prefix
	Policies int    // NetworkPolicies in the "policy" configuration
	// ClusterPolicies are ClusterNetworkPolicies in the "policy"
	// configuration, beside the NetworkPolicies.
	ClusterPolicies int
	Reps            int
	Duration        time.Duration
	CPUs            string // netperf -T
	Log             io.Writer
}

// The configurations, and the names of the bench's objects: no policy or
// the policies, each through the slow path (the fast path off) and with
// the fast path on.
const (
	NoPolicy       = "no-policy"
	WithPolicy     = "policy"
	NoPolicyFast   = "no-policy-fast"
	WithPolicyFast = "policy-fast"

	benchNS     = "bench"
	peersNS     = "peers"
	policyLabel = "onc-bench"
	ctlPort     = 12865 // netperf's control connection
	dataPort    = 12866 // its data connections (netperf's -P)
)

// CRRSample is one netperf run.
type CRRSample struct {
	Rep    int     `json:"rep"`
	Config string  `json:"config"`
	Value  float64 `json:"transPerSec"`
	CPU    float64 `json:"cpuUsPerTrans"` // netperf's service demand, both ends on this machine
	// New connections the server's ingress rules allowed and denied during
	// the run (policy only): every one was judged against the ruleset.
	Allowed uint64 `json:"allowed,omitempty"`
	Denied  uint64 `json:"denied,omitempty"`
	// On the client's node during the run: packets its fast path sent
	// (egress_hit), connections it opened (egress_open) and flows it
	// learned from the slow path (learn_egress).
	FastHits    uint64 `json:"fastHits,omitempty"`
	FastOpens   uint64 `json:"fastOpens,omitempty"`
	FastLearned uint64 `json:"fastLearned,omitempty"`
	// Error: the run, or its check, failed (why).
	Error string `json:"error,omitempty"`
}

// CRRResult is the measurement.
type CRRResult struct {
	Date            string `json:"date"` // when it ended
	Policies        int    `json:"policies"`
	ClusterPolicies int    `json:"clusterPolicies,omitempty"`
	Reps            int    `json:"reps"`
	Duration        string `json:"duration"`
	CPUs            string `json:"cpus"`
	// Per configuration: median and range of transactions/s.
	NoPolicy       Stat `json:"noPolicy"`
	WithPolicy     Stat `json:"policy"`
	NoPolicyFast   Stat `json:"noPolicyFast"`
	WithPolicyFast Stat `json:"policyFast"`
	// Fast path on ÷ off of each repetition's adjacent runs, without and
	// with the policies.
	FastRatioNoPolicy bench.Stat `json:"fastRatioNoPolicy"`
	FastRatioPolicy   bench.Stat `json:"fastRatioPolicy"`
	// Ratio policy ÷ no policy of each repetition's two adjacent runs:
	// median and range; Cost is 1 - the median ratio, in %.
	Ratio       Stat        `json:"ratio"`
	RatioOfMeds float64     `json:"ratioOfMedians"`
	CostPercent float64     `json:"costPercent"`
	Samples     []CRRSample `json:"samples"`
	// Seconds from the first policy created to both agents enforcing all
	// of them, each time (API writes included).
	ProgramSeconds []float64 `json:"programSeconds"`
	// The server's ingress and the client's egress rules with the policies
	// in place, as the agents report them: NetworkPolicy rules, and
	// ClusterNetworkPolicy rules of the Admin tier.
	ServerRules      int    `json:"serverRules"`
	ClientRules      int    `json:"clientRules"`
	ServerAdminRules int    `json:"serverAdminRules,omitempty"`
	ClientAdminRules int    `json:"clientAdminRules,omitempty"`
	Error            string `json:"error,omitempty"`
}

// CRR brings up a 2-node lab in Kubernetes mode, a client pod on one node
// and a server pod on the other, and runs netperf TCP_CRR from client to
// server Reps times in each configuration: without and with the policies,
// ABBA… (the policies are created or deleted once per repetition), and in
// each, the fast path off and on, back to back (the first alternating).
// A fast-path run is checked to have taken it (the client node's fast path
// carried, opened or learned its connections), a slow one not (crrRun).
func CRR(ctx context.Context, o CRROptions) (res CRRResult, err error) {
	res = CRRResult{Policies: o.Policies, ClusterPolicies: o.ClusterPolicies, Reps: o.Reps, Duration: o.Duration.String(), CPUs: o.CPUs}
	l, err := lab.Up(ctx, lab.Options{Prefix: o.Prefix, BinDir: o.BinDir, Nodes: 2, NodeTimeout: time.Hour,
		Datastore: "kubernetes", KubeBin: o.KubeBin})
	if err != nil {
		return res, fmt.Errorf("lab: %w", err)
	}
	defer func() {
		if derr := l.Down(); derr != nil {
			err = errors.Join(err, fmt.Errorf("lab down: %w", derr))
		}
	}()
	kube, err := l.Kube()
	if err != nil {
		return res, err
	}
	dyn, err := dynamic.NewForConfig(l.APIServer.RESTConfig())
	if err != nil {
		return res, err
	}
	cnps := dyn.Resource(policy.CNPGroupVersion.WithResource(policy.CNPResource))
	for ns, labels := range map[string]map[string]string{benchNS: {"purpose": "bench"}, peersNS: {"team": "peers"}} {
		if err := l.SetNamespace(ctx, ns, labels); err != nil {
			return res, err
		}
	}
	clientNode, serverNode := l.Nodes[0], l.Nodes[1]
	client, err := l.AddPodSpec(ctx, clientNode, lab.PodSpec{Namespace: benchNS, Name: "client", Labels: map[string]string{"app": "client"}})
	if err != nil {
		return res, err
	}
	server, err := l.AddPodSpec(ctx, serverNode, lab.PodSpec{Namespace: benchNS, Name: "server", Labels: map[string]string{"app": "server"},
		Ports: []corev1.ContainerPort{
			{Name: "np-ctl", ContainerPort: ctlPort, Protocol: corev1.ProtocolTCP},
			{Name: "np-data", ContainerPort: dataPort, Protocol: corev1.ProtocolTCP},
		}})
	if err != nil {
		return res, err
	}
	// A few more pods for the policies' pod selectors to find, on both nodes.
	for i := 0; i < 4; i++ {
		if _, err := l.AddPodSpec(ctx, l.Nodes[i%2], lab.PodSpec{Namespace: peersNS, Name: fmt.Sprintf("peer-%d", i),
			Labels: map[string]string{"role": fmt.Sprintf("peer-%d", i%2)}}); err != nil {
			return res, err
		}
	}
	w := waiter{client: clientNode, server: serverNode, clientKey: client.Key(), serverKey: server.Key()}
	if _, err := w.wait(ctx, 0, 0); err != nil {
		return res, err
	}
	stop, err := bench.Netservers(o.Netperf, server.Netns)
	if err != nil {
		return res, err
	}
	defer stop()

	state := NoPolicy
	set := func(cfg string) error {
		if cfg == state {
			return nil
		}
		if cfg == WithPolicy {
			start := time.Now()
			if err := createPolicies(ctx, kube, cnps, o.Policies, o.ClusterPolicies); err != nil {
				return err
			}
			rules, err := w.wait(ctx, o.Policies, o.ClusterPolicies)
			if err != nil {
				return err
			}
			secs := rules.since.Sub(start).Seconds()
			res.ProgramSeconds = append(res.ProgramSeconds, secs)
			res.ServerRules, res.ClientRules, res.ServerAdminRules, res.ClientAdminRules = rules.server, rules.client, rules.serverAdmin, rules.clientAdmin
			fmt.Fprintf(o.Log, "  %d policies and %d cluster policies created and enforced on both nodes in %.1fs "+
				"(server ingress %d rules, %d admin; client egress %d rules, %d admin)\n",
				o.Policies, o.ClusterPolicies, secs, rules.server, rules.serverAdmin, rules.client, rules.clientAdmin)
		} else {
			err := kube.NetworkingV1().NetworkPolicies(benchNS).DeleteCollection(ctx, metav1.DeleteOptions{},
				metav1.ListOptions{LabelSelector: policyLabel + "=policy"})
			if err != nil {
				return fmt.Errorf("delete the policies: %w", err)
			}
			if err := cnps.DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{LabelSelector: policyLabel + "=policy"}); err != nil {
				return fmt.Errorf("delete the cluster policies: %w", err)
			}
			if _, err := w.wait(ctx, 0, 0); err != nil {
				return err
			}
		}
		state = cfg
		// Let the API server, its etcd and the agents settle.
		time.Sleep(3 * time.Second)
		return nil
	}
	var runs []bench.Sample // the values alone, for the paired ratios
	for rep := 0; rep < o.Reps; rep++ {
		order := []string{NoPolicy, WithPolicy}
		if rep%2 == 1 {
			order = []string{WithPolicy, NoPolicy}
		}
		for _, policyCfg := range order {
			if err := set(policyCfg); err != nil {
				return res, fmt.Errorf("rep %d, %s: %w", rep+1, policyCfg, err)
			}
			paths := []bool{false, true}
			if rep%2 == 1 {
				paths = []bool{true, false}
			}
			for _, fast := range paths {
				s, err := crrRun(ctx, o, l, w, client, server, policyCfg, fast)
				if cerr := ctx.Err(); cerr != nil {
					return res, cerr
				}
				s.Rep = rep + 1
				// A failed run or check is a sample with its reason, in no
				// median or ratio; the bench goes on.
				if err != nil {
					s.Error = err.Error()
					fmt.Fprintf(o.Log, "rep %d/%d  TCP_CRR %-14s FAILED: %v\n", rep+1, o.Reps, s.Config, err)
				} else {
					fmt.Fprintf(o.Log, "rep %d/%d  TCP_CRR %-14s %9.1f Trans/s  cpu %.1f us/Tr  judged %d  fast %d opened %d learned %d\n",
						rep+1, o.Reps, s.Config, s.Value, s.CPU, s.Allowed, s.FastHits, s.FastOpens, s.FastLearned)
				}
				res.Samples = append(res.Samples, s)
				runs = append(runs, bench.Sample{Test: "TCP_CRR", Config: s.Config, Rep: s.Rep, Value: s.Value, Error: s.Error})
			}
		}
	}
	byConfig := map[string][]float64{}
	for _, s := range res.Samples {
		if s.Error != "" {
			continue
		}
		byConfig[s.Config] = append(byConfig[s.Config], s.Value)
	}
	res.NoPolicy, res.WithPolicy = bench.StatOf(byConfig[NoPolicy]), bench.StatOf(byConfig[WithPolicy])
	res.NoPolicyFast, res.WithPolicyFast = bench.StatOf(byConfig[NoPolicyFast]), bench.StatOf(byConfig[WithPolicyFast])
	res.Ratio = bench.PairedRatio(runs, "TCP_CRR", WithPolicy, NoPolicy)
	res.FastRatioNoPolicy = bench.PairedRatio(runs, "TCP_CRR", NoPolicyFast, NoPolicy)
	res.FastRatioPolicy = bench.PairedRatio(runs, "TCP_CRR", WithPolicyFast, WithPolicy)
	if res.NoPolicy.Median > 0 {
		res.RatioOfMeds = res.WithPolicy.Median / res.NoPolicy.Median
	}
	res.CostPercent = (1 - res.Ratio.Median) * 100
	res.Date = time.Now().UTC().Format(time.RFC3339)
	return res, nil
}

// crrRun runs one TCP_CRR in policy configuration policyCfg with the fast
// path off or on, and checks the path: with it on, the client's node's
// fast path carried, opened or learned the connections, and opened none
// where the policies isolate the pods (connection setup is for pods no
// policy isolates); off, it did nothing. Every connection the server's rules judged
// was allowed.
func crrRun(ctx context.Context, o CRROptions, l *lab.Lab, w waiter, client, server *lab.Pod, policyCfg string, fast bool) (CRRSample, error) {
	s := CRRSample{Config: policyCfg}
	if fast {
		s.Config = map[string]string{NoPolicy: NoPolicyFast, WithPolicy: WithPolicyFast}[policyCfg]
	}
	if err := bench.SetFastPath(ctx, l, fast); err != nil {
		return s, err
	}
	before, fp0, err := w.counters(ctx)
	if err != nil {
		return s, err
	}
	sm, err := bench.Netperf(ctx, o.Netperf, client.Netns, server.IP.String(), "TCP_CRR", o.Duration, o.CPUs, dataPort)
	if err != nil {
		return s, err
	}
	s.Value, s.CPU = sm.Value, sm.CPU
	after, fp1, err := w.counters(ctx)
	if err != nil {
		return s, err
	}
	s.Allowed, s.Denied = after.Allowed-before.Allowed, after.Denied-before.Denied
	s.FastHits, s.FastOpens, s.FastLearned = fp1["egress_hit"]-fp0["egress_hit"], fp1["egress_open"]-fp0["egress_open"], fp1["learn_egress"]-fp0["learn_egress"]
	worked := s.FastHits + s.FastOpens + s.FastLearned
	switch {
	case policyCfg == WithPolicy && s.Allowed == 0:
		return s, errors.New("the server's ingress rules judged no connection")
	case s.Denied != 0:
		return s, fmt.Errorf("the server's ingress rules denied %d connections", s.Denied)
	case fast && worked == 0:
		return s, errors.New("the client node's fast path neither carried, opened nor learned anything")
	case fast && policyCfg == WithPolicy && s.FastOpens != 0:
		return s, fmt.Errorf("the client node opened %d connections of an isolated pod on the fast path", s.FastOpens)
	case !fast && worked != 0:
		return s, fmt.Errorf("the client node's fast path worked while off (%d packets, opens and learned flows)", worked)
	}
	return s, nil
}

// createPolicies creates n NetworkPolicies in the bench namespace and m
// ClusterNetworkPolicies, with a few API clients at once.
func createPolicies(ctx context.Context, kube kubernetes.Interface, cnps dynamic.ResourceInterface, n, m int) error {
	nps := kube.NetworkingV1().NetworkPolicies(benchNS)
	jobs := make(chan func() error)
	errs := make(chan error, 1)
	var wg sync.WaitGroup
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for job := range jobs {
				if err := job(); err != nil {
					select {
					case errs <- err:
					default:
					}
				}
			}
		}()
	}
	for i := 0; i < n; i++ {
		jobs <- func() error {
			if _, err := nps.Create(ctx, BenchPolicy(i), metav1.CreateOptions{}); err != nil {
				return fmt.Errorf("create policy %d: %w", i, err)
			}
			return nil
		}
	}
	for i := 0; i < m; i++ {
		jobs <- func() error {
			u, err := BenchClusterPolicy(i).Unstructured()
			if err == nil {
				_, err = cnps.Create(ctx, u, metav1.CreateOptions{})
			}
			if err != nil {
				return fmt.Errorf("create cluster policy %d: %w", i, err)
			}
			return nil
		}
	}
	close(jobs)
	wg.Wait()
	select {
	case err := <-errs:
		return err
	default:
		return nil
	}
}

// BenchClusterPolicy is cluster policy i of the CRR benchmark's, of the
// Admin tier at priority i mod 1000: its subjects are the client and the
// server (the bench namespace's pods of app client or server), and it has
// one rule each way of its own. Policy 0, which judges first, passes the
// client's connections to the server on netperf's ports to the
// NetworkPolicies (which allow them), both ways; every other matches other
// traffic: in ingress, a Deny of the peers namespace on TCP 3000+i (odd i)
// or an Accept of one role's peers on TCP 4000+i (even i); in egress, an
// Accept (even i) or a Deny (odd i) of a /24 of its own in 100.128.0.0/10
// on TCP 443.
func BenchClusterPolicy(i int) *policy.ClusterNetworkPolicy {
	port := func(n int) []policy.CNPProtocol { return tcpPorts(policy.CNPPort{Number: int32(n)}) }
	netperfPorts := tcpPorts(policy.CNPPort{Range: &policy.CNPPortRange{Start: ctlPort, End: dataPort}})
	inBench := func(app string) *policy.CNPNamespacedPod {
		return &policy.CNPNamespacedPod{NamespaceSelector: *labels("kubernetes.io/metadata.name", benchNS), PodSelector: *labels("app", app)}
	}
	cnp := &policy.ClusterNetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("bench-%04d", i), Labels: map[string]string{policyLabel: "policy"}},
		Spec: policy.CNPSpec{Tier: "Admin", Priority: int32(i % 1000), Subject: policy.CNPSubject{Pods: &policy.CNPNamespacedPod{
			NamespaceSelector: *labels("kubernetes.io/metadata.name", benchNS),
			PodSelector: metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
				{Key: "app", Operator: metav1.LabelSelectorOpIn, Values: []string{"client", "server"}}}},
		}}},
	}
	s := &cnp.Spec
	switch {
	case i == 0:
		s.Ingress = []policy.CNPIngressRule{{Action: "Pass", From: []policy.CNPIngressPeer{{Pods: inBench("client")}}, Protocols: netperfPorts}}
		s.Egress = []policy.CNPEgressRule{{Action: "Pass", To: []policy.CNPEgressPeer{{Pods: inBench("server")}}, Protocols: netperfPorts}}
		return cnp
	case i%2 == 1:
		s.Ingress = []policy.CNPIngressRule{{Action: "Deny", From: []policy.CNPIngressPeer{{Namespaces: labels("team", "peers")}}, Protocols: port(3000 + i%30000)}}
	default:
		s.Ingress = []policy.CNPIngressRule{{Action: "Accept", From: []policy.CNPIngressPeer{{Pods: &policy.CNPNamespacedPod{
			NamespaceSelector: *labels("team", "peers"), PodSelector: *labels("role", fmt.Sprintf("peer-%d", i/2%2))}}}, Protocols: port(4000 + i%30000)}}
	}
	action := map[bool]string{true: "Deny", false: "Accept"}[i%2 == 1]
	s.Egress = []policy.CNPEgressRule{{Action: action, To: []policy.CNPEgressPeer{{Networks: []string{fmt.Sprintf("100.%d.%d.0/24", 128+(i/256)%64, i%256)}}},
		Protocols: port(443)}}
	return cnp
}

// BenchPolicy is policy i of the CRR benchmark's. Every one selects both
// the client and the server (app In (client, server)) and isolates both
// directions; each allows its own peers: a /24 of its own in 100.64.0.0/10
// on TCP and UDP port 1000+i, the peers namespace's pods of one role
// (namespaceSelector and podSelector) on TCP 2000+i, and in egress a /24
// of its own in 100.96.0.0/11 on TCP 443. Policy 0 also allows the client
// to reach the server on netperf's ports: named (np-ctl, np-data) for the
// server's ingress, a numeric range for the client's egress.
func BenchPolicy(i int) *networkingv1.NetworkPolicy {
	port := intstr.FromInt32(int32(1000 + i%30000))
	np := &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("bench-%04d", i), Namespace: benchNS, Labels: map[string]string{policyLabel: "policy"}},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
				{Key: "app", Operator: metav1.LabelSelectorOpIn, Values: []string{"client", "server"}}}},
			PolicyTypes: bothWays,
			Ingress: []networkingv1.NetworkPolicyIngressRule{
				{
					From:  []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: fmt.Sprintf("100.%d.%d.0/24", 64+(i/256)%32, i%256)}}},
					Ports: []networkingv1.NetworkPolicyPort{npPort(corev1.ProtocolTCP, port, 0), npPort(corev1.ProtocolUDP, port, 0)},
				},
				{
					From: []networkingv1.NetworkPolicyPeer{{NamespaceSelector: labels("team", "peers"),
						PodSelector: labels("role", fmt.Sprintf("peer-%d", i%2))}},
					Ports: []networkingv1.NetworkPolicyPort{tcp(2000 + i%30000)},
				},
			},
			Egress: []networkingv1.NetworkPolicyEgressRule{{
				To:    []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: fmt.Sprintf("100.%d.%d.0/24", 96+(i/256)%32, i%256)}}},
				Ports: []networkingv1.NetworkPolicyPort{tcp(443)},
			}},
		},
	}
	if i == 0 {
		s := &np.Spec
		s.Ingress = append(s.Ingress, networkingv1.NetworkPolicyIngressRule{
			From: []networkingv1.NetworkPolicyPeer{{PodSelector: labels("app", "client")}},
			Ports: []networkingv1.NetworkPolicyPort{
				npPort(corev1.ProtocolTCP, intstr.FromString("np-ctl"), 0), npPort(corev1.ProtocolTCP, intstr.FromString("np-data"), 0)},
		})
		s.Egress = append(s.Egress, networkingv1.NetworkPolicyEgressRule{
			To:    []networkingv1.NetworkPolicyPeer{{PodSelector: labels("app", "server")}},
			Ports: []networkingv1.NetworkPolicyPort{npPort(corev1.ProtocolTCP, intstr.FromInt32(ctlPort), dataPort)},
		})
	}
	return np
}

// waiter waits until both agents enforce a number of policies.
type waiter struct {
	client, server       *lab.Node
	clientKey, serverKey string
}

// enforced is what both agents enforce: the server's ingress and the
// client's egress rules, NetworkPolicy and Admin-tier ones, and since when
// that held.
type enforced struct {
	server, client, serverAdmin, clientAdmin int
	since                                    time.Time
}

// wait returns when the server's agent isolates the server's ingress by
// exactly n NetworkPolicies and the client's agent the client's egress
// (n = 0: not isolated), each direction holds Admin rules of exactly m
// ClusterNetworkPolicies, both watchers have applied all they have seen
// without error, and that holds for a second.
func (w waiter) wait(ctx context.Context, n, m int) (enforced, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	var got enforced
	last := "no answer yet"
	for {
		ok := true
		for i, side := range []struct {
			node *lab.Node
			key  string
		}{{w.server, w.serverKey}, {w.client, w.clientKey}} {
			resp, err := side.node.Policy(ctx, side.key)
			if err != nil {
				ok, last = false, err.Error()
				break
			}
			d := resp.Pods[0].Ingress
			if i == 1 {
				d = resp.Pods[0].Egress
			}
			cnps := map[string]bool{}
			for _, r := range d.Admin {
				cnps[r.Policy] = true
			}
			switch {
			case resp.LastError != "":
				ok, last = false, fmt.Sprintf("%s: policy watcher: %s", side.node.Name, resp.LastError)
			case resp.Applied < resp.Seen:
				ok, last = false, fmt.Sprintf("%s: policy watcher applied %d of %d", side.node.Name, resp.Applied, resp.Seen)
			case len(d.Policies) != n || d.Isolated != (n > 0):
				ok, last = false, fmt.Sprintf("%s: %s isolated by %d policies, want %d", side.node.Name, side.key, len(d.Policies), n)
			case len(cnps) != m:
				ok, last = false, fmt.Sprintf("%s: %s has admin rules of %d cluster policies, want %d", side.node.Name, side.key, len(cnps), m)
			}
			if i == 0 {
				got.server, got.serverAdmin = len(d.Rules), len(d.Admin)
			} else {
				got.client, got.clientAdmin = len(d.Rules), len(d.Admin)
			}
		}
		switch {
		case !ok:
			got.since = time.Time{}
		case got.since.IsZero():
			got.since = time.Now()
		case time.Since(got.since) >= time.Second:
			return got, nil
		}
		select {
		case <-ctx.Done():
			return got, fmt.Errorf("agents did not enforce %d policies and %d cluster policies: %s", n, m, last)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// serverCounters are the server's ingress counters.
// counters are what a run is judged by: the server's ingress counters
// and the client node's fast-path counters.
func (w waiter) counters(ctx context.Context) (*apiv1.PolicyDirection, map[string]uint64, error) {
	server, err := w.serverCounters(ctx)
	if err != nil {
		return nil, nil, err
	}
	client, err := w.client.Stats(ctx)
	return server, client, err
}

func (w waiter) serverCounters(ctx context.Context) (*apiv1.PolicyDirection, error) {
	resp, err := w.server.Policy(ctx, w.serverKey)
	if err != nil {
		return nil, err
	}
	return resp.Pods[0].Ingress, nil
}
