// Package bench measures ONC on the lab with netperf: bare underlay
// (node to node), pod to pod across nodes on the slow path, and on the fast
// path — side by side in one run, in interleaved rotations, so the ratios
// hold on a shared machine even when absolute numbers do not. Services
// (services.go) and two pods of one node, through the intra-node bypass or
// the TCP/IP stack (intranode.go), are measured alike.
package bench

import (
	"context"
	"fmt"
	"io"
	"net/netip"
	"os/exec"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	apiv1 "github.com/onc-net/onc/api/v1"
	"github.com/onc-net/onc/lab"
)

// Configs, in the order a rotation starts with: node to node; pod to pod
// through a real Flannel (vxlan) on the same nodes, what a user would run
// instead; through ONC with the fast path off; and on.
var Configs = []string{"bare", "flannel", "slow", "fast"}

// Tests run by default.
var Tests = []string{"TCP_RR", "UDP_RR", "TCP_CRR", "TCP_STREAM", PinnedStream}

// PinnedStream is TCP_STREAM with both ends' socket buffers pinned at
// 4 MiB, net.core.rmem_max's default and so the most an application may
// ask for. Pinning turns the kernel's receive-buffer autotuning off: on
// this bed's round trips of tens of µs it settles on a different buffer
// in each run, and that buffer moves TCP_STREAM's throughput by more than
// the overlay does (docs/performance.md). TCP_STREAM shows what an
// application gets; this row, what the datapath costs.
const PinnedStream = "TCP_STREAM_PINNED"

// Options of a run.
type Options struct {
	Lab      *lab.Lab // two nodes with a pod each
	Netperf  string   // directory holding netperf and netserver
	Tests    []string
	Reps     int
	Duration time.Duration
	// CPUs binds netperf and netserver ("0,1": netperf on CPU 0, netserver
	// on CPU 1), and redis-benchmark and redis-server alike. Unbound, the
	// scheduler's placement of the two swings results by 2× on a 2-CPU
	// machine, for every config alike.
	CPUs string
	// RedisRequests is redis-benchmark -n of each of GET and SET; 0: no
	// redis rows.
	RedisRequests int
	// Family is the pod-to-pod rows' address family: FamilyIPv4 ("" too),
	// FamilyIPv6 (an IPv6 lab: pods' IPv6 addresses in IPv6 tunnels) or
	// FamilyDual (a dual-stack lab: pods' IPv6 addresses over the IPv4
	// tunnel). Both IPv6 ones run bare between the nodes' IPv6 underlay
	// addresses and leave Flannel out (IPv4 only here).
	Family string
	Log    io.Writer // progress
}

// Address families of Options.Family.
const (
	FamilyIPv4 = "ipv4"
	FamilyIPv6 = "ipv6"
	FamilyDual = "dual"
)

// ipv6Rows says whether family's pod-to-pod rows run over IPv6 addresses.
func ipv6Rows(family string) bool { return family == FamilyIPv6 || family == FamilyDual }

// Configs are the package's Configs without flannel when the lab has no
// Flannel pods or the rows are IPv6.
func (o Options) Configs() []string {
	if l := o.Lab; ipv6Rows(o.Family) || len(l.Nodes) < 2 || len(l.Nodes[0].FlannelPods) == 0 || len(l.Nodes[1].FlannelPods) == 0 {
		return slices.DeleteFunc(slices.Clone(Configs), func(c string) bool { return c == "flannel" })
	}
	return Configs
}

// cpu is the client's (0) or the server's (1) CPU of o.CPUs, or "".
func (o Options) cpu(i int) string {
	if f := strings.Split(o.CPUs, ","); len(f) == 2 {
		return f[i]
	}
	return ""
}

// Sample is one netperf run.
type Sample struct {
	Test, Config string
	Rep          int     // 1-based; a repetition's samples are one paired set
	Value        float64 // transactions/s or 10^6 bits/s
	Unit         string
	CPU          float64 // µs of CPU per transaction (RR) or per KB (STREAM), both ends
	CPUUnit      string
	// Size is the message size in bytes of the intra-node rows (TCP_RR's
	// request and response, TCP_STREAM's send); 0: netperf's default.
	Size int `json:"size,omitempty"`
	// LatencyUS is TCP_RR's mean latency of the intra-node rows, µs.
	LatencyUS float64 `json:"latency_us,omitempty"`
	// Error: the run failed, or its path check did (why). Its value, if
	// any, is kept for the record and counted in no median or ratio.
	Error string `json:"error,omitempty"`
}

