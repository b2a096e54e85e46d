//go:build privileged

package onctl_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/onc-net/onc/lab"
	"github.com/onc-net/onc/lab/labtest"
)

func TestOnctlAgainstARealAgent(t *testing.T) {
	l := labtest.Lab(t, lab.Options{Nodes: 2, PodsPerNode: 1})
	n := l.Nodes[0]
	sock := n.AgentSocket()

	out, err := run("-s", sock, "status")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"Node:       " + n.Name, "Ready:      yes", "onc.vxlan VNI 1 port 4789", "Pod MTU:    1450",
		"Watchers:   peers: applied generation", "Policy:     not enforced: NetworkPolicy needs the Kubernetes datastore",
		"Kube-proxy: beside ONC", "Metrics:    http://" + n.IP.String() + ":9967/metrics"} {
		if !strings.Contains(out, want) {
			t.Errorf("status lacks %q:\n%s", want, out)
		}
	}

	out, err = run("-s", sock, "status", "-o", "json")
	var st struct {
		MetricsAddr string `json:"metrics_addr"`
	}
	if err != nil || json.Unmarshal([]byte(out), &st) != nil || st.MetricsAddr != ":9967" {
		t.Errorf("status -o json: metrics_addr %q (%v), want the agent's default :9967:\n%s", st.MetricsAddr, err, out)
	}

	if out, err := run("-s", sock, "ready"); err != nil || strings.TrimSpace(out) != "ready" {
		t.Fatalf("ready on a ready agent: %q, %v", out, err)
	}
	n.Agent.Stop()
	if _, err := run("-s", sock, "ready", "--timeout", "2s"); err == nil {
		t.Fatal("ready succeeded with the agent stopped")
	}
	if err := l.StartAgent(n); err != nil {
		t.Fatal(err)
	}
	if err := l.WaitReady(context.Background(), n); err != nil {
		t.Fatal(err)
	}

	out, err = run("-s", sock, "pods", "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	var pods struct {
		Pods []struct {
			IP      string `json:"ip"`
			K8sName string `json:"k8s_name"`
		} `json:"pods"`
	}
	if err := json.Unmarshal([]byte(out), &pods); err != nil {
		t.Fatalf("pods -o json is not JSON: %v\n%s", err, out)
	}
	if len(pods.Pods) != 1 || pods.Pods[0].IP != n.Pods[0].IP.String() || pods.Pods[0].K8sName != "p1" {
		t.Fatalf("pods = %+v, want the lab's pod %s", pods, n.Pods[0].IP)
	}

	// An etcd cluster enforces no NetworkPolicy, but records the eBPF
	// programs' events; none of them is a policy verdict.
	if out, err := run("-s", sock, "flows", "--event", "policy"); err != nil || out != "" {
		t.Errorf("flows --event policy on an etcd node: %v %q, want no records", err, out)
	}

	out, err = run("-s", sock, "peers")
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 2 || !strings.HasPrefix(lines[0], "NODE") || !strings.Contains(lines[1], l.Nodes[1].Name) {
		t.Fatalf("peers table:\n%s", out)
	}
	// Columns are aligned: every row starts its second column at the same offset.
	if strings.Index(lines[0], "NODE-IP") != strings.Index(lines[1], l.Nodes[1].IP.String()) {
		t.Fatalf("peers table not aligned:\n%s", out)
	}
	if f := strings.Fields(lines[1]); f[5] != "yes" || f[6] != "yes" {
		t.Fatalf("peer not alive and programmed:\n%s", out)
	}

	// The lab runs on etcd: policy is not enforced, and onctl says why.
	if _, err := run("-s", sock, "policy"); err == nil || !strings.Contains(err.Error(), "needs the Kubernetes datastore") {
		t.Fatalf("onctl policy on etcd: err = %v, want one saying policy needs the Kubernetes datastore", err)
	}
}
