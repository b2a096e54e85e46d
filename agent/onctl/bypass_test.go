package onctl_test

import (
	"context"
	"encoding/json"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	apiv1 "github.com/onc-net/onc/api/v1"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
)

// fakeAgent answers onctl bypass and status as an agent would; it
// records the switches it is asked for.
type fakeAgent struct {
	apiv1.UnimplementedAgentServer
	mu   sync.Mutex
	list *apiv1.ListBypassResponse
	set  []*apiv1.SetBypassRequest
}

func (f *fakeAgent) GetStatus(context.Context, *apiv1.GetStatusRequest) (*apiv1.NodeStatus, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return &apiv1.NodeStatus{NodeName: "n1", Bypass: f.list.State}, nil
}

func (f *fakeAgent) ListBypass(context.Context, *apiv1.ListBypassRequest) (*apiv1.ListBypassResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.list, nil
}

func (f *fakeAgent) SetBypass(_ context.Context, req *apiv1.SetBypassRequest) (*apiv1.ListBypassResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.set = append(f.set, req)
	return &apiv1.ListBypassResponse{State: &apiv1.BypassState{Mode: req.Mode, MinSize: req.MinSize, Cgroup: "/sys/fs/cgroup"}}, nil
}

func (f *fakeAgent) setState(s *apiv1.BypassState) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.list = &apiv1.ListBypassResponse{State: s}
}

func (f *fakeAgent) switches() []*apiv1.SetBypassRequest {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.set
}

// serve runs agent f on a socket and returns its path.
func serve(t *testing.T, f apiv1.AgentServer) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "agent.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	apiv1.RegisterAgentServer(srv, f)
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(srv.Stop)
	return sock
}

func TestOnctlBypassShowsConnectionsAndCounters(t *testing.T) {
	f := &fakeAgent{list: &apiv1.ListBypassResponse{
		State: &apiv1.BypassState{Mode: "on", Cgroup: "/sys/fs/cgroup"},
		Conns: []*apiv1.BypassConn{
			{Client: "10.244.7.2:40000", Server: "10.244.7.3:8080", ClientPod: "default/client", ServerPod: "default/server", Paired: true, AgeSeconds: 90},
			{Client: "10.244.7.2:40001", Server: "10.244.7.9:8080", ClientPod: "default/client", AgeSeconds: 1},
		},
		Counters: []*apiv1.Counter{
			{Program: "bypass", Name: "recorded", Value: 3}, {Program: "bypass", Name: "redirected_msgs", Value: 7},
			{Program: "bypass", Name: "redirected_bytes", Value: 700}, {Program: "bypass", Name: "fallback_small", Value: 2},
			{Program: "bypass", Name: "skip_remote", Value: 1}, {Program: "bypass", Name: "stack_msgs", Value: 4},
		},
	}}
	sock := serve(t, f)
	out, err := run("-s", sock, "bypass")
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(out, "\n")
	want := []string{
		"Bypass: on (attached to cgroup /sys/fs/cgroup)",
		"",
		"CLIENT POD      CLIENT            SERVER POD      SERVER           PAIRED  AGE",
		"default/client  10.244.7.2:40000  default/server  10.244.7.3:8080  yes     90s",
		"default/client  10.244.7.2:40001  -               10.244.7.9:8080  no      1s",
		"",
		"Counters:  redirected_msgs=7 redirected_bytes=700",
		"           stack_msgs=4",
		"           fallback_small=2",
		"           recorded=3 skip_remote=1",
	}
	if len(lines) < len(want) || strings.Join(lines[:len(want)], "\n") != strings.Join(want, "\n") {
		t.Errorf("onctl bypass:\n%s\nwant:\n%s", out, strings.Join(want, "\n"))
	}

	out, err = run("-s", sock, "bypass", "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	var resp struct {
		Conns []struct {
			ServerPod string `json:"server_pod"`
		} `json:"conns"`
	}
	if err := json.Unmarshal([]byte(out), &resp); err != nil || len(resp.Conns) != 2 || resp.Conns[0].ServerPod != "default/server" {
		t.Errorf("onctl bypass -o json: %+v, %v\n%s", resp, err, out)
	}
}

func TestOnctlBypassSwitches(t *testing.T) {
	f := &fakeAgent{}
	sock := serve(t, f)
	for _, args := range [][]string{{"on"}, {"off"}, {"size", "2048"}} {
		out, err := run(append([]string{"-s", sock, "bypass"}, args...)...)
		if err != nil {
			t.Fatalf("onctl bypass %s: %v", strings.Join(args, " "), err)
		}
		if !strings.Contains(out, "until the agent restarts") {
			t.Errorf("onctl bypass %s does not say the switch lasts until the agent restarts: %q", strings.Join(args, " "), out)
		}
	}
	want := []*apiv1.SetBypassRequest{{Mode: "on"}, {Mode: "off"}, {Mode: "size", MinSize: 2048}}
	got := f.switches()
	if len(got) != len(want) {
		t.Fatalf("switches %v, want %v", got, want)
	}
	for i := range want {
		if !proto.Equal(got[i], want[i]) {
			t.Errorf("switch %d: %v, want %v", i, got[i], want[i])
		}
	}
	for _, args := range [][]string{{"size"}, {"size", "big"}, {"size", "-1"}, {"fast"}} {
		if _, err := run(append([]string{"-s", sock, "bypass"}, args...)...); err == nil {
			t.Errorf("onctl bypass %s succeeded", strings.Join(args, " "))
		}
	}
	if n := len(f.switches()); n != len(want) {
		t.Errorf("bad arguments reached the agent: %d switches", n)
	}
}

func TestOnctlStatusShowsTheBypass(t *testing.T) {
	f := &fakeAgent{}
	sock := serve(t, f)
	for _, tc := range []struct {
		state *apiv1.BypassState
		want  string
	}{
		{&apiv1.BypassState{Mode: "off", Cgroup: "/sys/fs/cgroup"}, "off"},
		{&apiv1.BypassState{Mode: "on", Cgroup: "/sys/fs/cgroup"}, "on (attached to cgroup /sys/fs/cgroup)"},
		{&apiv1.BypassState{Mode: "size", MinSize: 1024, Cgroup: "/sys/fs/cgroup"}, "size ≥ 1024 B (attached to cgroup /sys/fs/cgroup)"},
		{&apiv1.BypassState{Status: "not up yet"}, "unavailable: not up yet"},
		{nil, "-"}, // an agent from before the bypass
	} {
		f.setState(tc.state)
		out, err := run("-s", sock, "status")
		if err != nil {
			t.Fatal(err)
		}
		if line := bypassLine(out); line != tc.want {
			t.Errorf("status with %v: Bypass %q, want %q\n%s", tc.state, line, tc.want, out)
		}
		if tc.state.GetStatus() == "" {
			continue
		}
		// onctl bypass says only why.
		out, err = run("-s", sock, "bypass")
		if err != nil {
			t.Fatal(err)
		}
		if want := "Bypass: " + tc.want + "\n"; out != want {
			t.Errorf("onctl bypass unavailable: %q, want %q", out, want)
		}
	}
}

func bypassLine(out string) string {
	for _, l := range strings.Split(out, "\n") {
		if rest, ok := strings.CutPrefix(l, "Bypass:"); ok {
			return strings.TrimSpace(rest)
		}
	}
	return ""
}
