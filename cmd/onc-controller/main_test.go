package main

import (
	"os"
	"strings"
	"testing"
)

// --cluster-cidr is a list in family order, as kube-controller-manager's;
// each family's node prefix length comes from its own flag.
func TestClusterConfigFlags(t *testing.T) {
	for _, c := range []struct {
		cidrs      string
		len4, len6 int
		want       string // the pools, or the error's start
	}{
		{"10.244.0.0/16", 24, 64, "cluster CIDR 10.244.0.0/16 in /24 node blocks"},
		{"10.244.0.0/16,fd00:10:244::/56", 24, 64, "cluster CIDR 10.244.0.0/16 in /24 node blocks and cluster CIDR fd00:10:244::/56 in /64 node blocks"},
		{"fd00:10:244::/56, 10.244.0.0/16", 26, 80, "cluster CIDR fd00:10:244::/56 in /80 node blocks and cluster CIDR 10.244.0.0/16 in /26 node blocks"},
		{"fd00::/48", 24, 64, "cluster CIDR fd00::/48 in /64 node blocks"},
		{"fd00::/48", 24, 24, "--node-prefix-len-ipv6 /24"},
		{"10.244.0.0/16,10.245.0.0/16", 24, 64, "--cluster-cidr 10.244.0.0/16,10.245.0.0/16: two ipv4 ranges"},
		{"10.244.0.0/16,", 24, 64, `--cluster-cidr "10.244.0.0/16,"`},
	} {
		cfg, err := clusterConfig(c.cidrs, c.len4, c.len6)
		got := cfg.String()
		if err != nil {
			got = err.Error()
		}
		if !strings.HasPrefix(got, c.want) {
			t.Errorf("--cluster-cidr %q --node-prefix-len %d --node-prefix-len-ipv6 %d: %s; want %s", c.cidrs, c.len4, c.len6, got, c.want)
		}
	}
}

// The IPv6 node prefix length reaches the controller through an optional
// env (an onc-config from before IPv6 pools lacks the key): unset, the
// default; a value that is not a number, an error naming it.
func TestNodePrefixLenIPv6FromTheEnvironment(t *testing.T) {
	const name = "NODE_PREFIX_LEN_IPV6"
	for _, c := range []struct {
		set, value string
		want       int
		err        string
	}{
		{set: "unset", want: 64},
		{set: "empty", value: "", want: 64},
		{set: "set", value: "80", want: 80},
		{set: "set", value: "/80", err: `NODE_PREFIX_LEN_IPV6="/80": not a number`},
	} {
		if c.set == "unset" {
			t.Setenv(name, "") // restored after the test
			os.Unsetenv(name)
		} else {
			t.Setenv(name, c.value)
		}
		got, err := envInt(name, 64)
		if c.err != "" {
			if err == nil || err.Error() != c.err {
				t.Errorf("%s %q: %d, %v; want the error %s", c.set, c.value, got, err, c.err)
			}
			continue
		}
		if err != nil || got != c.want {
			t.Errorf("%s %q: %d, %v; want %d", c.set, c.value, got, err, c.want)
		}
	}
}