// Run measures every test on every config, Reps times, rotating the
// config order each repetition.
func Run(ctx context.Context, o Options) ([]Sample, error) {
	l := o.Lab
	client, server, err := pair(l)
	if err != nil {
		return nil, err
	}
	if ipv6Rows(o.Family) && (!server.IPv6.IsValid() || !server.Pods[0].IPv6.IsValid()) {
		return nil, fmt.Errorf("IPv6 rows need an IPv6 or dual-stack lab: the server's node or pod has no IPv6 address")
	}
	configs := o.Configs()
	servers := []string{server.Netns, server.Pods[0].Netns}
	if slices.Contains(configs, "flannel") {
		servers = append(servers, server.FlannelPods[0].Netns)
	}
	stop, err := Netservers(o.Netperf, servers...)
	if err != nil {
		return nil, err
	}
	defer stop()
	tests := o.Tests
	if o.RedisRequests > 0 {
		stopRedis, err := RedisServers(ctx, o.cpu(1), servers...)
		if err != nil {
			return nil, err
		}
		defer stopRedis()
		tests = append(slices.Clone(tests), "REDIS")
	}
	var out []Sample
	for rep := 0; rep < o.Reps; rep++ {
		for _, test := range tests {
			for i := range configs {
				cfg := configs[(i+rep)%len(configs)]
				from, to := endpoints(client, server, cfg, o.Family)
				// Flannel's packets cross ONC's programs on the node's
				// eth0 too: they run with the fast path off, as in slow.
				if cfg != "bare" {
					if err := SetFastPath(ctx, l, cfg == "fast"); err != nil {
						return nil, err
					}
				}
				var ss []Sample
				if test == "REDIS" {
					ss, err = Redis(ctx, from, to, o.RedisRequests, o.cpu(0))
				} else {
					var s Sample
					s, err = Netperf(ctx, o.Netperf, from, to, test, o.Duration, o.CPUs, 0)
					ss = []Sample{s}
				}
				if err != nil {
					return nil, fmt.Errorf("%s %s: %w", test, cfg, err)
				}
				for _, s := range ss {
					s.Config, s.Rep = cfg, rep+1
					fmt.Fprintf(o.Log, "rep %d/%d  %-10s %-7s %12.1f %s  cpu %.2f %s\n", rep+1, o.Reps, s.Test, cfg, s.Value, s.Unit, s.CPU, s.CPUUnit)
					out = append(out, s)
				}
			}
		}
	}
	return out, nil
}

// endpoints are the namespace a config's client runs in and the address
// it reaches the server at, in family.
func endpoints(client, server *lab.Node, cfg, family string) (from, to string) {
	switch {
	case cfg == "bare" && ipv6Rows(family):
		return client.Netns, server.IPv6.String()
	case cfg == "bare":
		return client.Netns, server.IP.String()
	case cfg == "flannel":
		return client.FlannelPods[0].Netns, server.FlannelPods[0].IP.String()
	case ipv6Rows(family):
		return client.Pods[0].Netns, server.Pods[0].IPv6.String()
	}
	return client.Pods[0].Netns, server.Pods[0].IP.String()
}

// pair is the client's node and the server's, each with its pod first.
func pair(l *lab.Lab) (client, server *lab.Node, err error) {
	if len(l.Nodes) < 2 || len(l.Nodes[0].Pods) == 0 || len(l.Nodes[1].Pods) == 0 {
		return nil, nil, fmt.Errorf("bench needs a lab with 2 nodes and a pod on each")
	}
	return l.Nodes[0], l.Nodes[1], nil
}

// SetFastPath switches it on every node, then waits until each node sees
// every peer's flag (the peers' LPM entries follow the flag).
func SetFastPath(ctx context.Context, l *lab.Lab, on bool) error {
	var clients []apiv1.AgentClient
	for _, n := range l.Nodes {
		c, conn, err := n.AgentAPI()
		if err != nil {
			return err
		}
		defer conn.Close()
		if _, err := c.SetFastPath(ctx, &apiv1.SetFastPathRequest{Enabled: on}); err != nil {
			return fmt.Errorf("fast path on %s: %w", n.Name, err)
		}
		clients = append(clients, c)
	}
	for i, c := range clients {
		if err := waitPeers(ctx, c, on); err != nil {
			return fmt.Errorf("%s: %w", l.Nodes[i].Name, err)
		}
	}
	return nil
}

