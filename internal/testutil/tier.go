package testutil

import "testing"

// privilegedBuild is true in test binaries built with the privileged or
// e2e tag (tier_privileged.go): make privileged, make e2e, make test.
var privilegedBuild bool

// requireTier fails t when a test that needs root, the kernel or built
// binaries is in the unit tier (a file without a tier's build tag), so that
// such a test cannot land in `make unit`, where it would skip as a user or
// touch the machine as root.
func requireTier(t testing.TB, what string) {
	t.Helper()
	if !privilegedBuild {
		t.Fatalf("%s: this test is not a unit test; put //go:build privileged at the top of its file (CONTRIBUTING.md, \"Test tiers\")", what)
	}
}
