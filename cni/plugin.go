// Package cni is the `onc` CNI plugin binary's logic: it hands the runtime's
// request, unchanged, to onc-agent over gRPC on a unix socket and prints
// what the agent answers. It has no networking logic of its own.
package cni

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/cni/pkg/version"
	apiv1 "github.com/onc-net/onc/api/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
)

// DefaultSocket is where onc-agent serves the CNI API.
const DefaultSocket = "/var/run/onc/cni.sock"

// Version is set at build time.
var Version = "dev"

// pluginConf is the part of the network configuration the plugin reads.
type pluginConf struct {
	CNIVersion  string `json:"cniVersion"`
	AgentSocket string `json:"agentSocket"`
	// Timeout for one call to the agent, e.g. "2m" (default 2m).
	Timeout string `json:"timeout"`
}

// Main runs the plugin and exits.
func Main() {
	funcs := skel.CNIFuncs{
		Add:    call(apiv1.CNIClient.Add, true),
		Del:    call(apiv1.CNIClient.Del, false),
		Check:  call(apiv1.CNIClient.Check, false),
		GC:     call(apiv1.CNIClient.GC, false),
		Status: call(apiv1.CNIClient.Status, false),
	}
	if e := skel.PluginMainFuncsWithError(funcs, version.All, "CNI plugin onc "+Version); e != nil {
		printError(e)
		os.Exit(1)
	}
}

// printError writes the spec's error structure, which carries cniVersion.
func printError(e *types.Error) {
	var conf pluginConf
	_ = json.Unmarshal(stdinCopy, &conf)
	if conf.CNIVersion == "" {
		conf.CNIVersion = version.Current()
	}
	out, _ := json.MarshalIndent(struct {
		CNIVersion string `json:"cniVersion"`
		*types.Error
	}{conf.CNIVersion, e}, "", "    ")
	os.Stdout.Write(append(out, '\n'))
}

// stdinCopy keeps the configuration for printError.
var stdinCopy []byte

type rpc func(apiv1.CNIClient, context.Context, *apiv1.CNIRequest, ...grpc.CallOption) (*apiv1.CNIResponse, error)

// agentCall is how the plugin calls the agent: where and for how long.
type agentCall struct {
	socket  string
	timeout time.Duration
}

// maxSocketPath is the longest path a unix socket address holds (sun_path
// without its NUL); a longer one could never be dialled.
const maxSocketPath = 107

// parseConf reads the plugin's part of the network configuration. A
// socket that cannot be dialled is the configuration's error (7), not an
// agent that is down (11): the runtime would retry it forever.
func parseConf(stdin []byte) (agentCall, *types.Error) {
	var conf pluginConf
	if err := json.Unmarshal(stdin, &conf); err != nil {
		return agentCall{}, types.NewError(types.ErrDecodingFailure, "cannot decode the network configuration", err.Error())
	}
	c := agentCall{socket: DefaultSocket, timeout: 2 * time.Minute}
	if conf.AgentSocket != "" {
		if !filepath.IsAbs(conf.AgentSocket) || strings.ContainsRune(conf.AgentSocket, 0) || len(conf.AgentSocket) > maxSocketPath {
			return agentCall{}, types.NewError(types.ErrInvalidNetworkConfig,
				fmt.Sprintf("agentSocket %q: need an absolute path of at most %d bytes", conf.AgentSocket, maxSocketPath), "")
		}
		c.socket = conf.AgentSocket
	}
	if conf.Timeout != "" {
		d, err := time.ParseDuration(conf.Timeout)
		if err != nil || d <= 0 {
			return agentCall{}, types.NewError(types.ErrInvalidNetworkConfig, fmt.Sprintf("timeout %q: not a positive duration", conf.Timeout), "")
		}
		c.timeout = d
	}
	return c, nil
}

// target is the socket as a gRPC target; escaped, since gRPC parses it as
// a URL, and a path with "?", "#" or "%" would name another socket.
func (c agentCall) target() string {
	return (&url.URL{Scheme: "unix", Path: c.socket}).String()
}

func call(method rpc, printResult bool) func(*skel.CmdArgs) error {
	return func(args *skel.CmdArgs) error {
		stdinCopy = args.StdinData
		c, cerr := parseConf(args.StdinData)
		if cerr != nil {
			return cerr
		}
		req, rerr := request(args)
		if rerr != nil {
			return rerr
		}
		resp, err := invoke(c, method, req)
		if err != nil {
			return err
		}
		if e := resp.GetError(); e != nil {
			return types.NewError(uint(e.Code), e.Msg, e.Details)
		}
		if printResult {
			_, werr := os.Stdout.Write(resp.Result)
			if werr != nil {
				return types.NewError(types.ErrIOFailure, "cannot write the result", werr.Error())
			}
		}
		return nil
	}
}

// request is the runtime's request as the agent takes it. gRPC carries
// strings only as UTF-8: a variable that is not would fail in transit as
// an internal error (999), when it is the runtime's (4).
func request(args *skel.CmdArgs) (*apiv1.CNIRequest, *types.Error) {
	for _, v := range []struct{ name, value string }{
		{"CNI_CONTAINERID", args.ContainerID}, {"CNI_NETNS", args.Netns}, {"CNI_IFNAME", args.IfName},
		{"CNI_ARGS", args.Args}, {"CNI_PATH", args.Path},
	} {
		if !utf8.ValidString(v.value) {
			return nil, types.NewError(types.ErrInvalidEnvironmentVariables, v.name+" is not UTF-8", fmt.Sprintf("%q", v.value))
		}
	}
	return &apiv1.CNIRequest{ContainerId: args.ContainerID, Netns: args.Netns, Ifname: args.IfName,
		Args: args.Args, Path: args.Path, Config: args.StdinData}, nil
}

func invoke(c agentCall, method rpc, req *apiv1.CNIRequest) (*apiv1.CNIResponse, error) {
	sock := c.socket
	if _, err := os.Stat(sock); err != nil {
		return nil, types.NewError(types.ErrTryAgainLater, "onc-agent is not reachable at "+sock, err.Error())
	}
	conn, err := grpc.NewClient(c.target(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, types.NewError(types.ErrTryAgainLater, "onc-agent is not reachable at "+sock, err.Error())
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
	defer cancel()
	resp, err := method(apiv1.NewCNIClient(conn), ctx, req)
	if err != nil {
		code := status.Code(err)
		if code == codes.Unavailable || code == codes.DeadlineExceeded {
			return nil, types.NewError(types.ErrTryAgainLater, "onc-agent is not reachable at "+sock, err.Error())
		}
		return nil, types.NewError(types.ErrInternal, "onc-agent call failed", err.Error())
	}
	return resp, nil
}
