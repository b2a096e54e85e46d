package cni

import (
	"encoding/json"
	"errors"
	"net"
	"net/url"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	apiv1 "github.com/onc-net/onc/api/v1"
	"google.golang.org/protobuf/proto"
)

// FuzzParseConf: any network configuration either says how to call the
// agent — a socket gRPC dials exactly as written and the kernel accepts,
// a positive timeout — or gets the spec's decoding error (6), or its
// invalid-configuration error (7) naming the field.
func FuzzParseConf(f *testing.F) {
	for _, seed := range []string{
		`{"cniVersion":"1.1.0","name":"onc","type":"onc"}`,
		`{"cniVersion":"1.0.0","name":"onc","type":"onc","agentSocket":"/var/run/onc/cni.sock"}`,                // manifests/onc.yaml
		`{"cniVersion":"1.1.0","name":"onc","type":"onc","agentSocket":"/var/run/onc/cni.sock","timeout":"2m"}`, // docs/cni.md
		`{"cniVersion":"1.1.0","name":"onc","type":"onc","agentSocket":"/run/onc-lab/onclab/n1/run/cni.sock"}`,
		`{"cniVersion":"1.1.0","name":"onc","type":"onc","agentSocket":"/var/lib/kubelet/plugins/onc/some/deep/directory/of/a/node/cni.sock"}`,
		`{"cniVersion":"1.1.0","name":"onc","type":"onc","timeout":"soon"}`,
		`{"cniVersion":"1.1.0","name":"onc","type":"onc","timeout":"-1s"}`,
		`{"cniVersion":"1.1.0","agentSocket":5}`,
		`{"cniVersion": `,
		`null`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, stdin []byte) {
		c, e := parseConf(stdin)
		var conf pluginConf
		jerr := json.Unmarshal(stdin, &conf)
		if e != nil {
			checkConfError(t, e, jerr)
			return
		}
		if jerr != nil {
			t.Fatalf("accepted a configuration that does not decode: %v", jerr)
		}
		wantSock := conf.AgentSocket
		if wantSock == "" {
			wantSock = DefaultSocket
		}
		if c.socket != wantSock {
			t.Fatalf("socket %q, configured %q", c.socket, wantSock)
		}
		// gRPC parses the target as a URL and dials its path.
		u, err := url.Parse(c.target())
		if err != nil || u.Scheme != "unix" || u.Host != "" || u.Path != c.socket {
			t.Fatalf("target %q does not name socket %q: %+v, %v", c.target(), c.socket, u, err)
		}
		if strings.ContainsRune(c.socket, 0) {
			t.Fatalf("socket %q has a NUL: the kernel would dial a shorter path", c.socket)
		}
		// The kernel takes the address (the socket need not exist).
		if conn, err := net.Dial("unix", c.socket); errors.Is(err, syscall.EINVAL) {
			t.Fatalf("socket %q cannot be dialled: %v", c.socket, err)
		} else if err == nil {
			conn.Close()
		}
		wantTimeout := 2 * time.Minute
		if conf.Timeout != "" {
			wantTimeout, _ = time.ParseDuration(conf.Timeout)
		}
		if c.timeout <= 0 || c.timeout != wantTimeout {
			t.Fatalf("timeout %v, configured %q", c.timeout, conf.Timeout)
		}
	})
}

// checkConfError: a rejected configuration gets 6 exactly when it does
// not decode, else 7 with a message naming the field.
func checkConfError(t *testing.T, e *types.Error, decodeErr error) {
	t.Helper()
	switch {
	case e.Msg == "":
		t.Fatalf("error %d without a message", e.Code)
	case (e.Code == types.ErrDecodingFailure) != (decodeErr != nil):
		t.Fatalf("code %d (%s), but decoding says %v", e.Code, e.Msg, decodeErr)
	case e.Code == types.ErrInvalidNetworkConfig && !strings.HasPrefix(e.Msg, "agentSocket ") && !strings.HasPrefix(e.Msg, "timeout "):
		t.Fatalf("invalid configuration without naming the field: %s", e.Msg)
	case e.Code != types.ErrDecodingFailure && e.Code != types.ErrInvalidNetworkConfig:
		t.Fatalf("code %d (%s): want %d or %d", e.Code, e.Msg, types.ErrDecodingFailure, types.ErrInvalidNetworkConfig)
	}
}

// FuzzRequest: the runtime's variables either reach the agent as they
// are (the request survives gRPC's encoding unchanged) or get the spec's
// invalid-variables error (4) naming the variable.
func FuzzRequest(f *testing.F) {
	f.Add("0cd6601b7750", "/var/run/netns/cni-1", "eth0", "IgnoreUnknown=1;K8S_POD_NAMESPACE=lab;K8S_POD_NAME=p1", "/opt/cni/bin", []byte(`{"cniVersion":"1.1.0"}`))
	f.Add("", "", "", "", "/opt/cni/bin", []byte(nil)) // STATUS and GC have no attachment
	f.Add("c1", "/run/netns/p1", "eth\xff0", "", "/opt/cni/bin", []byte("{"))
	f.Fuzz(func(t *testing.T, containerID, netns, ifname, args, path string, stdin []byte) {
		req, e := request(&skel.CmdArgs{ContainerID: containerID, Netns: netns, IfName: ifname, Args: args, Path: path, StdinData: stdin})
		if e != nil {
			if e.Code != types.ErrInvalidEnvironmentVariables || !strings.HasPrefix(e.Msg, "CNI_") {
				t.Fatalf("code %d (%s): want %d naming the variable", e.Code, e.Msg, types.ErrInvalidEnvironmentVariables)
			}
			return
		}
		wire, err := proto.Marshal(req)
		if err != nil {
			t.Fatalf("request %v cannot be sent: %v", req, err)
		}
		var got apiv1.CNIRequest
		if err := proto.Unmarshal(wire, &got); err != nil {
			t.Fatalf("the agent cannot read request %v: %v", req, err)
		}
		if got.ContainerId != containerID || got.Netns != netns || got.Ifname != ifname || got.Args != args || got.Path != path || string(got.Config) != string(stdin) {
			t.Fatalf("the agent reads %v, the runtime said %q %q %q %q %q %q", &got, containerID, netns, ifname, args, path, stdin)
		}
	})
}
