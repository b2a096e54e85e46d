//go:build privileged

package cni_test

// These tests run the real `onc` binary the way a container runtime does
// (environment + stdin) against a real onc-agent on a lab node, and check
// both the answer (result or CNI error code) and what is left in the kernel.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	apiv1 "github.com/onc-net/onc/api/v1"
	"github.com/onc-net/onc/internal/testutil"
	"github.com/onc-net/onc/lab"
	"github.com/onc-net/onc/lab/labtest"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

type env struct {
	t    *testing.T
	lab  *lab.Lab
	node *lab.Node
}

func newEnv(t *testing.T) *env {
	l := labtest.Lab(t, lab.Options{Nodes: 1})
	return &env{t: t, lab: l, node: l.Nodes[0]}
}

func (e *env) conf(cniVersion string) string {
	return fmt.Sprintf(`{"cniVersion":%q,"name":"onc","type":"onc","agentSocket":%q}`,
		cniVersion, filepath.Join(e.node.Dir, "run", "cni.sock"))
}

// call runs the plugin binary. vars are CNI_* variables; a "" value unsets.
func (e *env) call(stdin string, vars map[string]string) (out []byte, code int) {
	e.t.Helper()
	cmd := exec.Command(filepath.Join(e.lab.BinDir, "onc"))
	cmd.Stdin = strings.NewReader(stdin)
	cmd.Env = []string{"CNI_PATH=" + e.lab.BinDir}
	for k, v := range vars {
		if v != "" {
			cmd.Env = append(cmd.Env, k+"="+v)
		}
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if err == nil {
		return stdout.Bytes(), 0
	}
	if _, ok := err.(*exec.ExitError); !ok {
		e.t.Fatalf("run plugin: %v", err)
	}
	var ce struct {
		CNIVersion string `json:"cniVersion"`
		types.Error
	}
	if jerr := json.Unmarshal(stdout.Bytes(), &ce); jerr != nil || ce.Code == 0 {
		e.t.Fatalf("plugin failed without a CNI error on stdout: %v\nstdout: %s\nstderr: %s", jerr, stdout.String(), stderr.String())
	}
	if ce.CNIVersion == "" || ce.Msg == "" {
		e.t.Fatalf("error result lacks cniVersion or msg: %s", stdout.String())
	}
	return stdout.Bytes(), int(ce.Code)
}

func vars(cmd, id, nsPath string) map[string]string {
	return map[string]string{"CNI_COMMAND": cmd, "CNI_CONTAINERID": id, "CNI_NETNS": nsPath, "CNI_IFNAME": "eth0"}
}

func (e *env) pod(name string) string {
	return testutil.Netns(e.t, e.node.Netns+"-"+name)
}

func (e *env) add(id, nsPath string) *current.Result {
	e.t.Helper()
	out, code := e.call(e.conf("1.1.0"), vars("ADD", id, nsPath))
	if code != 0 {
		e.t.Fatalf("ADD failed with code %d: %s", code, out)
	}
	r, err := current.NewResult(out)
	if err != nil {
		e.t.Fatalf("ADD result %s: %v", out, err)
	}
	return r.(*current.Result)
}

func (e *env) withPrev(r *current.Result) string {
	var m map[string]any
	_ = json.Unmarshal([]byte(e.conf("1.1.0")), &m)
	m["prevResult"] = r
	b, _ := json.Marshal(m)
	return string(b)
}

func (e *env) agent() apiv1.AgentClient {
	conn, err := grpc.NewClient("unix://"+e.node.AgentSocket(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { conn.Close() })
	return apiv1.NewAgentClient(conn)
}

func (e *env) pods() []*apiv1.Pod {
	e.t.Helper()
	resp, err := e.agent().ListPods(context.Background(), &apiv1.ListPodsRequest{})
	if err != nil {
		e.t.Fatal(err)
	}
	return resp.Pods
}

// assertClean: no pod attachment, no host veth, no pod route is left.
func (e *env) assertClean(want int) {
	e.t.Helper()
	if got := e.pods(); len(got) != want {
		e.t.Fatalf("agent holds %d attachments, want %d: %v", len(got), want, got)
	}
	if got := labtest.PodStateOf(e.t, e.node.Netns); got != (labtest.PodState{Veths: want, Routes: want, Neighbours: want}) {
		e.t.Fatalf("node pod state %+v, want %d of each", got, want)
	}
}

func TestAddCheckStatusDelThroughTheBinary(t *testing.T) {
	e := newEnv(t)
	for _, sock := range []string{"cni.sock", "agent.sock"} {
		fi, err := os.Stat(filepath.Join(e.node.Dir, "run", sock))
		if err != nil || fi.Mode().Perm() != 0o600 || fi.Mode().Type() != os.ModeSocket {
			t.Fatalf("%s: %v %v, want a socket with mode 0600", sock, fi.Mode(), err)
		}
	}
	ns := e.pod("a")
	r := e.add("cid-a", ns)

	st, err := e.node.Status(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	podCIDR := netip.MustParsePrefix(st.PodCidr)
	if r.CNIVersion != "1.1.0" || len(r.IPs) != 1 || len(r.Interfaces) != 2 || len(r.Routes) != 1 {
		t.Fatalf("result shape: %+v", r)
	}
	ip, _ := netip.AddrFromSlice(r.IPs[0].Address.IP.To4())
	if !podCIDR.Contains(ip.Unmap()) || r.IPs[0].Gateway.String() != st.Gateway {
		t.Fatalf("IP %s / gateway %s not from node CIDR %s / gateway %s", ip, r.IPs[0].Gateway, podCIDR, st.Gateway)
	}
	if pod := r.Interfaces[*r.IPs[0].Interface]; pod.Name != "eth0" || pod.Sandbox != ns || pod.Mac == "" {
		t.Fatalf("pod interface in result: %+v", pod)
	}
	h := testutil.NetlinkAt(t, filepath.Base(ns))
	eth0, err := h.LinkByName("eth0")
	if err != nil {
		t.Fatal(err)
	}
	if eth0.Attrs().MTU != int(st.PodMtu) || st.PodMtu != 1450 {
		t.Fatalf("pod MTU %d, status says %d, want uplink 1500 − 50", eth0.Attrs().MTU, st.PodMtu)
	}
	addrs, _ := h.AddrList(eth0, unix.AF_INET)
	if len(addrs) != 1 || !addrs[0].IP.Equal(ip.AsSlice()) {
		t.Fatalf("pod addresses %v, want %s", addrs, ip)
	}
	pods := e.pods()
	if len(pods) != 1 || pods[0].Ip != ip.String() || pods[0].ContainerId != "cid-a" {
		t.Fatalf("agent pods: %v", pods)
	}

	if out, code := e.call(e.withPrev(r), vars("CHECK", "cid-a", ns)); code != 0 {
		t.Fatalf("CHECK: %d %s", code, out)
	}
	if out, code := e.call(e.conf("1.1.0"), map[string]string{"CNI_COMMAND": "STATUS"}); code != 0 {
		t.Fatalf("STATUS: %d %s", code, out)
	}
	out, code := e.call("", map[string]string{"CNI_COMMAND": "VERSION"})
	if code != 0 || !strings.Contains(string(out), `"1.1.0"`) {
		t.Fatalf("VERSION: %d %s", code, out)
	}
	for i := 0; i < 2; i++ { // DEL is idempotent
		if out, code := e.call(e.conf("1.1.0"), vars("DEL", "cid-a", ns)); code != 0 {
			t.Fatalf("DEL #%d: %d %s", i+1, code, out)
		}
	}
	e.assertClean(0)
	if _, err := h.LinkByName("eth0"); err == nil {
		t.Fatal("pod eth0 still exists after DEL")
	}
}

func TestBadInputGetsTheRightCodeAndLeavesNothing(t *testing.T) {
	e := newEnv(t)
	ns := e.pod("b")
	cases := []struct {
		name  string
		stdin string
		vars  map[string]string
		code  int
	}{
		{"malformed JSON", `{"cniVersion": "1.1.0", "name": `, vars("ADD", "x", ns), 6},
		{"unknown cniVersion", e.conf("9.9.9"), vars("ADD", "x", ns), 1},
		{"missing CNI_NETNS", e.conf("1.1.0"), vars("ADD", "x", ""), 4},
		{"netns does not exist", e.conf("1.1.0"), vars("ADD", "x", "/run/netns/onc-no-such-ns"), 3},
		{"CHECK of an unknown container", e.withPrev(&current.Result{CNIVersion: "1.1.0"}), vars("CHECK", "nope", ns), 102},
		{"bad timeout in config", strings.Replace(e.conf("1.1.0"), `"type"`, `"timeout":"soon","type"`, 1), vars("ADD", "x", ns), 7},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e.t = t
			out, code := e.call(c.stdin, c.vars)
			if code != c.code {
				t.Fatalf("code %d, want %d: %s", code, c.code, out)
			}
			e.assertClean(0)
		})
	}
	e.t = t

	t.Run("duplicate ADD", func(t *testing.T) {
		e.t = t
		r := e.add("dup", ns)
		out, code := e.call(e.conf("1.1.0"), vars("ADD", "dup", ns))
		if code != 100 {
			t.Fatalf("duplicate ADD: code %d, want 100: %s", code, out)
		}
		// The first attachment is untouched.
		if out, code := e.call(e.withPrev(r), vars("CHECK", "dup", ns)); code != 0 {
			t.Fatalf("CHECK after a rejected duplicate: %d %s", code, out)
		}
		e.assertClean(1)
		if _, code := e.call(e.conf("1.1.0"), vars("DEL", "dup", ns)); code != 0 {
			t.Fatal("DEL failed")
		}
		e.assertClean(0)
	})

	t.Run("CHECK finds a broken pod", func(t *testing.T) {
		e.t = t
		r := e.add("broken", ns)
		h := testutil.NetlinkAt(t, filepath.Base(ns))
		eth0, _ := h.LinkByName("eth0")
		if err := h.RouteDel(&netlink.Route{LinkIndex: eth0.Attrs().Index, Gw: r.IPs[0].Gateway}); err != nil {
			t.Fatal(err)
		}
		out, code := e.call(e.withPrev(r), vars("CHECK", "broken", ns))
		if code != 102 || !strings.Contains(string(out), "default route") {
			t.Fatalf("CHECK of a pod without default route: %d %s", code, out)
		}
		e.call(e.conf("1.1.0"), vars("DEL", "broken", ns))
		e.assertClean(0)
	})
}

// An agent restart keeps every pod's address; while it is down the plugin
// answers "try again later" and names the socket.
func TestAgentDownAndRestart(t *testing.T) {
	e := newEnv(t)
	nsA, nsB := e.pod("a"), e.pod("b")
	r := e.add("keep", nsA)

	e.node.Agent.Stop()
	out, code := e.call(e.conf("1.1.0"), vars("ADD", "while-down", nsB))
	if code != 11 || !strings.Contains(string(out), "cni.sock") {
		t.Fatalf("ADD with the agent down: code %d, want 11 naming the socket: %s", code, out)
	}
	// The failed ADD must not have left an interface in the pod.
	if _, err := testutil.NetlinkAt(t, filepath.Base(nsB)).LinkByName("eth0"); err == nil {
		t.Fatal("ADD with the agent down left eth0 in the pod")
	}

	if err := e.lab.StartAgent(e.node); err != nil {
		t.Fatal(err)
	}
	if err := e.lab.WaitReady(context.Background(), e.node); err != nil {
		t.Fatal(err)
	}
	pods := e.pods()
	if len(pods) != 1 || pods[0].Ip != r.IPs[0].Address.IP.String() {
		t.Fatalf("after restart pods = %v, want the one with %s", pods, r.IPs[0].Address.IP)
	}
	if out, code := e.call(e.withPrev(r), vars("CHECK", "keep", nsA)); code != 0 {
		t.Fatalf("CHECK after agent restart: %d %s", code, out)
	}
	r2 := e.add("after", nsB)
	if r2.IPs[0].Address.IP.Equal(r.IPs[0].Address.IP) {
		t.Fatal("after restart a live address was handed out again")
	}
}

// GC removes every attachment the runtime does not list, through libcni.
func TestGCRemovesAttachmentsNotListed(t *testing.T) {
	e := newEnv(t)
	var keep string
	for i, name := range []string{"g1", "g2", "g3"} {
		ns := e.pod(name)
		e.add(name, ns)
		if i == 0 {
			keep = name
		}
	}
	e.assertClean(3)
	list, err := libcni.ConfListFromBytes([]byte(fmt.Sprintf(`{"cniVersion":"1.1.0","name":"onc","plugins":[{"type":"onc","agentSocket":%q}]}`,
		filepath.Join(e.node.Dir, "run", "cni.sock"))))
	if err != nil {
		t.Fatal(err)
	}
	cfg := libcni.NewCNIConfigWithCacheDir([]string{e.lab.BinDir}, t.TempDir(), nil)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := cfg.GCNetworkList(ctx, list, &libcni.GCArgs{ValidAttachments: []types.GCAttachment{{ContainerID: keep, IfName: "eth0"}}}); err != nil {
		t.Fatal(err)
	}
	e.assertClean(1)
	if p := e.pods(); p[0].ContainerId != keep {
		t.Fatalf("GC kept %s, want %s", p[0].ContainerId, keep)
	}
}

// A node whose controller cannot give it a CIDR is not ready: STATUS says
// 50, ADD says 11 (try again later).
func TestNotReadyNode(t *testing.T) {
	l := labtest.Lab(t, lab.Options{Nodes: 1, ControllerArgs: []string{"--cluster-cidr", "10.244.0.0/24", "--node-prefix-len", "24"}})
	n, err := l.AddNode(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	e := &env{t: t, lab: l, node: n}
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if st, err := n.Status(context.Background()); err == nil {
			if st.Ready {
				t.Fatal("node without a CIDR reports ready")
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("agent socket never came up")
		}
	}
	if out, code := e.call(e.conf("1.1.0"), map[string]string{"CNI_COMMAND": "STATUS"}); code != 50 || !strings.Contains(string(out), "CIDR") {
		t.Fatalf("STATUS: %d %s", code, out)
	}
	if out, code := e.call(e.conf("1.1.0"), vars("ADD", "x", e.pod("x"))); code != 11 {
		t.Fatalf("ADD on a not-ready node: %d %s", code, out)
	}
}
