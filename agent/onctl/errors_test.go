package onctl_test

import (
	"bytes"
	"strings"
	"testing"

	"github.com/onc-net/onc/agent/onctl"
)

func run(args ...string) (string, error) {
	cmd := onctl.NewCommand()
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetArgs(args)
	err := cmd.Execute()
	return out.String(), err
}

func TestOnctlErrorsAreClear(t *testing.T) {
	if _, err := run("-s", "/nonexistent/agent.sock", "status"); err == nil || !strings.Contains(err.Error(), "/nonexistent/agent.sock") {
		t.Fatalf("unreachable agent: err = %v, want one naming the socket", err)
	}
	if _, err := run("-o", "yaml", "status"); err == nil || !strings.Contains(err.Error(), "table or json") {
		t.Fatalf("bad output format: err = %v", err)
	}
	if _, err := run("-s", "/nonexistent/agent.sock", "flows", "--since", "-5m"); err == nil || !strings.Contains(err.Error(), "--since") {
		t.Fatalf("negative --since: err = %v, want one naming --since", err)
	}
}
