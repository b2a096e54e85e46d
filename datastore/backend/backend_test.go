package backend

import (
	"context"
	"os"
	"strings"
	"testing"

	"github.com/spf13/pflag"
)

func flags(t *testing.T, args ...string) *Flags {
	t.Helper()
	fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
	f := AddFlags(fs)
	if err := fs.Parse(args); err != nil {
		t.Fatal(err)
	}
	return f
}

// Flags that contradict each other are refused with the flag named, before
// anything connects.
func TestContradictoryFlagsAreNamed(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--datastore=consul"}, "--datastore"},
		{[]string{"--kubeconfig=/k"}, "--kubeconfig"},
		{[]string{"--datastore=kubernetes", "--etcd-endpoints=http://127.0.0.1:2379"}, "--etcd-endpoints"},
		{[]string{"--datastore=kubernetes", "--kube-api-qps=0"}, "--kube-api-qps"},
	} {
		_, err := flags(t, c.args...).Open(context.Background(), ForController)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: err = %v, want one naming %s", c.args, err, c.want)
		}
	}
	if err := flags(t).Validate(); err != nil {
		t.Errorf("defaults: %v", err)
	}
}

// Kubernetes without --kubeconfig outside a pod says so.
func TestKubernetesOutsideAPodNeedsAKubeconfig(t *testing.T) {
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	_, err := flags(t, "--datastore=kubernetes").Open(context.Background(), ForController)
	if err == nil || !strings.Contains(err.Error(), "--kubeconfig") {
		t.Fatalf("err = %v, want one pointing at --kubeconfig", err)
	}
}

// The client's rate limits come from the flags, not client-go's defaults.
func TestRESTConfigCarriesTheRateLimits(t *testing.T) {
	dir := t.TempDir()
	kubeconfig := dir + "/kubeconfig"
	conf := "apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: https://127.0.0.1:6443}}]\n" +
		"users: [{name: u, user: {token: x}}]\ncontexts: [{name: x, context: {cluster: c, user: u}}]\ncurrent-context: x\n"
	if err := os.WriteFile(kubeconfig, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := flags(t, "--datastore=kubernetes", "--kubeconfig="+kubeconfig, "--kube-api-qps=75", "--kube-api-burst=150").RESTConfig()
	if err != nil {
		t.Fatal(err)
	}
	if c.QPS != 75 || c.Burst != 150 {
		t.Errorf("QPS %v, burst %d; want 75, 150", c.QPS, c.Burst)
	}
}
