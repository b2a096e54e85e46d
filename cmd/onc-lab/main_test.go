package main

import (
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

func command(t *testing.T, root *cobra.Command, name string) *cobra.Command {
	t.Helper()
	cmd, _, err := root.Find([]string{name})
	if err != nil || cmd.Name() != name {
		t.Fatalf("no %s command: %v", name, err)
	}
	return cmd
}

// down parses every flag of up (make lab-down takes the LAB_ARGS make lab
// took), the global ones still count, and an unknown flag is still refused.
// Only flags are parsed: nothing runs.
func TestDownAcceptsUpsFlags(t *testing.T) {
	root := newRoot()
	up, down := command(t, root, "up"), command(t, root, "down")
	var upArgs []string
	for _, fs := range []*pflag.FlagSet{up.LocalFlags(), up.InheritedFlags()} {
		fs.VisitAll(func(f *pflag.Flag) { upArgs = append(upArgs, "--"+f.Name+"="+f.DefValue) })
	}
	if len(upArgs) < 3 {
		t.Fatalf("up has only the flags %v", upArgs)
	}
	for _, arg := range upArgs {
		if err := down.ParseFlags([]string{arg}); err != nil {
			t.Errorf("down refuses up's %s: %v", arg, err)
		}
	}

	labArgs := strings.Fields("--nodes 4 --pods 3 --datastore=kubernetes --keep-on-failure --prefix onclabx --state-root /tmp/x")
	if err := down.ParseFlags(labArgs); err != nil {
		t.Fatalf("down refuses %v: %v", labArgs, err)
	}
	if p, r := down.Flags().Lookup("prefix").Value.String(), down.Flags().Lookup("state-root").Value.String(); p != "onclabx" || r != "/tmp/x" {
		t.Errorf("down parsed --prefix %q --state-root %q from %v", p, r, labArgs)
	}
	if err := down.ParseFlags([]string{"--no-such-flag"}); err == nil {
		t.Error("down accepts an unknown flag")
	}
}
