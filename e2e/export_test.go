//go:build e2e

package e2e

import (
	"bufio"
	"bytes"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	logsv1 "go.opentelemetry.io/proto/otlp/logs/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/onc-net/onc/agent/flows"
	apiv1 "github.com/onc-net/onc/api/v1"
	"github.com/onc-net/onc/internal/testutil"
	"github.com/onc-net/onc/lab"
)

// otelcolConfig has the collector receive OTLP/gRPC on the node's
// loopback and write what it receives to a file, as OTLP JSON.
const otelcolConfig = `receivers:
  otlp:
    protocols:
      grpc:
        endpoint: 127.0.0.1:4317
exporters:
  file:
    path: %s
    flush_interval: 100ms
service:
  telemetry:
    metrics:
      level: none
  pipelines:
    logs:
      receivers: [otlp]
      exporters: [file]
`

// export: with both exports on, a denied connection's record, as onctl
// flows -o json shows it, reaches a real OpenTelemetry Collector (make
// prereqs builds it: e2e/otelcol) with every field intact, and the
// JSON-lines file the same.
func (c *policyCluster) export(t *testing.T) {
	otelcol := os.Getenv("ONC_OTELCOL_BIN")
	_, err := os.Stat(otelcol)
	testutil.Require(t, err == nil, "the OpenTelemetry Collector is not built: run `make prereqs` (it sets ONC_OTELCOL_BIN for make test)")
	b, yb := c.pod("x/b"), c.pod("y/b")
	nb := c.node(b)
	pols := []*networkingv1.NetworkPolicy{netpol("x", "b-from-a-tcp-80", sel("app", "b"), ingressOnly,
		ingressRule(from(networkingv1.NetworkPolicyPeer{PodSelector: selp("app", "a")}), port(corev1.ProtocolTCP, 80)), nil)}
	c.set(t, pols)

	// The collector runs in nb's namespace, where its agent dials it.
	dir := t.TempDir()
	received, file := filepath.Join(dir, "collector.json"), filepath.Join(dir, "agent", "flows.jsonl")
	config := filepath.Join(dir, "otelcol.yaml")
	testutil.Must(t, os.WriteFile(config, fmt.Appendf(nil, otelcolConfig, received), 0o600))
	log := filepath.Join(dir, "otelcol.log")
	testutil.Start(t, log, "ip", "netns", "exec", nb.Netns, otelcol, "--config", config)
	testutil.WaitFor(t, "the collector to start", 30*time.Second, func() bool {
		b, _ := os.ReadFile(log)
		return bytes.Contains(b, []byte("Everything is ready"))
	})
	// Until the restarted agent has enforced the policy, its records
	// cannot name the pod's policies: restartAgent waits for it.
	c.restartAgent(t, nb, pols, "--flows-export-file", file, "--flows-export-otlp", "127.0.0.1:4317")
	defer c.restartAgent(t, nb, pols)

	start := time.Now()
	dst := netip.AddrPortFrom(b.lp.IP, 80)
	local, err := lab.Probe(yb.lp.Netns, "tcp", dst.Addr(), int(dst.Port()), probeTimeout)
	if err == nil {
		t.Fatalf("%s → %s TCP/80 got through", yb.key(), b.key())
	}
	local = probeSource(yb, dst.Addr(), local)
	var rec *apiv1.FlowRecord
	testutil.WaitFor(t, "the denied record in onctl flows", 2*time.Second, func() bool {
		rec = findRecord(c.onctlFlows(t, nb, "--verdict", "denied"), "denied", start, local, dst)
		return rec != nil
	})
	if rec.Policies == nil || rec.Source.GetName() == "" || rec.Destination.GetName() == "" {
		t.Fatalf("the record lacks fields the check is for (both pods, the policy): %v", rec)
	}
	exported(t, received, file, rec)

	// The allowed connection's record names rule 0, which both exports
	// must carry (proto3 would drop a plain zero).
	start = time.Now()
	if local, err = lab.Probe(c.pod("x/a").lp.Netns, "tcp", dst.Addr(), int(dst.Port()), 3*probeTimeout); err != nil {
		t.Fatalf("x/a → %s TCP/80: %v", b.key(), err)
	}
	testutil.WaitFor(t, "the allowed record in onctl flows", 2*time.Second, func() bool {
		rec = findRecord(c.onctlFlows(t, nb, "--verdict", "allowed"), "allowed", start, local, dst)
		return rec != nil
	})
	if rec.Rule == nil || *rec.Rule != 0 {
		t.Fatalf("the allowed record names rule %v, want 0: %v", rec.Rule, rec)
	}
	exported(t, received, file, rec)
}

// exported waits until rec, as onctl flows showed it, is in the
// collector's file received and the JSON-lines file.
func exported(t *testing.T, received, file string, rec *apiv1.FlowRecord) {
	for deadline := time.Now().Add(10 * time.Second); collectorRecord(t, received, rec) == nil || fileRecord(t, file, rec) == nil; time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			got, _ := os.ReadFile(received)
			lines, _ := os.ReadFile(file)
			t.Fatalf("onctl flows shows\n%s\nThe collector has (found: %v)\n%s\nThe file has (found: %v)\n%s", protojson.Format(rec),
				collectorRecord(t, received, rec) != nil, got, fileRecord(t, file, rec) != nil, lines)
		}
	}
}

// collectorRecord finds rec among the records the collector wrote to
// file (OTLP JSON, a request per line), read back as flows.RecordFromOTLP
// reads them: every field equal, and the body its summary.
func collectorRecord(t *testing.T, file string, rec *apiv1.FlowRecord) *apiv1.FlowRecord {
	for _, line := range lines(file) {
		var logs logsv1.LogsData
		if err := protojson.Unmarshal([]byte(line), &logs); err != nil {
			t.Fatalf("%s: %v in %q", file, err, line)
		}
		for _, rl := range logs.ResourceLogs {
			for _, sl := range rl.ScopeLogs {
				for _, lr := range sl.LogRecords {
					r, err := flows.RecordFromOTLP(rl.Resource, lr)
					if err != nil {
						t.Fatalf("%s: %v in %v", file, err, lr)
					}
					if proto.Equal(r, rec) && lr.Body.GetStringValue() == rec.Summary() {
						return r
					}
				}
			}
		}
	}
	return nil
}

// fileRecord finds rec among the JSON lines of file.
func fileRecord(t *testing.T, file string, rec *apiv1.FlowRecord) *apiv1.FlowRecord {
	for _, line := range lines(file) {
		r := &apiv1.FlowRecord{}
		if err := protojson.Unmarshal([]byte(line), r); err != nil {
			t.Fatalf("%s: %v in %q", file, err, line)
		}
		if proto.Equal(r, rec) {
			return r
		}
	}
	return nil
}

func lines(file string) []string {
	f, err := os.Open(file)
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 16<<20)
	for sc.Scan() {
		if s := strings.TrimSpace(sc.Text()); s != "" {
			out = append(out, s)
		}
	}
	return out
}
