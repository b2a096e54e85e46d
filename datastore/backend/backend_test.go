package backend

import (
	"context"
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
