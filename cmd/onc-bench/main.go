// Command onc-bench runs ONC's benchmarks on fresh labs and writes
// bench-results/: by default `make bench` (netperf and redis: bare vs
// Flannel vs slow path vs fast path; a ClusterIP through socket LB vs kube-proxy vs the pod IP;
// two pods of one node through the intra-node bypass vs the TCP/IP stack),
// `onc-bench scale`, `make bench-scale` (N simulated nodes in a real
// datastore, one real agent programming them all), and `onc-bench
// policy`, `make bench-policy` (NetworkPolicy: rule programming time and
// memory, TCP_CRR with and without 1,000 policies).
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/onc-net/onc/lab"
	"github.com/onc-net/onc/lab/bench"
	"github.com/onc-net/onc/lab/policybench"
	"github.com/onc-net/onc/lab/scale"
	"github.com/spf13/pflag"
	"golang.org/x/sys/unix"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var err error
	if len(os.Args) > 1 && os.Args[1] == "scale" {
		err = scaleMain(ctx, os.Args[2:])
	} else if len(os.Args) > 1 && os.Args[1] == "policy" {
		err = policyMain(ctx, os.Args[2:])
	} else if len(os.Args) > 1 && os.Args[1] == "services-scale" {
		err = servicesScaleMain(ctx, os.Args[2:])
	} else {
		err = netperfMain(ctx, os.Args[1:])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "onc-bench:", err)
		os.Exit(1)
	}
}

