package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	apiv1 "github.com/onc-net/onc/api/v1"
	"github.com/onc-net/onc/lab"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The flow-record rows' configs: pod to pod across nodes, fast path on,
// with the agents recording flows (their defaults) and without
// (--flows-buffer 0: no store, no NFLOG rules, no eBPF events); each
// without a policy and with one isolating the server's ingress and
// allowing the client, so that every new connection is judged and the
// allowed ones are logged by the policy table.
const (
	FlowsOn        = "flows-on"
	FlowsOff       = "flows-off"
	FlowsOnPolicy  = "flows-on-policy"
	FlowsOffPolicy = "flows-off-policy"

	flowsPolicy = "flows-bench"
)

// FlowsConfigs in the order a rotation starts with.
var FlowsConfigs = []string{FlowsOn, FlowsOnPolicy, FlowsOffPolicy, FlowsOff}

// FlowsTests are the tests the flow-record rows run (of Options.Tests).
var FlowsTests = []string{"TCP_RR", "TCP_CRR"}

// FlowsBarLimit is the least flows on ÷ off may be, on every test and
// with or without the policy, for flow records to be on by default.
const FlowsBarLimit = 0.97

// flowsRecording is whether cfg's agents record flows; flowsIsolated,
// whether the server's ingress is isolated.
func flowsRecording(cfg string) bool { return cfg == FlowsOn || cfg == FlowsOnPolicy }
func flowsIsolated(cfg string) bool  { return cfg == FlowsOnPolicy || cfg == FlowsOffPolicy }

// FlowsMemory is the client node's agent's resident memory after the same
// burst of short connections with flow records on (the store as full as
// the burst fills it) and off.
type FlowsMemory struct {
	// Records the store held after the burst, and how many it may hold in
	// all (the agent's --flows-buffer).
	Held   int `json:"held"`
	Buffer int `json:"buffer"`
	// Seconds of TCP_CRR the burst ran (no policy, fast path on: the
	// fast path's open and learn records, up to their budget).
	BurstSeconds float64 `json:"burstSeconds"`
	// VmRSS of the agent, KiB, flows on and off.
	RSSOnKiB  int64  `json:"rssOnKiB"`
	RSSOffKiB int64  `json:"rssOffKiB"`
	Error     string `json:"error,omitempty"`
}

// flowsBufferDefault is onc-agent's --flows-buffer default, which the lab
// leaves as it is.
const flowsBufferDefault = 8192

