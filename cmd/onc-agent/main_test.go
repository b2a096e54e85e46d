package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/onc-net/onc/agent"
)

// runAgentEnv makes the test binary run onc-agent's main with its
// arguments, so a test can run the agent as its own process.
const runAgentEnv = "ONC_TEST_RUN_AGENT"

func TestMain(m *testing.M) {
	if os.Getenv(runAgentEnv) == "1" {
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// A second agent on a node refuses to start, naming the one running, before
// it reads or writes anything: nothing but the lock files is in the state
// and run directories afterwards.
func TestSecondAgentRefusesFirst(t *testing.T) {
	cfg := agent.DefaultConfig()
	cfg.NodeName, cfg.StateDir, cfg.RunDir = "node-a", t.TempDir(), t.TempDir()
	lock, err := agent.LockNode(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	second := exec.CommandContext(ctx, os.Args[0], "--node-name", "node-b", "--state-dir", cfg.StateDir, "--run-dir", cfg.RunDir,
		"--bpffs", t.TempDir(), "--etcd-endpoints", "http://127.0.0.1:1")
	second.Env = append(os.Environ(), runAgentEnv+"=1")
	out, err := second.CombinedOutput()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 1 {
		t.Fatalf("the second agent: %v, want exit status 1; output:\n%s", err, out)
	}
	want := fmt.Sprintf("state directory %s is held by another agent (pid %d, node node-a, since ", cfg.StateDir, os.Getpid())
	if !strings.Contains(string(out), want) {
		t.Errorf("the second agent's output does not say %q:\n%s", want, out)
	}
	for _, dir := range []string{cfg.StateDir, cfg.RunDir} {
		entries, err := os.ReadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		if len(entries) != 1 || entries[0].Name() != "agent.lock" {
			t.Errorf("%s holds %v after the refusal, want only agent.lock", dir, entries)
		}
	}
}
