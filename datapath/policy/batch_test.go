package policy

import (
	"context"
	"strings"
	"testing"

	"sigs.k8s.io/knftables"
)

// Consecutive element commands on one set, of one verb, become one, of at
// most max elements; anything between them, another set or verb, ends
// the run, and the order of everything stays.
func TestBatchElements(t *testing.T) {
	in := `add table inet onc-policy
add element inet onc-policy a-ports { 10.0.0.1 . 6 . 80 }
add element inet onc-policy a-ports { 10.0.0.2 . 6 . 80-90 }
add element inet onc-policy a-ports { 10.0.0.3 . 6 . 80 }
add element inet onc-policy a-all { 10.0.1.0/24 }
delete element inet onc-policy a-all { 10.0.2.0/24 }
delete element inet onc-policy a-all { 10.0.3.0-10.0.3.7 }
add rule inet onc-policy c ip saddr @a-all return
add element inet onc-policy a-all { 10.0.4.0/24 }
add element inet onc-policy vmap { "veth1" : jump c }
add element inet onc-policy vmap { "veth2" : jump d }
`
	want := `add table inet onc-policy
add element inet onc-policy a-ports { 10.0.0.1 . 6 . 80, 10.0.0.2 . 6 . 80-90 }
add element inet onc-policy a-ports { 10.0.0.3 . 6 . 80 }
add element inet onc-policy a-all { 10.0.1.0/24 }
delete element inet onc-policy a-all { 10.0.2.0/24, 10.0.3.0-10.0.3.7 }
add rule inet onc-policy c ip saddr @a-all return
add element inet onc-policy a-all { 10.0.4.0/24 }
add element inet onc-policy vmap { "veth1" : jump c, "veth2" : jump d }
`
	if got := batchElements(in, 2); got != want {
		t.Errorf("batched:\n%s\nwant:\n%s", got, want)
	}
}

// A transaction knftables refused an operation of does not run: its text
// only carries the error as a comment, which nft would skip.
func TestRunBatchedRefusesAFailedTransaction(t *testing.T) {
	tx := knftables.NewFake(knftables.InetFamily, Table).NewTransaction()
	tx.Add(&knftables.Table{})
	tx.Add(&knftables.Rule{Chain: "c"}) // no rule: knftables refuses it
	err := runBatched(context.Background(), "/nonexistent/nft", tx)
	if err == nil || strings.Contains(err.Error(), "nonexistent") {
		t.Fatalf("runBatched: %v; want the transaction's own error, before nft runs", err)
	}
}
