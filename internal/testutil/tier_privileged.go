//go:build privileged || e2e

package testutil

func init() { privilegedBuild = true }
