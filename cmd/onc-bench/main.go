// Command onc-bench runs ONC's benchmarks on fresh labs and writes
// bench-results/: by default `make bench` (netperf: bare vs slow path vs
// fast path), and `onc-bench scale`, `make bench-scale` (N simulated nodes
// in a real datastore, one real agent programming them all).
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"time"

	"github.com/onc-net/onc/e2e/bench"
	"github.com/onc-net/onc/e2e/lab"
	"github.com/onc-net/onc/e2e/scale"
	"github.com/spf13/pflag"
	"golang.org/x/sys/unix"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var err error
	if len(os.Args) > 1 && os.Args[1] == "scale" {
		err = scaleMain(ctx, os.Args[2:])
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
		fmt.Fprintf(os.Stderr, "usage: onc-bench [flags]        netperf: bare vs slow path vs fast path (make bench)\n       onc-bench scale [flags]  the scale bed (make bench-scale; onc-bench scale --help)\n")
		fs.PrintDefaults()
	}
	out := fs.String("out", "bench-results", "directory for latest.json, latest.md and latest.svg")
	netperf := fs.String("netperf", ".tools/netperf/usr/bin", "directory holding netperf and netserver")
	reps := fs.Int("reps", 5, "interleaved repetitions per test and configuration")
	dur := fs.Duration("duration", 5*time.Second, "length of one netperf run")
	tests := fs.StringSlice("tests", bench.Tests, "netperf tests")
	cpus := fs.String("cpus", "0,1", `netperf -T: CPU of netperf, CPU of netserver ("" leaves placement to the scheduler)`)
	_ = fs.Parse(args)
	np, err := filepath.Abs(*netperf)
	if err != nil {
		return err
	}
	l, err := lab.Up(ctx, lab.Options{Prefix: "oncbench", BinDir: binDir(), Nodes: 2, PodsPerNode: 1, NodeTimeout: time.Hour})
	if err != nil {
		return err
	}
	defer l.Down()
	fmt.Printf("lab up; %d × %d tests × %d configs × %s\n", *reps, len(*tests), len(bench.Configs), *dur)
	samples, err := bench.Run(ctx, bench.Options{Lab: l, Netperf: np, Tests: *tests, Reps: *reps, Duration: *dur, CPUs: *cpus, Log: os.Stdout})
	if err != nil {
		return err
	}
	r := bench.NewReport(samples, *reps, *dur, kernel())
	r.CPUs = *cpus
	if err := bench.WriteFiles(*out, "latest", r); err != nil {
		return err
	}
	fmt.Println()
	r.Markdown(os.Stdout)
	fmt.Printf("\nwritten: %s/latest.{json,md,svg}\n", *out)
	return nil
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
