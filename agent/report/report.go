// Package report holds what every feature's onctl answer shares.
package report

import (
	apiv1 "github.com/onc-net/onc/api/v1"
	"github.com/onc-net/onc/datapath/bpf"
)

// Counters are a program's counters as onctl shows them.
func Counters(program string, cs []bpf.Counter) []*apiv1.Counter {
	out := make([]*apiv1.Counter, len(cs))
	for i, c := range cs {
		out[i] = &apiv1.Counter{Program: program, Name: c.Name, Value: c.Value}
	}
	return out
}
