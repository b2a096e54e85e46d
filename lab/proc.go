package lab

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// userHZ is the unit of /proc's CPU times (USER_HZ, 100 on every Linux
// architecture Go supports; sysconf(_SC_CLK_TCK) needs cgo).
const userHZ = 100

// Usage is a process's CPU time (user + system, all its threads) and
// resident memory at one moment.
type Usage struct {
	CPU time.Duration
	RSS uint64 // bytes
}

// ReadUsage reads /proc/<pid>/stat and /proc/<pid>/status.
func ReadUsage(pid int) (Usage, error) {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return Usage{}, err
	}
	cpu, err := parseStatCPU(stat)
	if err != nil {
		return Usage{}, fmt.Errorf("/proc/%d/stat: %w", pid, err)
	}
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return Usage{}, err
	}
	rss, err := parseStatusRSS(status)
	if err != nil {
		return Usage{}, fmt.Errorf("/proc/%d/status: %w", pid, err)
	}
	return Usage{CPU: cpu, RSS: rss}, nil
}

// parseStatCPU returns utime + stime of a /proc/<pid>/stat line. The
// command name (field 2) is in parentheses and may hold spaces and
// parentheses itself, so fields are counted from the last ')'.
func parseStatCPU(b []byte) (time.Duration, error) {
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, fmt.Errorf("no command name")
	}
	f := strings.Fields(string(b[i+1:]))
	// f[0] is field 3 (state); utime and stime are fields 14 and 15.
	if len(f) < 13 {
		return 0, fmt.Errorf("%d fields after the command name, want at least 13", len(f))
	}
	var ticks uint64
	for _, s := range f[11:13] {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			return 0, err
		}
		ticks += v
	}
	return time.Duration(ticks) * time.Second / userHZ, nil
}

// parseStatusRSS returns VmRSS of /proc/<pid>/status in bytes.
func parseStatusRSS(b []byte) (uint64, error) {
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		rest, ok := strings.CutPrefix(sc.Text(), "VmRSS:")
		if !ok {
			continue
		}
		f := strings.Fields(rest)
		if len(f) != 2 || f[1] != "kB" {
			return 0, fmt.Errorf("VmRSS line %q", sc.Text())
		}
		kb, err := strconv.ParseUint(f[0], 10, 64)
		return kb * 1024, err
	}
	return 0, fmt.Errorf("no VmRSS (a zombie?)")
}

// MachineCPU is the machine's CPU time, busy and total, summed over CPUs.
type MachineCPU struct{ Busy, Total uint64 } // in USER_HZ ticks

// ReadMachineCPU reads the "cpu" line of /proc/stat.
func ReadMachineCPU() (MachineCPU, error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return MachineCPU{}, err
	}
	return parseMachineCPU(b)
}

// parseMachineCPU: idle and iowait are idle; everything else (steal
// included: a neighbour had the CPU) is busy. guest and guest_nice are
// already counted in user and nice.
func parseMachineCPU(b []byte) (MachineCPU, error) {
	line, _, _ := bytes.Cut(b, []byte("\n"))
	f := strings.Fields(string(line))
	if len(f) < 9 || f[0] != "cpu" {
		return MachineCPU{}, fmt.Errorf("/proc/stat first line %q", line)
	}
	var m MachineCPU
	for i, s := range f[1:9] { // user nice system idle iowait irq softirq steal
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			return MachineCPU{}, err
		}
		m.Total += v
		if i != 3 && i != 4 {
			m.Busy += v
		}
	}
	return m, nil
}

// BusyPct is the share of all CPUs busy between m and a later sample.
func (m MachineCPU) BusyPct(later MachineCPU) float64 {
	if later.Total <= m.Total {
		return 0
	}
	return 100 * float64(later.Busy-m.Busy) / float64(later.Total-m.Total)
}
