package bench

import (
	"context"
	"encoding/csv"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"time"
)

// RedisTests are the application rows: redis-benchmark's GET and SET,
// RedisClients connections, from the client's endpoint to a redis-server
// at the server's, in every pod-to-pod config.
var RedisTests = []string{"REDIS_GET", "REDIS_SET"}

// RedisClients is redis-benchmark -c.
const RedisClients = 50

const redisPort = "6379"

// RedisServers starts one redis-server per namespace (no persistence, on
// every IPv4 address and, where the namespace has IPv6, every IPv6 one:
// "-::*" is optional), on cpu if it is not empty; stop kills them by PID.
func RedisServers(ctx context.Context, cpu string, netns ...string) (stop func(), err error) {
	stop, err = startIn(netns, func(ns string) []string {
		return pinned(ns, cpu, "redis-server", "--port", redisPort, "--bind", "*", "-::*", "--protected-mode", "no", "--save", "", "--appendonly", "no")
	})
	if err != nil {
		return nil, err
	}
	for _, ns := range netns {
		if err := redisUp(ctx, ns); err != nil {
			stop()
			return nil, err
		}
	}
	return stop, nil
}

// redisUp waits up to 10 s for the redis-server of netns to answer.
func redisUp(ctx context.Context, netns string) error {
	var out []byte
	var err error
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline) && ctx.Err() == nil; time.Sleep(100 * time.Millisecond) {
		out, err = exec.CommandContext(ctx, "ip", "netns", "exec", netns, "redis-cli", "-p", redisPort, "ping").CombinedOutput()
		if err == nil && strings.TrimSpace(string(out)) == "PONG" {
			return nil
		}
	}
	return fmt.Errorf("redis-server in %s did not answer within 10s: %v %s", netns, err, out)
}

// pinned is `ip` arguments running argv in netns, on cpu if it is not empty.
func pinned(netns, cpu string, argv ...string) []string {
	args := []string{"netns", "exec", netns}
	if cpu != "" {
		args = append(args, "taskset", "-c", cpu)
	}
	return append(args, argv...)
}

// Redis runs redis-benchmark's GET and SET from netns against host:
// requests of each, RedisClients at a time, on cpu if it is not empty.
func Redis(ctx context.Context, netns, host string, requests int, cpu string) ([]Sample, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, "ip", pinned(netns, cpu, "redis-benchmark", "-h", host, "-p", redisPort,
		"-t", "get,set", "-c", strconv.Itoa(RedisClients), "-n", strconv.Itoa(requests), "--csv")...).Output()
	if err != nil {
		var stderr []byte
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = ee.Stderr
		}
		return nil, fmt.Errorf("redis-benchmark from %s to %s: %w: %s%s", netns, host, err, out, stderr)
	}
	return parseRedis(out)
}

// parseRedis reads redis-benchmark --csv: a header, then one row per test
// with its name and requests per second.
func parseRedis(out []byte) ([]Sample, error) {
	rows, err := csv.NewReader(strings.NewReader(string(out))).ReadAll()
	if err != nil {
		return nil, fmt.Errorf("redis-benchmark output: %w: %q", err, out)
	}
	if len(rows) < 1 || len(rows[0]) < 2 || rows[0][0] != "test" || rows[0][1] != "rps" {
		return nil, fmt.Errorf("redis-benchmark output has no test,rps header: %q", out)
	}
	var samples []Sample
	for _, row := range rows[1:] {
		rps, err := strconv.ParseFloat(row[1], 64)
		if err != nil || rps <= 0 {
			return nil, fmt.Errorf("redis-benchmark %s: rps %q", row[0], row[1])
		}
		samples = append(samples, Sample{Test: "REDIS_" + row[0], Value: rps, Unit: "requests/s"})
	}
	if len(samples) != len(RedisTests) {
		return nil, fmt.Errorf("redis-benchmark gave %d rows, want GET and SET: %q", len(samples), out)
	}
	return samples, nil
}