func netperfMain(ctx context.Context, args []string) error {
	fs := pflag.NewFlagSet("onc-bench", pflag.ExitOnError)
	fs.Usage = func() {
		fmt.Fprintf(os.Stderr, "usage: onc-bench [flags]        netperf and redis: bare vs Flannel vs slow path vs fast path, a ClusterIP via socket LB vs kube-proxy vs the pod IP, two pods of one node via the bypass vs the stack, and flow records on vs off (make bench)\n       onc-bench scale [flags]  the scale bed (make bench-scale; onc-bench scale --help)\n       onc-bench policy [flags] NetworkPolicy (make bench-policy; onc-bench policy --help)\n       onc-bench services-scale [flags] Services at scale, ONC vs kube-proxy (make bench-services-scale; onc-bench services-scale --help)\n")
		fs.PrintDefaults()
	}
	out := fs.String("out", "bench-results", "directory for latest.json, latest.md and latest.svg")
	netperf := fs.String("netperf", ".tools/netperf/usr/bin", "directory holding netperf and netserver")
	kubeBin := fs.String("kube-bin", os.Getenv("ONC_KUBE_BIN"), "directory holding kube-apiserver and kube-proxy (make kube-bins; env ONC_KUBE_BIN)")
	reps := fs.Int("reps", 10, "interleaved repetitions per test and configuration (at least 5 for a bar verdict by interval; 10 for a useful one)")
	dur := fs.Duration("duration", 5*time.Second, "length of one netperf run")
	tests := fs.StringSlice("tests", bench.Tests, "netperf tests (the Service section runs those of "+strings.Join(bench.ServiceTests, ", ")+
		", the intra-node one those of "+strings.Join(bench.IntranodeTests, ", ")+")")
	cpus := fs.String("cpus", "0,1", `netperf -T: CPU of netperf, CPU of netserver, and of redis-benchmark and redis-server ("" leaves placement to the scheduler)`)
	pods := fs.Bool("pods", true, "measure pod to pod: "+strings.Join(bench.Configs, ", ")+" (flannel unless --flannel=)")
	services := fs.Bool("services", true, "measure Services: "+strings.Join(bench.ServiceConfigs, ", "))
	flannel := fs.String("flannel", ".tools/flannel", `directory holding flanneld and cni/ (make flannel-bins) for the flannel configuration; "" leaves it out`)
	redis := fs.Int("redis-requests", 100000, "redis-benchmark -n of each of GET and SET per run; 0 leaves the redis rows out")
	underlay := fs.String("underlay", lab.UnderlayDirect, "the 2 nodes' underlay: direct (one veth pair, as two machines on one cable) or bridge (a bridge namespace: two veth pairs and a bridge under every packet)")
	intranode := fs.Bool("intranode", true, "measure two pods of one node at message sizes "+fmt.Sprint(bench.IntranodeSizes)+" B: "+strings.Join(bench.IntranodeConfigs, ", "))
	flowsRows := fs.Bool("flows", true, "measure flow records on versus off, without and with a policy: "+strings.Join(bench.FlowsConfigs, ", ")+
		" ("+strings.Join(bench.FlowsTests, ", ")+"), and the agent's memory with its record store filled")
	nodeports := fs.Bool("nodeports", true, "measure NodePorts from a host outside the cluster, on a lab of their own on the bridge underlay: "+strings.Join(bench.NodePortConfigs, ", "))
	family := fs.String("ip-family", bench.FamilyIPv4, "the pod-to-pod rows' address family: ipv4; ipv6 (an IPv6 lab: IPv6 pods in IPv6 tunnels); or dual (a dual-stack lab: pods' IPv6 addresses over the IPv4 tunnel). With ipv6 and dual: bare between the nodes' IPv6 underlay addresses, no Flannel row, the Service, intra-node and NodePort rows (IPv4's) left out")
	_ = fs.Parse(args)
	switch *family {
	case bench.FamilyIPv4:
	case bench.FamilyIPv6, bench.FamilyDual:
		for name, on := range map[string]*bool{"services": services, "intranode": intranode, "nodeports": nodeports, "flows": flowsRows} {
			if fs.Changed(name) && *on {
				return fmt.Errorf("--ip-family %s measures pod to pod only: the --%s rows are IPv4's so far", *family, name)
			}
			*on = false
		}
		*flannel = ""
	default:
		return fmt.Errorf("--ip-family %q: ipv4, ipv6 or dual", *family)
	}
	np, err := filepath.Abs(*netperf)
	if err != nil {
		return err
	}
	need := []string{"kube-apiserver"}
	if *services || *nodeports {
		need = append(need, "kube-proxy")
	}
	for _, b := range need {
		if _, err := os.Stat(filepath.Join(*kubeBin, b)); err != nil {
			return fmt.Errorf("the bench's lab needs %s (make kube-bins, --kube-bin): %w", b, err)
		}
	}
	if *redis > 0 && *pods {
		for _, b := range []string{"redis-server", "redis-benchmark", "redis-cli"} {
			if _, err := exec.LookPath(b); err != nil {
				return fmt.Errorf("the redis rows need %s (make prereqs; --redis-requests 0 leaves them out): %w", b, err)
			}
		}
	}
	o := bench.Options{Netperf: np, Tests: *tests, Reps: *reps, Duration: *dur, CPUs: *cpus, RedisRequests: *redis, Family: *family, Log: os.Stdout}
	var samples []bench.Sample
	var flowsMem *bench.FlowsMemory
	if rows := (labRows{*pods, *services, *intranode, *flowsRows}); rows != (labRows{}) {
		s, mem, err := netperfLab(ctx, o, *kubeBin, *underlay, *flannel, rows)
		if err != nil {
			return err
		}
		samples, flowsMem = append(samples, s...), mem
	}
	if *nodeports {
		// A lab of its own: the outside host joins the underlay's bridge,
		// which the direct underlay has none of between the nodes.
		l, err := lab.Up(ctx, lab.Options{Prefix: "oncbench", BinDir: binDir(), Nodes: 2, NodeTimeout: time.Hour,
			Datastore: "kubernetes", KubeBin: *kubeBin, Underlay: lab.UnderlayBridge, ExternalClient: true})
		if err != nil {
			return err
		}
		defer l.Down()
		if err := bench.AddPods(ctx, l); err != nil {
			return err
		}
		o.Lab = l
		fmt.Printf("NodePorts: %d × %s × %d configs × %s\n", *reps, strings.Join(bench.NodePortTests, ", "), len(bench.NodePortConfigs), *dur)
		s, err := bench.RunNodePorts(ctx, o)
		if err != nil {
			return err
		}
		samples = append(samples, s...)
	}
	r := bench.NewReport(samples, *reps, *dur, kernel())
	r.CPUs, r.Family, r.FlowsMemory = *cpus, *family, flowsMem
	if err := bench.WriteFiles(*out, "latest", r); err != nil {
		return err
	}
	fmt.Println()
	r.Markdown(os.Stdout)
	fmt.Printf("\nwritten: %s/latest.{json,md,svg}\n", *out)
	return nil
}

// labRows are the sections netperfLab measures.
type labRows struct{ pods, services, intranode, flows bool }

