//go:build e2e

package e2e

import (
	"testing"

	"github.com/onc-net/onc/internal/testutil"
)

// TestMain removes what the tests share (testutil.Main).
func TestMain(m *testing.M) { testutil.Main(m) }
