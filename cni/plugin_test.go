package cni

import (
	"context"
	"encoding/json"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	apiv1 "github.com/onc-net/onc/api/v1"
	"google.golang.org/grpc"
)

// statusAgent answers STATUS with success.
type statusAgent struct{ apiv1.UnimplementedCNIServer }

func (statusAgent) Status(context.Context, *apiv1.CNIRequest) (*apiv1.CNIResponse, error) {
	return &apiv1.CNIResponse{}, nil
}

// Found by FuzzParseConf: the target was "unix://" + the path, which gRPC
// parses as a URL, so "?" or "#" cut the path and "%" broke it.
func TestAgentSocketWithURLCharacters(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "a?b#c%d.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	apiv1.RegisterCNIServer(srv, statusAgent{})
	go func() { _ = srv.Serve(l) }()
	defer srv.Stop()
	if _, err := invoke(agentCall{socket: sock, timeout: 10 * time.Second}, apiv1.CNIClient.Status, &apiv1.CNIRequest{}); err != nil {
		t.Fatalf("STATUS through %s: %v", sock, err)
	}
}

// Found by FuzzParseConf (a relative socket; its property then showed too
// long ones and a NUL): a socket the kernel cannot dial was "agent not
// reachable, try again later" (11), which a runtime retries for ever; it
// is the configuration's error.
func TestUndiallableAgentSocketIsInvalidConfig(t *testing.T) {
	for _, sock := range []string{"cni.sock", "/run/" + strings.Repeat("x", maxSocketPath), "/run/onc/cni.sock\x00x"} {
		conf := `{"cniVersion":"1.1.0","name":"onc","type":"onc","agentSocket":` + jsonString(t, sock) + `}`
		if _, e := parseConf([]byte(conf)); e == nil || e.Code != types.ErrInvalidNetworkConfig || !strings.HasPrefix(e.Msg, "agentSocket ") {
			t.Errorf("agentSocket %q: %v, want code %d naming agentSocket", sock, e, types.ErrInvalidNetworkConfig)
		}
	}
}

func jsonString(t *testing.T, s string) string {
	t.Helper()
	b, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// Found by fuzzing: a variable that is not UTF-8 (CNI_IFNAME "eth\xff0")
// failed in gRPC's encoding as "onc-agent call failed" (999).
func TestNonUTF8VariableIsInvalid(t *testing.T) {
	_, e := request(&skel.CmdArgs{ContainerID: "c1", Netns: "/run/netns/p1", IfName: "eth\xff0", Path: "/opt/cni/bin"})
	if e == nil || e.Code != types.ErrInvalidEnvironmentVariables || !strings.HasPrefix(e.Msg, "CNI_IFNAME ") {
		t.Fatalf("CNI_IFNAME eth\\xff0: %v, want code %d naming CNI_IFNAME", e, types.ErrInvalidEnvironmentVariables)
	}
}