// RunFlows measures the flow-record configs: every test of FlowsTests in
// o.Tests on every config, o.Reps times. Both agents are restarted when
// recording changes (once a repetition: the configs alternate from one
// repetition to the next as ABBA), the policy created or deleted when
// isolation does. Each run is path-checked: with records on, the run's
// connections were recorded (the server's allowed ones by its policy,
// or the client node's fast-path records of them); off, no node records;
// with the policy, the server's rules judged the connections and denied
// none. A failed run or check is a sample with its reason; the rows go
// on. Then, on the client's node, the agent's memory after a burst of
// short connections with records on and off.
func RunFlows(ctx context.Context, o Options) (out []Sample, mem FlowsMemory, err error) {
	l := o.Lab
	client, server, err := pair(l)
	if err != nil {
		return nil, mem, err
	}
	cpod, spod := client.Pods[0], server.Pods[0]
	kube, err := l.Kube()
	if err != nil {
		return nil, mem, err
	}
	nps := kube.NetworkingV1().NetworkPolicies(benchNS)
	stop, err := Netservers(o.Netperf, spod.Netns)
	if err != nil {
		return nil, mem, err
	}
	defer stop()
	recording, isolated := true, false
	defer func() {
		// Back to the lab's agents and no policy, whatever happened.
		ctx := context.WithoutCancel(ctx)
		if !recording {
			err = errors.Join(err, restartAgents(ctx, l))
		}
		if derr := nps.Delete(ctx, flowsPolicy, metav1.DeleteOptions{}); derr != nil && !apierrors.IsNotFound(derr) {
			err = errors.Join(err, derr)
		}
	}()
	set := func(cfg string) error {
		if on := flowsRecording(cfg); on != recording {
			var extra []string
			if !on {
				extra = []string{"--flows-buffer=0"}
			}
			if err := restartAgents(ctx, l, extra...); err != nil {
				return err
			}
			recording = on
			if err := checkRecording(ctx, l, on); err != nil {
				return err
			}
		}
		if iso := flowsIsolated(cfg); iso != isolated {
			var err error
			if iso {
				_, err = nps.Create(ctx, flowsBenchPolicy(), metav1.CreateOptions{})
			} else {
				err = nps.Delete(ctx, flowsPolicy, metav1.DeleteOptions{})
			}
			if err != nil {
				return fmt.Errorf("policy %s/%s: %w", benchNS, flowsPolicy, err)
			}
			isolated = iso
		}
		if err := SetFastPath(ctx, l, true); err != nil {
			return err
		}
		return waitIsolated(ctx, server, spod.Key(), isolated)
	}
	tests := testsOf(o.Tests, FlowsTests)
	fmt.Fprintf(o.Log, "flow records: %s (%s) → %s (%s), fast path on\n", cpod.Key(), cpod.IP, spod.Key(), spod.IP)
	for rep := 0; rep < o.Reps; rep++ {
		configs := FlowsConfigs
		if rep%2 == 1 {
			configs = []string{FlowsOff, FlowsOffPolicy, FlowsOnPolicy, FlowsOn}
		}
		for _, cfg := range configs {
			if err := set(cfg); err != nil {
				return out, mem, fmt.Errorf("rep %d, %s: %w", rep+1, cfg, err)
			}
			for _, test := range tests {
				s := flowsRun(ctx, o, client, server, cpod, spod, test, cfg)
				if err := ctx.Err(); err != nil {
					return out, mem, err
				}
				s.Rep = rep + 1
				logSample(o, s)
				out = append(out, s)
			}
		}
	}
	if err := set(FlowsOn); err != nil {
		return out, mem, err
	}
	mem = flowsMemory(ctx, o, client, cpod.Netns, spod.IP.String(), func(on bool) error {
		if on {
			return set(FlowsOn)
		}
		return set(FlowsOff)
	})
	return out, mem, nil
}

// flowsBenchPolicy isolates the server's ingress and allows the client
// pod every port: netperf's data connections take any.
func flowsBenchPolicy() *networkingv1.NetworkPolicy {
	return &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: flowsPolicy, Namespace: benchNS},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "netserver"}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
			Ingress: []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{
				PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "client"}},
			}}}},
		},
	}
}

// flowsRun runs one path-checked netperf in cfg (already set).
func flowsRun(ctx context.Context, o Options, client, server *lab.Node, cpod, spod *lab.Pod, test, cfg string) Sample {
	start := time.Now()
	before, err := ingressOf(ctx, server, spod.Key())
	var s Sample
	if err == nil {
		s, err = Netperf(ctx, o.Netperf, cpod.Netns, spod.IP.String(), test, o.Duration, o.CPUs, 0)
	}
	if err == nil {
		err = checkFlowsRun(ctx, client, server, cpod, spod, cfg, start, before)
	}
	s.Test, s.Config = test, cfg
	if err != nil {
		s.Error = err.Error()
	}
	return s
}

// checkFlowsRun judges a run by what the nodes saw of it since start.
func checkFlowsRun(ctx context.Context, client, server *lab.Node, cpod, spod *lab.Pod, cfg string, start time.Time, before *apiv1.PolicyDirection) error {
	after, err := ingressOf(ctx, server, spod.Key())
	if err != nil {
		return err
	}
	judged, denied := after.Allowed-before.Allowed, after.Denied-before.Denied
	switch {
	case flowsIsolated(cfg) && judged == 0:
		return errors.New("the server's ingress rules judged no connection")
	case denied != 0:
		return fmt.Errorf("the server's ingress rules denied %d packets", denied)
	case !flowsIsolated(cfg) && judged != 0:
		return fmt.Errorf("the server's ingress rules judged %d packets without a policy", judged)
	case !flowsRecording(cfg):
		return nil
	}
	// Records on: the policy's allowed records on the server's node, or
	// without it, the client node's records of its pod (the fast path's).
	n, req := client, &apiv1.GetFlowsRequest{Pod: cpod.Key(), SinceUnixNano: start.UnixNano()}
	if flowsIsolated(cfg) {
		n, req = server, &apiv1.GetFlowsRequest{Pod: spod.Key(), SinceUnixNano: start.UnixNano(), Event: "policy", Verdict: "allowed"}
	}
	got, err := countFlows(ctx, n, req)
	if err == nil && got == 0 {
		err = fmt.Errorf("%s recorded no flow of the run (%s)", n.Name, req)
	}
	return err
}