// netperfLab runs the rows of one lab on underlay: pod to pod, Services
// (ClusterIP), intra-node and flow records on and off, as asked; the lab
// is down when it returns.
func netperfLab(ctx context.Context, o bench.Options, kubeBin, underlay, flannel string, rows labRows) ([]bench.Sample, *bench.FlowsMemory, error) {
	labFamily := map[string]string{bench.FamilyIPv4: lab.IPFamilyIPv4, bench.FamilyIPv6: lab.IPFamilyIPv6, bench.FamilyDual: lab.IPFamilyDual}[o.Family]
	l, err := lab.Up(ctx, lab.Options{Prefix: "oncbench", BinDir: binDir(), Nodes: 2, NodeTimeout: time.Hour,
		Datastore: "kubernetes", KubeBin: kubeBin, Underlay: underlay, IPFamily: labFamily})
	if err != nil {
		return nil, nil, err
	}
	defer l.Down()
	o.Lab = l
	if flannel != "" {
		dir, err := filepath.Abs(flannel)
		if err != nil {
			return nil, nil, err
		}
		if err := l.StartFlannel(ctx, dir); err != nil {
			return nil, nil, err
		}
	}
	if err := bench.AddPods(ctx, l); err != nil {
		return nil, nil, err
	}
	var samples []bench.Sample
	if rows.pods {
		fmt.Printf("lab up; pod to pod: %d × %s%s × %s × %s\n", o.Reps, strings.Join(o.Tests, ", "),
			map[bool]string{true: ", redis", false: ""}[o.RedisRequests > 0], strings.Join(o.Configs(), ", "), o.Duration)
		s, err := bench.Run(ctx, o)
		if err != nil {
			return nil, nil, err
		}
		samples = append(samples, s...)
	}
	if rows.services {
		fmt.Printf("Services: %d × %s × %d configs × %s\n", o.Reps, strings.Join(bench.ServiceTests, ", "), len(bench.ServiceConfigs), o.Duration)
		s, err := bench.RunServices(ctx, o)
		if err != nil {
			return nil, nil, err
		}
		samples = append(samples, s...)
	}
	if rows.intranode {
		fmt.Printf("intra-node: %d × %d sizes × %s × %d configs × %s\n", o.Reps, len(bench.IntranodeSizes), strings.Join(bench.IntranodeTests, ", "), len(bench.IntranodeConfigs), o.Duration)
		s, err := bench.RunIntranode(ctx, o)
		if err != nil {
			return nil, nil, err
		}
		samples = append(samples, s...)
	}
	if !rows.flows {
		return samples, nil, nil
	}
	fmt.Printf("flow records: %d × %s × %d configs × %s\n", o.Reps, strings.Join(bench.FlowsTests, ", "), len(bench.FlowsConfigs), o.Duration)
	s, mem, err := bench.RunFlows(ctx, o)
	if err != nil {
		return nil, nil, err
	}
	return append(samples, s...), &mem, nil
}

func scaleMain(ctx context.Context, args []string) error {
	fs := pflag.NewFlagSet("onc-bench scale", pflag.ExitOnError)
	out := fs.String("out", "bench-results", "directory for scale.json, scale.md and scale.svg")
	nodes := fs.IntSlice("nodes", []int{100, 1000, 5000}, "numbers of simulated nodes, each on a fresh lab")
	datastores := fs.StringSlice("datastores", []string{"etcd", "kubernetes"}, "datastores to measure: etcd (embedded), kubernetes (kube-apiserver)")
	kubeBin := fs.String("kube-bin", os.Getenv("ONC_KUBE_BIN"), "directory holding kube-apiserver (make kube-bins; env ONC_KUBE_BIN)")
	window := fs.Duration("window", time.Minute, "steady-state window over which CPU, kernel writes, watcher signals and datastore writes are counted")
	changes := fs.Int("changes", 3, "node additions and removals timed")
	timeout := fs.Duration("timeout", 15*time.Minute, "longest wait for allocation or programming before a size counts as failed")
	merge := fs.Bool("merge", true, "keep rows of an earlier scale.json for the datastores and sizes this run does not measure")
	_ = fs.Parse(args)
	for _, ds := range *datastores {
		if ds != "etcd" && ds != "kubernetes" {
			return fmt.Errorf("--datastores: %q is neither etcd nor kubernetes", ds)
		}
		if ds == "kubernetes" {
			if _, err := os.Stat(filepath.Join(*kubeBin, "kube-apiserver")); err != nil {
				return fmt.Errorf("the kubernetes datastore needs kube-apiserver (make kube-bins, --kube-bin): %w", err)
			}
		}
	}
	for _, n := range *nodes {
		if n < 1 {
			return fmt.Errorf("--nodes: %d", n)
		}
	}
	path := filepath.Join(*out, "scale.json")
	var r scale.Report
	if *merge {
		var err error
		if r, err = scale.LoadReport(path); err != nil {
			return fmt.Errorf("%s: %w (--merge=false starts afresh)", path, err)
		}
	}
	rows := scale.Run(ctx, scale.Options{Datastores: *datastores, Nodes: *nodes, BinDir: binDir(), KubeBin: *kubeBin,
		Window: *window, Changes: *changes, Timeout: *timeout, Log: os.Stdout})
	r.Date, r.Kernel, r.CPUs, r.Window = time.Now().UTC().Format(time.RFC3339), kernel(), runtime.NumCPU(), window.String()
	if r.Counts == nil {
		r.Counts = map[string]string{}
	}
	for _, ds := range *datastores {
		r.Counts[ds] = scale.Counts(ds)
	}
	r.Merge(rows)
	if err := bench.WriteFiles(*out, "scale", r); err != nil {
		return err
	}
	fmt.Println()
	r.Markdown(os.Stdout)
	fmt.Printf("\nwritten: %s/scale.{json,md,svg}\n", *out)
	for _, row := range rows {
		if row.Error != "" {
			return fmt.Errorf("%s with %d nodes failed (see the report)", row.Datastore, row.Nodes)
		}
	}
	return nil
}

