package main

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// Bad values of the export's flags, or of the ConfigMap keys behind them
// (the environment), stop the agent with an error naming the flag.
func TestExportFlagErrors(t *testing.T) {
	dir := t.TempDir()
	junk := filepath.Join(dir, "junk.pem")
	if err := os.WriteFile(junk, []byte("junk"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		args []string
		env  string
		want string
	}{
		{[]string{"--flows-export-otlp=collector"}, "", `--flows-export-otlp "collector": want host:port`},
		{[]string{"--flows-export-otlp=collector:0"}, "", `--flows-export-otlp "collector:0": want host:port`},
		{nil, "FLOWS_EXPORT_OTLP=http://collector:4317", `--flows-export-otlp "http://collector:4317": want host:port`},
		{[]string{"--flows-export-file=flows.jsonl"}, "", `--flows-export-file "flows.jsonl": not an absolute path`},
		{[]string{"--flows-export-otlp=c:4317", "--flows-export-otlp-ca=" + junk}, "", "--flows-export-otlp-ca: " + junk + " holds no PEM certificate"},
		{[]string{"--flows-export-otlp-ca=" + junk}, "", "--flows-export-otlp-ca without --flows-export-otlp"},
		{[]string{"--flows-buffer=0", "--flows-export-otlp=c:4317"}, "", "--flows-buffer is 0"},
		// Not the export's, but a flow records' flag checked the same way:
		// past a million the budget's interval rounds to nothing.
		{[]string{"--flows-events-rate=3000000000"}, "", "--flows-events-rate 3000000000: events a second of each kind on each CPU, 0-1000000"},
		{[]string{"--flows-top-pods=-1"}, "", "--flows-top-pods -1: a number of pods, 0 or more"},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		args := append([]string{"--node-name", "node-a", "--state-dir", t.TempDir(), "--run-dir", t.TempDir(), "--bpffs", t.TempDir(),
			"--etcd-endpoints", "http://127.0.0.1:1"}, c.args...)
		agent := exec.CommandContext(ctx, os.Args[0], args...)
		agent.Env = append(os.Environ(), runAgentEnv+"=1", c.env)
		b, err := agent.CombinedOutput()
		cancel()
		out := strings.ReplaceAll(string(b), `\"`, `"`) // slog's quoting
		var exit *exec.ExitError
		if !errors.As(err, &exit) || exit.ExitCode() != 1 || !strings.Contains(out, "bad flag") || !strings.Contains(out, c.want) {
			t.Errorf("%v %s: %v, output:\n%s\nwant exit status 1 saying %q", c.args, c.env, err, out, c.want)
		}
	}
}