func waitPeers(ctx context.Context, c apiv1.AgentClient, on bool) error {
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		resp, err := c.ListPeers(ctx, &apiv1.ListPeersRequest{})
		if err != nil {
			return err
		}
		done := true
		for _, p := range resp.Peers {
			done = done && p.FastPath == on
		}
		if done {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("peers did not report fast path %v within 10s", on)
		}
	}
}

// Netservers starts one netserver per namespace; stop kills them by PID.
func Netservers(dir string, netns ...string) (stop func(), err error) {
	stop, err = startIn(netns, func(ns string) []string {
		return []string{"netns", "exec", ns, dir + "/netserver", "-D", "-p", "12865"}
	})
	if err == nil {
		time.Sleep(300 * time.Millisecond)
	}
	return stop, err
}

// startIn starts `ip args(ns)` for each namespace; stop kills them by PID
// and reaps them. Started servers are stopped again if one fails.
func startIn(netns []string, args func(ns string) []string) (stop func(), err error) {
	var cmds []*exec.Cmd
	stop = func() {
		for _, c := range cmds {
			_ = c.Process.Signal(syscall.SIGTERM)
			_ = c.Wait()
		}
	}
	for _, ns := range netns {
		c := exec.Command("ip", args(ns)...)
		if err := c.Start(); err != nil {
			stop()
			return nil, fmt.Errorf("%s: %w", c, err)
		}
		cmds = append(cmds, c)
	}
	return stop, nil
}

// Netperf runs one test; dataPort > 0 fixes the server's data port
// (0: netserver picks one). opts are more test-specific options; they come
// after the defaults, so they override them (netperf keeps an option's
// last value).
func Netperf(ctx context.Context, dir, netns, host, test string, d time.Duration, cpus string, dataPort int, opts ...string) (Sample, error) {
	ip, err := netip.ParseAddr(host)
	if err != nil {
		return Sample{}, err
	}
	return netperfAt(ctx, dir, netns, netip.AddrPortFrom(ip, uint16(ctlPort.port)), test, d, cpus, dataPort, opts...)
}

// netperfAt is Netperf with its control connection to ctl: a NodePort's,
// whose number is not netserver's.
func netperfAt(ctx context.Context, dir, netns string, ctl netip.AddrPort, test string, d time.Duration, cpus string, dataPort int, opts ...string) (Sample, error) {
	name, testOpts := netperfTest(test)
	args := []string{"netns", "exec", netns, dir + "/netperf", "-H", ctl.Addr().String(), "-p", strconv.Itoa(int(ctl.Port())), "-t", name,
		"-l", strconv.Itoa(int(d.Seconds())), "-P", "0", "-c", "-C"}
	if cpus != "" {
		args = append(args, "-T", cpus)
	}
	// Both ends share this machine's CPUs, so one side's service demand
	// already counts the whole machine.
	args = append(args, "--", "-o", "THROUGHPUT,THROUGHPUT_UNITS,LOCAL_SD,SD_UNITS")
	if dataPort > 0 {
		args = append(args, "-P", ","+strconv.Itoa(dataPort))
	}
	args = append(append(args, testOpts...), opts...)
	// netperf waits for ever on a data connection that lost its packets:
	// fail the run instead of holding the lab.
	ctx, cancel := context.WithTimeout(ctx, d+time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, "ip", args...).CombinedOutput()
	if err != nil {
		return Sample{}, fmt.Errorf("%w: %s", err, out)
	}
	sm, err := parseNetperf(out)
	sm.Test = test
	return sm, err
}

// netperfTest is the netperf test that measures test, and its options.
func netperfTest(test string) (name string, opts []string) {
	switch test {
	case "TCP_STREAM":
		return test, []string{"-m", "65536"}
	case PinnedStream:
		return "TCP_STREAM", []string{"-m", "65536", "-s", "4M", "-S", "4M"}
	}
	return test, nil
}

