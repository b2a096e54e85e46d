package bpf

import (
	"fmt"
	"strings"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"
)

// MaxEventsPerSecond bounds the events' budget: past it the budget's
// interval (ns) rounds to nothing, and twice it must fit its 32 bits.
const MaxEventsPerSecond = 1_000_000

// EventConstants are the constants of the flow events' budget
// (include/flows.h) for perSecond events of each class on each CPU on
// average, twice that at once; 0 switches events off.
func EventConstants(perSecond uint32) map[string]any {
	var interval uint64
	if perSecond > 0 {
		interval = uint64(time.Second) / uint64(perSecond)
	}
	return map[string]any{"onc_ev_interval_ns": interval, "onc_ev_burst": 2 * perSecond}
}

// ShareEvents makes spec, an object that includes only the flow events'
// part of the fast path's headers (include/flows.h), emit into c's ring
// with c's budget, as Share does for the whole flow cache, and gives it
// the events' constants. With c nil its events go nowhere: the rate stays
// 0, and the verifier prunes them.
func (c *FlowCache) ShareEvents(spec *ebpf.CollectionSpec) (map[string]*ebpf.Map, error) {
	shared := c.Share(spec)
	if c == nil {
		return shared, nil
	}
	constants := map[string]any{}
	for name := range EventConstants(0) {
		constants[name] = c.Constants[name]
	}
	return shared, SetConstants(spec, constants)
}

// EventNames name what flow events carry (include/flows.h), read from
// the objects' BTF so they never drift from the C.
type EventNames struct {
	Classes []string // by enum onc_ev_class: drop, open, learn, ...
	// Tables are, by enum onc_ev_table, the names of the counters enums
	// a reason may be a value of (onc_stat, lb_uplink_stat, ...); Reasons
	// the counter names of each: a drop's reason is the counter it counted
	// in.
	Tables  []string
	Reasons [][]string
}

// LoadEventNames reads the event names from the objects that emit events:
// the fast path's, which declares the enums, and the services' and the
// bypass's, whose counters enums are some of the tables.
func LoadEventNames() (*EventNames, error) {
	var types []*btf.Spec
	for _, load := range []func() (*ebpf.CollectionSpec, error){LoadFastpath, LoadServices, LoadBypass} {
		spec, err := load()
		if err != nil {
			return nil, err
		}
		types = append(types, spec.Types)
	}
	find := func(name string) (*btf.Enum, error) {
		for _, ts := range types {
			var e *btf.Enum
			if err := ts.TypeByName(name, &e); err == nil {
				return e, nil
			}
		}
		return nil, fmt.Errorf("flow events: no enum %s in the objects' BTF", name)
	}
	classes, err := find("onc_ev_class")
	if err != nil {
		return nil, err
	}
	tables, err := find("onc_ev_table")
	if err != nil {
		return nil, err
	}
	n := &EventNames{}
	if n.Classes, err = enumNames(classes, len(classes.Values)-1, "EV_"); err != nil { // less EV_CLASS_MAX
		return nil, err
	}
	if n.Tables, err = enumNames(tables, len(tables.Values), "EV_TABLE_"); err != nil {
		return nil, err
	}
	for _, name := range n.Tables {
		e, err := find(name)
		if err != nil {
			return nil, err
		}
		reasons := make([]string, len(e.Values))
		for _, v := range e.Values {
			if _, r, ok := strings.Cut(v.Name, "STAT_"); ok && v.Value < uint64(len(reasons)) {
				reasons[v.Value] = strings.ToLower(r)
			}
		}
		n.Reasons = append(n.Reasons, reasons)
	}
	return n, nil
}

// Reason names reason of table, or says it has no name.
func (n *EventNames) Reason(table uint8, reason uint16) string {
	if int(table) < len(n.Reasons) && int(reason) < len(n.Reasons[table]) && n.Reasons[table][reason] != "" {
		return n.Reasons[table][reason]
	}
	return fmt.Sprintf("reason %d of table %d", reason, table)
}

// Table names table, or "" for one unknown.
func (n *EventNames) Table(table uint8) string {
	if int(table) < len(n.Tables) {
		return n.Tables[table]
	}
	return ""
}

// Class names class, or says it has no name.
func (n *EventNames) Class(class uint8) string {
	if int(class) < len(n.Classes) {
		return n.Classes[class]
	}
	return fmt.Sprintf("class %d", class)
}
