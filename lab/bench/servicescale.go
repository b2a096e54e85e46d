package bench

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	dpservices "github.com/onc-net/onc/datapath/services"
	"github.com/onc-net/onc/lab"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// ScaleOptions are the Services scale bench's (onc-bench services-scale):
// N Services of Endpoints fake endpoints each, one of them a real
// ClusterIP Service whose backend is the netserver pod; per N and proxy,
// the time to program them, memory, and TCP_CRR to the real one.
type ScaleOptions struct {
	BinDir   string // onc, onc-agent, onc-controller, onc-lab
	KubeBin  string // kube-apiserver, kube-proxy
	Netperf  string // directory holding netperf and netserver
	Prefix   string // the lab's name prefix; default "oncsvcs"
	Services []int  // numbers of Services, ascending, each including the real one
	// Endpoints of each fake Service: addresses in the cluster CIDR that
	// no pod holds (the lab has no endpoint controller; the bench writes
	// the EndpointSlices, as the e2e tests do).
	Endpoints int
	Reps      int // TCP_CRR runs per proxy and N
	Duration  time.Duration
	CPUs      string        // netperf -T
	Timeout   time.Duration // the longest wait for a proxy to program them
	Log       io.Writer
}

// ScaleRow is one proxy with N Services. A row whose set-up or
// programming failed holds the error; a failed TCP_CRR run is a sample
// with its reason.
type ScaleRow struct {
	Proxy    string `json:"proxy"`
	Services int    `json:"services"`
	// ProgramS: node 0's proxy (the agent, or kube-proxy) restarted with
	// the N Services in the API, until it has programmed all of them (the
	// agent's onctl services, kube-proxy's rules in the kernel).
	ProgramS float64 `json:"program_s"`
	// Resident memory after programming: node 0's agent, and its
	// kube-proxy (kube-proxy's configs). The kernel's rules are in neither.
	AgentRSSMB     float64  `json:"agent_rss_mb"`
	KubeProxyRSSMB float64  `json:"kube_proxy_rss_mb,omitempty"`
	CRR            Stat     `json:"crr"` // TCP_CRR transactions/s, the path-checked runs
	Samples        []Sample `json:"samples"`
	Error          string   `json:"error,omitempty"`
}

// scaleSvc names the fake Services; the real one is svcName.
const scaleSvc = "scale-"

// scaleDataPort is each proxy's data port of the real Service (one per
// config, as dataPorts are).
func scaleDataPort(proxy string) namedPort {
	i := slices.Index(Proxies, proxy)
	return namedPort{"np-" + proxy, ctlPort.port + 1 + int32(i), 0}
}

func scalePorts() []namedPort {
	out := []namedPort{ctlPort}
	for _, p := range Proxies {
		out = append(out, scaleDataPort(p))
	}
	return out
}

// RunServicesScale brings up a 2-node lab in Kubernetes mode, the client
// pod on node 0 and the netserver pod on node 1, and for each N of
// o.Services grows the Services to N, then measures every proxy in turn
// (the order rotating from one N to the next). Each row ends up in the
// result, failed or not.
func RunServicesScale(ctx context.Context, o ScaleOptions) (rows []ScaleRow, err error) {
	if o.Prefix == "" {
		o.Prefix = "oncsvcs"
	}
	l, err := lab.Up(ctx, lab.Options{Prefix: o.Prefix, BinDir: o.BinDir, Nodes: 2, NodeTimeout: time.Hour,
		Datastore: "kubernetes", KubeBin: o.KubeBin, Underlay: lab.UnderlayDirect})
	if err != nil {
		return nil, fmt.Errorf("lab: %w", err)
	}
	defer func() {
		if derr := l.Down(); derr != nil {
			err = errors.Join(err, fmt.Errorf("lab down: %w", derr))
		}
	}()
	if err := AddPods(ctx, l); err != nil {
		return nil, err
	}
	client, server, err := pair(l)
	if err != nil {
		return nil, err
	}
	spod := server.Pods[0]
	st, err := client.Status(ctx)
	if err != nil {
		return nil, err
	}
	cidr, err := netip.ParsePrefix(st.ClusterCidr)
	if err != nil {
		return nil, fmt.Errorf("cluster CIDR %q: %w", st.ClusterCidr, err)
	}
	kube, err := bulkClient(l)
	if err != nil {
		return nil, err
	}
	measured, err := createServiceWith(ctx, kube, serviceSpec{name: svcName, ports: scalePorts(), pods: []*lab.Pod{spod}})
	if err != nil {
		return nil, err
	}
	stop, err := Netservers(o.Netperf, spod.Netns)
	if err != nil {
		return nil, err
	}
	defer stop()
	bo := Options{Lab: l, Netperf: o.Netperf, Reps: o.Reps, Duration: o.Duration, CPUs: o.CPUs, Log: o.Log}
	have := 1
	for i, n := range o.Services {
		start := time.Now()
		if err := createFakes(ctx, kube, have-1, n-1, o.Endpoints, cidr); err != nil {
			return rows, err
		}
		fmt.Fprintf(o.Log, "%d Services (%d new, %d endpoints each) written in %.1fs\n", n, n-have, o.Endpoints, time.Since(start).Seconds())
		have = n
		for j := range Proxies {
			proxy := Proxies[(i+j)%len(Proxies)]
			row := ScaleRow{Proxy: proxy, Services: n}
			if err := measureScale(ctx, bo, o, &row, measured.clusterIP); err != nil {
				row.Error = err.Error()
				fmt.Fprintf(o.Log, "%s with %d Services failed: %v\n", proxy, n, err)
			}
			rows = append(rows, row)
			if err := ctx.Err(); err != nil {
				return rows, err
			}
		}
	}
	return rows, nil
}

