// Command onctl inspects the ONC agent on this node.
package main

import (
	"fmt"
	"os"

	"github.com/onc-net/onc/agent/onctl"
)

func main() {
	if err := onctl.NewCommand().Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "onctl:", err)
		os.Exit(1)
	}
}