func policyMain(ctx context.Context, args []string) error {
	fs := pflag.NewFlagSet("onc-bench policy", pflag.ExitOnError)
	out := fs.String("out", "bench-results", "directory for policy.json and policy.md")
	pods := fs.IntSlice("pods", []int{100, 1000, 5000}, "cluster sizes (pods) for rule programming")
	policies := fs.IntSlice("policies", []int{10, 100, 1000}, "NetworkPolicy counts for rule programming")
	clusterPolicies := fs.IntSlice("cluster-policies", []int{0, 1000}, "ClusterNetworkPolicy counts for rule programming; every size × policies × cluster policies is measured")
	changes := fs.Int("changes", 9, "changes of one policy (and of one cluster policy) timed per point")
	program := fs.Bool("program", true, "measure rule programming time and memory (root: throwaway network namespaces)")
	crr := fs.Bool("crr", true, "measure TCP_CRR, no policy vs --crr-policies and --crr-cluster-policies (a 2-node lab in Kubernetes mode)")
	crrPolicies := fs.Int("crr-policies", 1000, "NetworkPolicies in the TCP_CRR measurement's policy configuration")
	crrClusterPolicies := fs.Int("crr-cluster-policies", 1000, "ClusterNetworkPolicies in the TCP_CRR measurement's policy configuration")
	netperf := fs.String("netperf", ".tools/netperf/usr/bin", "directory holding netperf and netserver (./hack/netperf.sh .tools/netperf)")
	kubeBin := fs.String("kube-bin", os.Getenv("ONC_KUBE_BIN"), "directory holding kube-apiserver (make kube-bins; env ONC_KUBE_BIN)")
	reps := fs.Int("reps", 5, "TCP_CRR repetitions, each one run per configuration")
	dur := fs.Duration("duration", 10*time.Second, "length of one netperf run")
	cpus := fs.String("cpus", "0,1", `netperf -T: CPU of netperf, CPU of netserver ("" leaves placement to the scheduler)`)
	merge := fs.Bool("merge", true, "keep the parts and rows of an earlier policy.json that this run does not measure")
	_ = fs.Parse(args)
	if *crr {
		if _, err := os.Stat(filepath.Join(*kubeBin, "kube-apiserver")); err != nil {
			return fmt.Errorf("TCP_CRR needs kube-apiserver (make kube-bins, --kube-bin): %w", err)
		}
		if _, err := os.Stat(filepath.Join(*netperf, "netperf")); err != nil {
			return fmt.Errorf("TCP_CRR needs netperf (./hack/netperf.sh .tools/netperf, --netperf): %w", err)
		}
	}
	np, err := filepath.Abs(*netperf)
	if err != nil {
		return err
	}
	path := filepath.Join(*out, "policy.json")
	var r policybench.Report
	if *merge {
		if r, err = policybench.LoadReport(path); err != nil {
			return fmt.Errorf("%s: %w (--merge=false starts afresh)", path, err)
		}
	}
	r.Date, r.Kernel, r.CPUs, r.Note, r.Changes = time.Now().UTC().Format(time.RFC3339), kernel(), runtime.NumCPU(), policybench.MachineNote, *changes
	var failed []string
	if *program {
		rows := policybench.Program(ctx, policybench.ProgramOptions{Pods: *pods, Policies: *policies, ClusterPolicies: *clusterPolicies,
			Changes: *changes, Log: os.Stdout})
		r.Merge(rows)
		for _, row := range rows {
			if row.Error != "" {
				failed = append(failed, fmt.Sprintf("programming %d pods × %d policies × %d cluster policies", row.Pods, row.Policies, row.ClusterPolicies))
			}
		}
	}
	if *crr && ctx.Err() == nil {
		res, err := policybench.CRR(ctx, policybench.CRROptions{BinDir: binDir(), KubeBin: *kubeBin, Netperf: np, Prefix: "oncpolb",
			Policies: *crrPolicies, ClusterPolicies: *crrClusterPolicies, Reps: *reps, Duration: *dur, CPUs: *cpus, Log: os.Stdout})
		if err != nil {
			res.Error = err.Error()
			failed = append(failed, "TCP_CRR: "+err.Error())
		}
		r.CRR = &res
	}
	if err := r.WriteFiles(*out); err != nil {
		return err
	}
	fmt.Println()
	r.Markdown(os.Stdout)
	fmt.Printf("\nwritten: %s/policy.{json,md}\n", *out)
	if len(failed) > 0 {
		return fmt.Errorf("failed: %s", strings.Join(failed, "; "))
	}
	return ctx.Err()
}

