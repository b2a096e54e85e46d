package bench

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	apiv1 "github.com/onc-net/onc/api/v1"
	"github.com/onc-net/onc/lab"
)

// The intra-node rows' configs: netperf between two pods of node 0 through
// both TCP/IP stacks (the node's bypass off), and through the bypass (on):
// each send queued straight on the peer socket's receive queue.
const (
	IntraStack  = "intranode-stack"
	IntraBypass = "intranode-bypass"
)

// IntranodeConfigs in the order a rotation starts with.
var IntranodeConfigs = []string{IntraStack, IntraBypass}

// IntranodeTests are the tests the intra-node rows run (of Options.Tests).
var IntranodeTests = []string{"TCP_RR", "TCP_STREAM"}

// IntranodeSizes are the message sizes in bytes: TCP_RR's request and
// response, TCP_STREAM's send.
var IntranodeSizes = []int{1, 64, 256, 1024, 4096, 16384}

// redirectedBytes is the bypass counter of the bytes it carried.
const redirectedBytes = "redirected_bytes"

// RunIntranode adds a netserver pod next to the client pod on node 0 and
// measures every test of IntranodeTests in o.Tests at every size of
// IntranodeSizes on both configs, o.Reps times. Both configs of a test and
// size run back to back, the first alternating from one to the next and
// from one repetition to the next. Node 0's bypass is switched before each
// run, which applies since every netperf run opens fresh connections, and
// is set back as it was at the end.
func RunIntranode(ctx context.Context, o Options) (out []Sample, err error) {
	l := o.Lab
	node, _, err := pair(l)
	if err != nil {
		return nil, err
	}
	client := node.Pods[0]
	server, err := l.AddPodSpec(ctx, node, lab.PodSpec{Namespace: benchNS, Name: "intranode-server"})
	if err != nil {
		return nil, err
	}
	c, conn, err := node.AgentAPI()
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	was, err := c.ListBypass(ctx, &apiv1.ListBypassRequest{})
	if err != nil {
		return nil, fmt.Errorf("%s: %w", node.Name, err)
	}
	if was.State.GetMode() == "" {
		return nil, fmt.Errorf("%s has no intra-node bypass: %s", node.Name, was.State.GetStatus())
	}
	defer func() {
		_, rerr := c.SetBypass(context.WithoutCancel(ctx), &apiv1.SetBypassRequest{Mode: was.State.Mode, MinSize: was.State.MinSize})
		err = errors.Join(err, rerr)
	}()
	stop, err := Netservers(o.Netperf, server.Netns)
	if err != nil {
		return nil, err
	}
	defer stop()
	tests := testsOf(o.Tests, IntranodeTests)
	fmt.Fprintf(o.Log, "intra-node: %s (%s) → %s (%s) on %s, bypass %s before\n", client.Key(), client.IP, server.Key(), server.IP, node.Name, was.State.Mode)
	for rep := 0; rep < o.Reps; rep++ {
		turn := rep // which config goes first: it alternates from one test and size to the next
		for _, size := range IntranodeSizes {
			for _, test := range tests {
				for i := range IntranodeConfigs {
					cfg := IntranodeConfigs[(turn+i)%len(IntranodeConfigs)]
					s, err := intranodeRun(ctx, o, c, client, server, test, cfg, size)
					if err := ctx.Err(); err != nil {
						return out, err
					}
					// A failed run or path check is a row with its reason,
					// counted in no ratio; the run goes on.
					s.Test, s.Config, s.Size, s.Rep = test, cfg, size, rep+1
					if err != nil {
						s.Error = err.Error()
					}
					logSample(o, s)
					out = append(out, s)
				}
				turn++
			}
		}
	}
	return out, nil
}

// intranodeRun switches the bypass to cfg's mode, runs one netperf and
// checks that cfg's path carried it: the bypass redirected at least half
// the bytes netperf moved (the data connection, not only the control
// one), or none at all.
func intranodeRun(ctx context.Context, o Options, c apiv1.AgentClient, from, to *lab.Pod, test, cfg string, size int) (Sample, error) {
	mode := "off"
	if cfg == IntraBypass {
		mode = "on"
	}
	before, err := c.SetBypass(ctx, &apiv1.SetBypassRequest{Mode: mode})
	if err != nil {
		return Sample{}, fmt.Errorf("bypass %s: %w", mode, err)
	}
	if got := before.State.GetMode(); got != mode {
		return Sample{}, fmt.Errorf("bypass %q after setting it %s", got, mode)
	}
	s, err := Netperf(ctx, o.Netperf, from.Netns, to.IP.String(), test, o.Duration, o.CPUs, 0, sizeOpts(test, size)...)
	if err != nil {
		return Sample{}, err
	}
	after, err := c.ListBypass(ctx, &apiv1.ListBypassRequest{})
	if err != nil {
		return Sample{}, err
	}
	s.Config, s.Size = cfg, size
	if test == "TCP_RR" && s.Value > 0 {
		s.LatencyUS = 1e6 / s.Value // one transaction in flight: its mean round trip
	}
	b, err := counterOf(before.Counters, redirectedBytes)
	if err != nil {
		return Sample{}, err
	}
	a, err := counterOf(after.Counters, redirectedBytes)
	if err != nil {
		return Sample{}, err
	}
	switch redirected, moved := a-b, bytesMoved(s, o.Duration); {
	case cfg == IntraBypass && float64(redirected) < moved/2:
		err = fmt.Errorf("the bypass carried %d bytes of the ≈%.0f netperf moved", redirected, moved)
	case cfg == IntraStack && redirected != 0:
		err = fmt.Errorf("the bypass carried %d bytes while off", redirected)
	}
	return s, err
}

// sizeOpts are netperf's options for a message size of test.
func sizeOpts(test string, size int) []string {
	if test == "TCP_STREAM" {
		return []string{"-m", strconv.Itoa(size)}
	}
	return []string{"-r", strconv.Itoa(size) + "," + strconv.Itoa(size)}
}

// bytesMoved is about what s's data connection carried in d, both ways:
// TCP_STREAM's throughput (10^6 bits/s), or TCP_RR's transactions, each a
// request and a response of s.Size bytes.
func bytesMoved(s Sample, d time.Duration) float64 {
	if s.Test == "TCP_STREAM" {
		return s.Value * 1e6 / 8 * d.Seconds()
	}
	return s.Value * d.Seconds() * 2 * float64(s.Size)
}

// counterOf is the value of the bypass counter named name.
func counterOf(cs []*apiv1.Counter, name string) (uint64, error) {
	for _, c := range cs {
		if c.Name == name {
			return c.Value, nil
		}
	}
	return 0, fmt.Errorf("the bypass has no counter %s", name)
}
