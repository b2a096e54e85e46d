// Command onc-bench runs `make bench`: netperf on a fresh lab, bare vs slow
// path vs fast path, and writes bench-results/.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/onc-net/onc/e2e/bench"
	"github.com/onc-net/onc/e2e/lab"
	"github.com/spf13/pflag"
	"golang.org/x/sys/unix"
)

func main() {
	out := pflag.String("out", "bench-results", "directory for latest.json, latest.md and latest.svg")
	netperf := pflag.String("netperf", ".tools/netperf/usr/bin", "directory holding netperf and netserver")
	reps := pflag.Int("reps", 5, "interleaved repetitions per test and configuration")
	dur := pflag.Duration("duration", 5*time.Second, "length of one netperf run")
	tests := pflag.StringSlice("tests", bench.Tests, "netperf tests")
	cpus := pflag.String("cpus", "0,1", `netperf -T: CPU of netperf, CPU of netserver ("" leaves placement to the scheduler)`)
	pflag.Parse()
	if err := run(*out, *netperf, *reps, *dur, *tests, *cpus); err != nil {
		fmt.Fprintln(os.Stderr, "onc-bench:", err)
		os.Exit(1)
	}
}

func run(out, netperf string, reps int, dur time.Duration, tests []string, cpus string) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	exe, _ := os.Executable()
	np, err := filepath.Abs(netperf)
	if err != nil {
		return err
	}
	l, err := lab.Up(ctx, lab.Options{Prefix: "oncbench", BinDir: filepath.Dir(exe), Nodes: 2, PodsPerNode: 1, NodeTimeout: time.Hour})
	if err != nil {
		return err
	}
	defer l.Down()
	fmt.Printf("lab up; %d × %d tests × %d configs × %s\n", reps, len(tests), len(bench.Configs), dur)
	samples, err := bench.Run(ctx, bench.Options{Lab: l, Netperf: np, Tests: tests, Reps: reps, Duration: dur, CPUs: cpus, Log: os.Stdout})
	if err != nil {
		return err
	}
	var uts unix.Utsname
	_ = unix.Uname(&uts)
	r := bench.NewReport(samples, reps, dur, strings.TrimRight(string(uts.Release[:]), "\x00"))
	r.CPUs = cpus
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	for name, write := range map[string]func(*os.File) error{
		"latest.json": func(f *os.File) error { return r.JSON(f) },
		"latest.md":   func(f *os.File) error { r.Markdown(f); return nil },
		"latest.svg":  func(f *os.File) error { r.SVG(f); return nil },
	} {
		f, err := os.Create(filepath.Join(out, name))
		if err != nil {
			return err
		}
		if err := write(f); err != nil {
			f.Close()
			return err
		}
		if err := f.Close(); err != nil {
			return err
		}
	}
	fmt.Println()
	r.Markdown(os.Stdout)
	fmt.Printf("\nwritten: %s/latest.{json,md,svg}\n", out)
	return nil
}