// bulkClient is a client for writing thousands of objects: the lab's
// limits its rate to 200 requests/s.
func bulkClient(l *lab.Lab) (kubernetes.Interface, error) {
	cfg := l.APIServer.RESTConfig()
	cfg.QPS, cfg.Burst = 5000, 5000
	cfg.WarningHandler = rest.NoWarnings{}
	return kubernetes.NewForConfig(cfg)
}

// createFakes creates fake Services from..to-1, a few at a time.
func createFakes(ctx context.Context, kube kubernetes.Interface, from, to, endpoints int, cidr netip.Prefix) error {
	jobs := make(chan int)
	var (
		mu    sync.Mutex
		first error
		wg    sync.WaitGroup
	)
	for w := 0; w < 16; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range jobs {
				if _, err := createServiceWith(ctx, kube, fakeService(i, endpoints, cidr)); err != nil {
					mu.Lock()
					first = cmp.Or(first, err)
					mu.Unlock()
				}
			}
		}()
	}
	for i := from; i < to; i++ {
		jobs <- i
	}
	close(jobs)
	wg.Wait()
	return first
}

// fakeService is fake Service i: one TCP port, endpoints addresses in the
// upper half of the cluster CIDR, which the lab's two nodes' blocks (its
// first) never reach.
func fakeService(i, endpoints int, cidr netip.Prefix) serviceSpec {
	spec := serviceSpec{name: fmt.Sprintf("%s%05d", scaleSvc, i), ports: []namedPort{{"http", 80, 0}}}
	for j := 0; j < endpoints; j++ {
		spec.fakes = append(spec.fakes, fakeAddr(cidr, i*endpoints+j))
	}
	return spec
}

// fakeAddr is address k (modulo the half's size) of cidr's upper half.
func fakeAddr(cidr netip.Prefix, k int) netip.Addr {
	a := cidr.Masked().Addr().As4()
	base := uint32(a[0])<<24 | uint32(a[1])<<16 | uint32(a[2])<<8 | uint32(a[3])
	half := uint32(1) << (31 - cidr.Bits())
	v := base + half + uint32(k)%half
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}

