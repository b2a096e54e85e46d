package agent

import (
	"testing"

	apiv1 "github.com/onc-net/onc/api/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Found by FuzzListCache: an unknown table on a node without a fast path
// was FailedPrecondition, as if the table were fine.
func TestListCacheRejectsAnUnknownTableWithoutAFastPath(t *testing.T) {
	ta := newReadyAgent(t)
	_, err := ta.ctl.ListCache(ctx(t), &apiv1.ListCacheRequest{Table: "0"})
	if status.Code(err) != codes.InvalidArgument {
		t.Fatalf("table 0 without a fast path: %v, want InvalidArgument", err)
	}
}