// Summary is the median (with min and max) of one test on one config,
// at one message size.
type Summary struct {
	Test   string  `json:"test"`
	Config string  `json:"config"`
	Size   int     `json:"size,omitempty"` // bytes, as Sample's
	Median float64 `json:"median"`
	Min    float64 `json:"min"`
	Max    float64 `json:"max"`
	// The median's bootstrap 95 % interval (see medianInterval).
	Lo   float64 `json:"ci95Lo"`
	Hi   float64 `json:"ci95Hi"`
	Unit string  `json:"unit"`
	N    int     `json:"n"`
	// CPU per transaction (µs/Tr) or per KB (µs/KB), median.
	CPUMedian float64 `json:"cpuMedian"`
	CPUUnit   string  `json:"cpuUnit"`
	// LatencyUS is the median of the samples' (TCP_RR of the intra-node
	// rows).
	LatencyUS float64 `json:"latency_us,omitempty"`
	// Failed runs, counted in none of the above (Sample.Error).
	Failed int `json:"failed,omitempty"`
}

// Summarize groups samples by test, config and size: the pod-to-pod rows,
// then the Service rows, then the intra-node rows by test and size.
func Summarize(samples []Sample) []Summary {
	type key struct {
		test, cfg string
		size      int
	}
	groups := map[key][]Sample{}
	var order []key
	for _, s := range samples {
		k := key{s.Test, s.Config, s.Size}
		if groups[k] == nil {
			order = append(order, k)
		}
		groups[k] = append(groups[k], s)
	}
	configs := slices.Concat(Configs, ServiceConfigs, []string{NodePortHost}, NodePortConfigs, IntranodeConfigs, FlowsConfigs)
	allTests := slices.Concat(Tests, RedisTests)
	sort.SliceStable(order, func(i, j int) bool {
		a, b := order[i], order[j]
		if sa, sb := section(a.cfg), section(b.cfg); sa != sb {
			return sa < sb
		}
		if a.test != b.test {
			return indexOf(allTests, a.test) < indexOf(allTests, b.test)
		}
		if a.size != b.size {
			return a.size < b.size
		}
		return indexOf(configs, a.cfg) < indexOf(configs, b.cfg)
	})
	var out []Summary
	for _, k := range order {
		var vals, cpus, lats []float64
		var ok []Sample
		for _, s := range groups[k] {
			if s.Error == "" {
				vals, cpus, lats = append(vals, s.Value), append(cpus, s.CPU), append(lats, s.LatencyUS)
				ok = append(ok, s)
			}
		}
		st := StatOf(vals)
		sum := Summary{Test: k.test, Config: k.cfg, Size: k.size, Median: st.Median, Min: st.Min, Max: st.Max,
			Lo: st.Lo, Hi: st.Hi, N: len(ok), CPUMedian: Median(cpus), LatencyUS: Median(lats), Failed: len(groups[k]) - len(ok)}
		if len(ok) > 0 {
			sum.Unit, sum.CPUUnit = ok[0].Unit, ok[0].CPUUnit
		}
		out = append(out, sum)
	}
	return out
}

// The report's sections, in their order.
const (
	podSection = iota
	serviceSection
	nodePortSection
	intranodeSection
	flowsSection
)

func section(cfg string) int {
	switch {
	case slices.Contains(ServiceConfigs, cfg):
		return serviceSection
	case slices.Contains(NodePortConfigs, cfg), cfg == NodePortHost:
		return nodePortSection
	case slices.Contains(IntranodeConfigs, cfg):
		return intranodeSection
	case slices.Contains(FlowsConfigs, cfg):
		return flowsSection
	}
	return podSection
}

// testsOf are the tests of run that a section runs, in run's order.
func testsOf(run, section []string) []string {
	var out []string
	for _, t := range run {
		if slices.Contains(section, t) {
			out = append(out, t)
		}
	}
	return out
}

func indexOf(list []string, s string) int {
	for i, v := range list {
		if v == s {
			return i
		}
	}
	return len(list)
}

// Median of v (0 for none); v is left as it was.
func Median(v []float64) float64 {
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	n := len(s)
	if n == 0 {
		return 0
	}
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

// parseNetperf reads the last line of netperf's output asked for with
// -o THROUGHPUT,THROUGHPUT_UNITS,LOCAL_SD,SD_UNITS.
func parseNetperf(out []byte) (Sample, error) {
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	f := strings.Split(lines[len(lines)-1], ",")
	if len(f) < 4 {
		return Sample{}, fmt.Errorf("unexpected netperf output: %s", out)
	}
	v, err1 := strconv.ParseFloat(f[0], 64)
	sd, err2 := strconv.ParseFloat(f[2], 64)
	if err1 != nil || err2 != nil {
		return Sample{}, fmt.Errorf("unexpected netperf output: %s", out)
	}
	return Sample{Value: v, Unit: f[1], CPU: sd, CPUUnit: f[3]}, nil
}