func servicesScaleMain(ctx context.Context, args []string) error {
	fs := pflag.NewFlagSet("onc-bench services-scale", pflag.ExitOnError)
	out := fs.String("out", "bench-results", "directory for services-scale.json, .md and .svg")
	sizes := fs.IntSlice("services", []int{10, 1000, 10000}, "numbers of Services, each measured with every proxy ("+strings.Join(bench.Proxies, ", ")+"); the smallest is the TCP_CRR ratios' base")
	endpoints := fs.Int("endpoints", 10, "endpoints of each Service but the measured one (addresses no pod holds)")
	netperf := fs.String("netperf", ".tools/netperf/usr/bin", "directory holding netperf and netserver (./hack/netperf.sh .tools/netperf)")
	kubeBin := fs.String("kube-bin", os.Getenv("ONC_KUBE_BIN"), "directory holding kube-apiserver and kube-proxy (make kube-bins; env ONC_KUBE_BIN)")
	reps := fs.Int("reps", 5, "TCP_CRR runs per proxy and size")
	dur := fs.Duration("duration", 5*time.Second, "length of one netperf run")
	cpus := fs.String("cpus", "0,1", `netperf -T: CPU of netperf, CPU of netserver ("" leaves placement to the scheduler)`)
	timeout := fs.Duration("timeout", 10*time.Minute, "longest wait for a proxy to program the Services before its row counts as failed")
	_ = fs.Parse(args)
	slices.Sort(*sizes)
	if len(*sizes) == 0 || (*sizes)[0] < 1 {
		return fmt.Errorf("--services: %v (at least 1 each: the measured Service is one of them)", *sizes)
	}
	for _, b := range []string{"kube-apiserver", "kube-proxy"} {
		if _, err := os.Stat(filepath.Join(*kubeBin, b)); err != nil {
			return fmt.Errorf("the Services scale bench needs %s (make kube-bins, --kube-bin): %w", b, err)
		}
	}
	np, err := filepath.Abs(*netperf)
	if err != nil {
		return err
	}
	rows, err := bench.RunServicesScale(ctx, bench.ScaleOptions{BinDir: binDir(), KubeBin: *kubeBin, Netperf: np, Services: *sizes,
		Endpoints: *endpoints, Reps: *reps, Duration: *dur, CPUs: *cpus, Timeout: *timeout, Log: os.Stdout})
	r := bench.NewScaleReport(rows)
	r.Date, r.Kernel, r.CPUs, r.Endpoints, r.Reps, r.Duration = time.Now().UTC().Format(time.RFC3339), kernel(), runtime.NumCPU(), *endpoints, *reps, dur.String()
	if werr := bench.WriteFiles(*out, "services-scale", r); werr != nil {
		return errors.Join(err, werr)
	}
	fmt.Println()
	r.Markdown(os.Stdout)
	fmt.Printf("\nwritten: %s/services-scale.{json,md,svg}\n", *out)
	if err != nil {
		return err
	}
	for _, row := range rows {
		if row.Error != "" {
			return fmt.Errorf("%s with %d Services failed (see the report)", row.Proxy, row.Services)
		}
	}
	return nil
}

// binDir holds this binary and its siblings (make build).
func binDir() string {
	exe, _ := os.Executable()
	return filepath.Dir(exe)
}

func kernel() string {
	var uts unix.Utsname
	_ = unix.Uname(&uts)
	return strings.TrimRight(string(uts.Release[:]), "\x00")
}
