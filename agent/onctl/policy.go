package onctl

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	apiv1 "github.com/onc-net/onc/api/v1"
)

func policyCommand(o *options) *cobra.Command {
	var peer, port string
	c := &cobra.Command{Use: "policy [POD]",
		Short: "Policy of this node's pods: NetworkPolicy isolation and ClusterNetworkPolicy tiers, rules, allowed and denied connections, audited policies and what they would deny or allow; POD (namespace/name) in detail",
		Long: "Without POD, one line per pod of this node. With POD (namespace/name), each direction's rules in the order\n" +
			"they judge: the Admin tier's ClusterNetworkPolicy rules, then the NetworkPolicies isolating the pod, then,\n" +
			"where none does, the Baseline tier's. --peer ADDR --port [PROTO/]N names the rule that decides a new\n" +
			"connection with ADDR in each direction (the pod's port N for ingress, the peer's for egress).",
		Example: "  onctl policy\n  onctl policy x/web\n  onctl policy x/web --peer 10.244.2.7 --port TCP/80",
		Args:    cobra.MaximumNArgs(1),
		RunE: func(_ *cobra.Command, args []string) error {
			if len(args) == 0 {
				if peer != "" || port != "" {
					return fmt.Errorf("--peer and --port: give the pod (namespace/name) whose rules judge the connection")
				}
				return o.run(show(apiv1.AgentClient.ListPolicy, &apiv1.ListPolicyRequest{}, printPolicy))
			}
			req := &apiv1.ListPolicyRequest{Pod: args[0], Peer: peer}
			if (peer == "") != (port == "") {
				return fmt.Errorf("--peer and --port: give both, or neither")
			}
			if port != "" {
				var err error
				if req.Protocol, req.Port, err = parsePolicyPort(port); err != nil {
					return err
				}
			}
			return o.run(show(apiv1.AgentClient.ListPolicy, req, printPodPolicy))
		}}
	c.Flags().StringVar(&peer, "peer", "", "with POD: the address of a connection's other end, whose deciding rule each direction names")
	c.Flags().StringVar(&port, "port", "", "with --peer: [PROTO/]N, the port of that connection (TCP by default)")
	return c
}

// parsePolicyPort reads --port [PROTO/]N; the agent checks the protocol.
func parsePolicyPort(s string) (string, uint32, error) {
	proto, num, ok := strings.Cut(s, "/")
	if !ok {
		proto, num = "", s
	}
	n, err := strconv.ParseUint(num, 10, 16)
	if err != nil || n == 0 {
		return "", 0, fmt.Errorf("--port %q: [PROTO/]N, N 1-65535", s)
	}
	return strings.ToUpper(proto), uint32(n), nil
}