// measureScale sets the lab up for row's proxy, times a cold start of
// node 0's proxy with row.Services Services, reads memory, and runs
// TCP_CRR to the real Service o.Reps times.
func measureScale(ctx context.Context, bo Options, o ScaleOptions, row *ScaleRow, vip netip.Addr) error {
	l := bo.Lab
	client, server, _ := pair(l)
	cpod, spod := client.Pods[0], server.Pods[0]
	if err := useProxy(ctx, l, row.Proxy); err != nil {
		return err
	}
	if _, err := waitProgrammed(ctx, client, row.Proxy, row.Services, o.Timeout); err != nil {
		return err
	}
	// Stopped (and kube-proxy's rules removed) before the clock starts.
	var start time.Time
	if row.Proxy == ProxyONC {
		client.Agent.Stop()
		start = time.Now()
		if err := l.RestartAgent(ctx, client, proxyAgentArgs(row.Proxy)...); err != nil {
			return err
		}
	} else {
		if err := l.CleanupKubeProxy(ctx, client); err != nil {
			return err
		}
		start = time.Now()
		if err := l.StartKubeProxy(ctx, client, row.Proxy, "--iptables-sync-period", "1h"); err != nil {
			return err
		}
	}
	took, err := waitProgrammed(ctx, client, row.Proxy, row.Services, o.Timeout)
	if err != nil {
		return err
	}
	row.ProgramS = took.Sub(start).Seconds()
	if err := SetFastPath(ctx, l, true); err != nil { // the restarted agent's
		return err
	}
	time.Sleep(2 * time.Second) // let the restarted program settle
	u, err := lab.ReadUsage(client.Agent.PID)
	if err != nil {
		return err
	}
	row.AgentRSSMB = mb(u.RSS)
	if row.Proxy != ProxyONC {
		if u, err = lab.ReadUsage(client.KubeProxy.PID); err != nil {
			return err
		}
		row.KubeProxyRSSMB = mb(u.RSS)
	}
	fmt.Fprintf(bo.Log, "%s: %d Services programmed on %s in %.2fs; agent %.1f MB, kube-proxy %.1f MB\n",
		row.Proxy, row.Services, client.Name, row.ProgramS, row.AgentRSSMB, row.KubeProxyRSSMB)
	data := scaleDataPort(row.Proxy)
	f := frontend{netip.AddrPortFrom(vip, uint16(data.port)), dpservices.ClusterIP}
	read := func() (paths, error) { return readPaths(ctx, client, f, spod.IP) }
	var vals []float64
	for rep := 1; rep <= o.Reps; rep++ {
		s := Sample{Test: "TCP_CRR"}
		if err := forgetConnections(ctx, []*lab.Node{client}, cpod.IP); err != nil {
			s.Error = err.Error()
		} else {
			s = pathChecked(ctx, bo, cpod.Netns, netip.AddrPortFrom(vip, uint16(ctlPort.port)), data.port, "TCP_CRR", read, proxyCheck(row.Proxy, dpservices.ClusterIP))
		}
		s.Config, s.Rep = fmt.Sprintf("%s-%d", row.Proxy, row.Services), rep
		logSample(bo, s)
		row.Samples = append(row.Samples, s)
		if s.Error == "" {
			vals = append(vals, s.Value)
		}
	}
	row.CRR = StatOf(vals)
	return nil
}

func mb(b uint64) float64 { return float64(b) / (1 << 20) }

// waitProgrammed polls n until proxy has programmed want of the bench's
// Services, each with its endpoints, and says when it first saw them all.
func waitProgrammed(ctx context.Context, n *lab.Node, proxy string, want int, timeout time.Duration) (time.Time, error) {
	deadline := time.Now().Add(timeout)
	for {
		got, err := programmed(ctx, n, proxy)
		now := time.Now()
		if err == nil && got == want {
			return now, nil
		}
		if now.After(deadline) || ctx.Err() != nil {
			return now, fmt.Errorf("%s on %s programmed %d of %d Services within %v (%v)", proxy, n.Name, got, want, timeout, err)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// The bench's Services in kube-proxy's rules: a KUBE-SERVICES rule's
// comment ("bench/scale-00042:http cluster IP"), an element of the
// service-ips map (": goto service-ABCD1234-bench/scale-00042/tcp/http").
var (
	iptablesService = regexp.MustCompile(`--comment "?` + benchNS + `/([^:" ]+):`)
	nftService      = regexp.MustCompile(`service-[A-Z0-9]+-` + benchNS + `/([^/]+)/tcp/`)
)

// programmed counts the bench's Services n's proxy has programmed: those
// the agent balances (each port with backends: an EndpointSlice comes
// whole), those kube-proxy has a rule for.
func programmed(ctx context.Context, n *lab.Node, proxy string) (int, error) {
	switch proxy {
	case ProxyONC:
		resp, err := listServices(ctx, n)
		if err != nil {
			return 0, err
		}
		backed := map[string]bool{}
		for _, s := range resp.Services {
			name, _, _ := strings.Cut(s.Name, ":")
			if s.Frontend != dpservices.ClusterIP.String() || !strings.HasPrefix(name, benchNS+"/") {
				continue
			}
			ok, seen := backed[name]
			backed[name] = (ok || !seen) && len(s.Backends) > 0
		}
		count := 0
		for _, ok := range backed {
			if ok {
				count++
			}
		}
		return count, nil
	case ProxyIPTables:
		out, err := exec.CommandContext(ctx, "ip", "netns", "exec", n.Netns, "iptables", "-w", "-t", "nat", "-S", "KUBE-SERVICES").CombinedOutput()
		if err != nil { // no chain yet
			return 0, fmt.Errorf("iptables -S KUBE-SERVICES: %w: %s", err, strings.TrimSpace(string(out)))
		}
		return distinct(string(out), iptablesService), nil
	}
	out, err := nftList(ctx, n.Netns, "map", "service-ips")
	if err != nil { // no table yet
		return 0, err
	}
	return distinct(out, nftService), nil
}

// distinct counts the distinct first groups of re in s.
func distinct(s string, re *regexp.Regexp) int {
	seen := map[string]bool{}
	for _, m := range re.FindAllStringSubmatch(s, -1) {
		seen[m[1]] = true
	}
	return len(seen)
}
