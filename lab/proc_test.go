package lab

import (
	"testing"
	"time"
)

func TestParseStatCPUCountsFromTheLastParenthesis(t *testing.T) {
	// A command name with spaces and parentheses must not shift the fields;
	// utime 250 and stime 150 ticks are fields 14 and 15.
	stat := []byte("4242 (onc (agent) x) S 1 4242 4242 0 -1 4194560 9000 0 3 0 250 150 0 0 20 0 12 0 1234 800000000 5000 18446744073709551615\n")
	got, err := parseStatCPU(stat)
	if err != nil || got != 4*time.Second {
		t.Fatalf("parseStatCPU = %v, %v; want 4s", got, err)
	}
	if _, err := parseStatCPU([]byte("4242 (short) S 1 2")); err == nil {
		t.Fatal("a truncated stat line parsed")
	}
}

func TestParseStatusRSS(t *testing.T) {
	status := []byte("Name:\tonc-agent\nVmPeak:\t  900000 kB\nVmRSS:\t   51200 kB\nThreads:\t12\n")
	got, err := parseStatusRSS(status)
	if err != nil || got != 50<<20 {
		t.Fatalf("parseStatusRSS = %d, %v; want 50 MiB", got, err)
	}
	if _, err := parseStatusRSS([]byte("Name:\tzombie\nState:\tZ (zombie)\n")); err == nil {
		t.Fatal("no VmRSS parsed")
	}
}

func TestMachineCPUCountsStealAsBusy(t *testing.T) {
	a, err := parseMachineCPU([]byte("cpu  100 0 100 700 100 0 0 0 0 0\ncpu0 1 2 3\n"))
	if err != nil {
		t.Fatal(err)
	}
	// 200 more ticks: 50 user, 50 steal, 100 idle → half busy.
	b, err := parseMachineCPU([]byte("cpu  150 0 100 800 100 0 0 50 0 0\n"))
	if err != nil {
		t.Fatal(err)
	}
	if got := a.BusyPct(b); got != 50 {
		t.Fatalf("busy %.1f%%, want 50%%", got)
	}
}
