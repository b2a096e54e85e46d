package testutil_test

import (
	"strings"
	"testing"

	"github.com/onc-net/onc/internal/testutil"
)

// internal/ is the bottom layer: it imports no other ONC package, so any
// package, and any package's tests (through testutil), may import it
// without a cycle, and no helper drags a datapath or a datastore backend
// into what uses it.
func TestInternalImportsOnlyInternal(t *testing.T) {
	const module = "github.com/onc-net/onc/"
	for _, p := range testutil.Deps(t, "./internal/...") {
		if strings.HasPrefix(p, module) && !strings.HasPrefix(p, module+"internal/") {
			t.Errorf("internal/ imports %s", p)
		}
	}
}