// flowsMemory runs the same burst of short connections with records on
// and off (set switches), and reads the client agent's resident memory
// after each: with records on, after the store stopped growing or was
// full. A failure is its Error.
func flowsMemory(ctx context.Context, o Options, client *lab.Node, from, to string, set func(on bool) error) FlowsMemory {
	m := FlowsMemory{Buffer: flowsBufferDefault}
	burst := func() error {
		_, err := Netperf(ctx, o.Netperf, from, to, "TCP_CRR", o.Duration, o.CPUs, 0)
		return err
	}
	bursts := 0
	err := func() error {
		// Records on (set by the caller): burst until the store is full
		// or holds no more than a burst ago, at most 12 bursts.
		for bursts < 12 && m.Held < m.Buffer {
			if err := burst(); err != nil {
				return err
			}
			bursts++
			held, err := countFlows(ctx, client, &apiv1.GetFlowsRequest{})
			if err != nil {
				return err
			}
			if held == m.Held {
				break
			}
			m.Held = held
		}
		var err error
		if m.RSSOnKiB, err = rssKiB(client.Agent.PID); err != nil {
			return err
		}
		if err := set(false); err != nil {
			return err
		}
		for i := 0; i < bursts; i++ {
			if err := burst(); err != nil {
				return err
			}
		}
		m.RSSOffKiB, err = rssKiB(client.Agent.PID)
		return err
	}()
	if err != nil {
		m.Error = err.Error()
	}
	m.BurstSeconds = float64(bursts) * o.Duration.Seconds()
	return m
}

// rssKiB is a process's VmRSS.
func rssKiB(pid int) (int64, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			return strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		}
	}
	return 0, fmt.Errorf("pid %d: no VmRSS", pid)
}

// restartAgents restarts every node's agent with extra flags (none: the
// lab's).
func restartAgents(ctx context.Context, l *lab.Lab, extra ...string) error {
	for _, n := range l.Nodes {
		if err := l.RestartAgent(ctx, n, extra...); err != nil {
			return fmt.Errorf("%s: restart the agent: %w", n.Name, err)
		}
	}
	settle()
	return nil
}

// settle lets restarted agents' first reconciles settle before a run
// measures them.
func settle() { time.Sleep(2 * time.Second) }

// checkRecording checks every node answers onctl flows (on) or refuses
// with FAILED_PRECONDITION (off).
func checkRecording(ctx context.Context, l *lab.Lab, on bool) error {
	for _, n := range l.Nodes {
		_, err := countFlows(ctx, n, &apiv1.GetFlowsRequest{})
		switch {
		case on && err != nil:
			return fmt.Errorf("%s: records on: %w", n.Name, err)
		case !on && status.Code(err) != codes.FailedPrecondition:
			return fmt.Errorf("%s: onctl flows with --flows-buffer=0: %v, want FAILED_PRECONDITION", n.Name, err)
		}
	}
	return nil
}

// countFlows counts the records onctl flows req lists on n.
func countFlows(ctx context.Context, n *lab.Node, req *apiv1.GetFlowsRequest) (int, error) {
	c, conn, err := n.AgentAPI()
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	stream, err := c.GetFlows(ctx, req)
	if err != nil {
		return 0, err
	}
	for count := 0; ; count++ {
		if _, err := stream.Recv(); errors.Is(err, io.EOF) {
			return count, nil
		} else if err != nil {
			return count, err
		}
	}
}

// ingressOf is a pod's ingress as its node's agent enforces it.
func ingressOf(ctx context.Context, n *lab.Node, key string) (*apiv1.PolicyDirection, error) {
	resp, err := n.Policy(ctx, key)
	if err != nil {
		return nil, err
	}
	return resp.Pods[0].Ingress, nil
}

// waitIsolated waits until n's agent isolates (or does not isolate) the
// pod's ingress.
func waitIsolated(ctx context.Context, n *lab.Node, key string, isolated bool) error {
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		in, err := ingressOf(ctx, n, key)
		if err == nil && in.Isolated == isolated {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: %s's ingress not isolated=%v within 30s (%v)", n.Name, key, isolated, err)
		}
	}
}
