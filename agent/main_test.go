package agent

import (
	"os"
	"testing"

	"github.com/onc-net/onc/internal/testutil"
)

// TestMain removes what the tests share (testutil.Main). Run with
// lockHolderEnv set, the test binary is instead a lock holder that can be
// killed (holdNodeLock).
func TestMain(m *testing.M) {
	if dirs := os.Getenv(lockHolderEnv); dirs != "" {
		os.Exit(holdNodeLock(dirs))
	}
	testutil.Main(m)
}
