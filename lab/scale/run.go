package scale

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"strings"
	"time"

	"github.com/onc-net/onc/internal/daemon"
	"github.com/onc-net/onc/lab"
)

// Options of a bench run.
type Options struct {
	Datastores []string // "etcd", "kubernetes"
	Nodes      []int    // simulated nodes, one fresh lab per value
	BinDir     string   // onc, onc-agent, onc-controller, onc-lab
	KubeBin    string   // kube-apiserver, for "kubernetes"
	Prefix     string   // the lab's name prefix; default "oncscale"
	Window     time.Duration
	Changes    int           // add/remove cycles timed; default 3
	Timeout    time.Duration // for each wait (allocation, programming); default 15m
	Log        io.Writer
}

// Run measures every datastore at every N, each on a fresh lab. A failed
// measurement is a row with its error, not the end of the run.
func Run(ctx context.Context, o Options) []Row {
	if o.Prefix == "" {
		o.Prefix = "oncscale"
	}
	if o.Changes == 0 {
		o.Changes = 3
	}
	if o.Timeout == 0 {
		o.Timeout = 15 * time.Minute
	}
	var rows []Row
	for _, ds := range o.Datastores {
		for _, n := range o.Nodes {
			r := &run{o: o, row: Row{Datastore: ds, Nodes: n, Date: time.Now().UTC().Format(time.RFC3339)}}
			if err := r.measure(ctx); err != nil {
				r.row.Error = err.Error()
				r.logf("%s N=%d failed during %s: %v", ds, n, phases[min(r.row.Phases, len(phases)-1)], err)
			}
			rows = append(rows, r.row)
			if ctx.Err() != nil {
				return rows
			}
		}
	}
	return rows
}

type run struct {
	o    Options
	row  Row
	lab  *lab.Lab
	sim  *Sim
	node *lab.Node
	k    *Kernel
}

func (r *run) logf(format string, a ...any) {
	if r.o.Log != nil {
		fmt.Fprintf(r.o.Log, "%s "+format+"\n", append([]any{time.Now().Format("15:04:05")}, a...)...)
	}
}

func (r *run) measure(ctx context.Context) (err error) {
	lo := LabOptions(r.row.Datastore)
	lo.Prefix, lo.BinDir, lo.KubeBin = r.o.Prefix, r.o.BinDir, r.o.KubeBin
	r.logf("%s N=%d: lab up", r.row.Datastore, r.row.Nodes)
	if r.lab, err = lab.Up(ctx, lo); err != nil {
		return err
	}
	defer func() {
		if err != nil && r.node != nil {
			err = fmt.Errorf("%w\nagent log %s:\n%s\ncontroller log %s:\n%s", err, r.node.Agent.Log, daemon.Tail(r.node.Agent.Log, 20), r.lab.Controller.Log, daemon.Tail(r.lab.Controller.Log, 20))
		}
		err = errors.Join(err, r.lab.Down())
	}()
	r.node = r.lab.Nodes[0]
	if r.sim, err = NewSim(ctx, r.lab, SimOptions{}); err != nil {
		return err
	}
	defer r.sim.Close()
	if r.k, err = OpenKernel(r.node.Netns); err != nil {
		return err
	}
	defer r.k.Close()
	for _, phase := range []func(context.Context) error{r.allocate, r.cold, r.steady, r.changes} {
		if err := phase(ctx); err != nil {
			return err
		}
		r.row.Phases++
	}
	return nil
}

// allocate registers N nodes and times the controller until every one
// has a CIDR, then the running agent until it has programmed them all.
func (r *run) allocate(ctx context.Context) error {
	n := r.row.Nodes
	start := time.Now()
	names, err := r.sim.Add(ctx, n)
	r.row.RegisterS = time.Since(start).Seconds()
	if err != nil {
		return err
	}
	r.logf("registered %d nodes in %.1fs", n, r.row.RegisterS)
	wctx, cancel := context.WithTimeout(ctx, r.o.Timeout)
	defer cancel()
	last := time.Now()
	err = r.sim.WaitAllocated(wctx, names, func(got int) {
		if time.Since(last) > 10*time.Second {
			r.logf("%d of %d have a CIDR", got, n)
			last = time.Now()
		}
	})
	r.row.AllocS = time.Since(start).Seconds()
	if err != nil {
		r.row.Evidence = fmt.Sprintf("the controller had not allocated every CIDR after %s", r.o.Timeout)
		return err
	}
	r.logf("every node has a CIDR %.1fs after the first registration", r.row.AllocS)
	if err := r.waitProgrammed(ctx); err != nil {
		return err
	}
	r.row.ConvergeS = time.Since(start).Seconds()
	r.logf("the agent programmed all %d peers %.1fs after the first registration", n, r.row.ConvergeS)
	return nil
}

// waitProgrammed waits until the agent reports N programmed peers and the
// kernel holds N peer routes.
func (r *run) waitProgrammed(ctx context.Context) error {
	deadline := time.Now().Add(r.o.Timeout)
	var st AgentState
	var routes int
	for {
		var err error
		if st, err = ReadAgent(ctx, r.node); err == nil && st.Peers == r.row.Nodes {
			if routes, err = r.k.PeerRoutes(); err != nil {
				return err
			}
			if routes == r.row.Nodes {
				return nil
			}
		}
		if !r.node.Agent.Alive() {
			return fmt.Errorf("the agent exited")
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("after %s the agent has %d of %d peers programmed, the kernel %d routes", r.o.Timeout, st.Peers, r.row.Nodes, routes)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// cold restarts the agent on a node wiped as by a reboot and times it
// until every peer is programmed again.
func (r *run) cold(ctx context.Context) error {
	r.node.Agent.Stop()
	if err := r.k.wipe(r.node); err != nil {
		return err
	}
	start := time.Now()
	if err := r.lab.StartAgent(r.node); err != nil {
		return err
	}
	if err := r.waitProgrammed(ctx); err != nil {
		return err
	}
	r.row.ColdS = time.Since(start).Seconds()
	st, err := ReadAgent(ctx, r.node)
	r.row.ColdKernelWrites = st.KernelWrites
	r.logf("cold start: all %d peers programmed in %.1fs, %d kernel writes", r.row.Nodes, r.row.ColdS, st.KernelWrites)
	return err
}

// sample is what the steady-state window compares at its two ends.
type sample struct {
	at       time.Time
	agent    AgentState
	agentUse lab.Usage
	ds, self time.Duration // CPU of the datastore's processes, of this one
	writes   Writes
	machine  lab.MachineCPU
}

func (r *run) sample(ctx context.Context, wc *WriteCounter) (sample, error) {
	s := sample{at: time.Now()}
	var err error
	if s.agent, err = ReadAgent(ctx, r.node); err != nil {
		return s, err
	}
	if s.writes, err = wc.Read(ctx); err != nil {
		return s, err
	}
	if s.agentUse, err = lab.ReadUsage(r.node.Agent.PID); err != nil {
		return s, err
	}
	for _, pid := range r.datastorePIDs() {
		u, err := lab.ReadUsage(pid)
		if err != nil {
			return s, err
		}
		s.ds += u.CPU
	}
	self, err := lab.ReadUsage(os.Getpid())
	if err != nil {
		return s, err
	}
	s.self = self.CPU
	s.machine, err = lab.ReadMachineCPU()
	return s, err
}

// datastorePIDs are the processes serving the datastore and the controller:
// on etcd one (the controller embeds etcd), on Kubernetes three.
func (r *run) datastorePIDs() []int {
	pids := []int{r.lab.Controller.PID}
	if r.lab.APIServer != nil {
		pids = append(pids, r.lab.APIServer.PID, r.lab.Etcd.PID)
	}
	return pids
}

// steady waits for the agent to settle, then watches everything for the
// window: the agent's CPU, memory, kernel writes and watcher signals, the
// datastore's writes and whether the heartbeats keep up.
func (r *run) steady(ctx context.Context) error {
	actx, cancel := context.WithTimeout(ctx, r.o.Timeout)
	defer cancel()
	if err := r.sim.WaitAlive(actx); err != nil {
		r.row.Evidence = "the simulated nodes' leases were not all held: " + err.Error()
		return err
	}
	if err := Settle(ctx, r.node, 5*time.Second, r.o.Timeout); err != nil {
		return err
	}
	wc, err := NewWriteCounter(r.lab)
	if err != nil {
		return err
	}
	r.logf("steady state: watching for %s", r.o.Window)
	a, err := r.sample(ctx, wc)
	if err != nil {
		return err
	}
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(r.o.Window):
	}
	b, err := r.sample(ctx, wc)
	if err != nil {
		return err
	}
	d := b.at.Sub(a.at)
	pct := func(cpu time.Duration) float64 { return 100 * cpu.Seconds() / d.Seconds() }
	x := &r.row
	x.WindowS = d.Seconds()
	x.AgentCPUPct = pct(b.agentUse.CPU - a.agentUse.CPU)
	x.AgentRSSMB = float64(b.agentUse.RSS) / (1 << 20)
	x.PeerKernelWritesDelta = b.agent.KernelWrites - a.agent.KernelWrites
	x.PeersSeenDelta = b.agent.PeersSeen - a.agent.PeersSeen
	x.Writes = a.writes.Rate(b.writes, d)
	x.WritesPerS = x.Writes.Total()
	x.HeartbeatsPerS = wc.Heartbeats(x.Writes)
	x.HeartbeatsWantPerS = HeartbeatRate(x.Datastore, x.Nodes, r.sim.TTL())
	x.DatastoreCPUPct, x.SimCPUPct = pct(b.ds-a.ds), pct(b.self-a.self)
	x.MachineBusyPct = a.machine.BusyPct(b.machine)
	if x.Alive, err = r.sim.Alive(ctx); err != nil {
		return err
	}
	x.Evidence = sustainEvidence(*x)
	x.Sustained = x.Evidence == ""
	r.logf("steady state: agent %.2f%% CPU, %.1f MB; %.1f writes/s (%s); kernel writes %d, watcher signals %d; heartbeats %.1f/s of %.1f/s, %d alive; machine %.0f%% busy",
		x.AgentCPUPct, x.AgentRSSMB, x.WritesPerS, x.Writes, x.PeerKernelWritesDelta, x.PeersSeenDelta, x.HeartbeatsPerS, x.HeartbeatsWantPerS, x.Alive, x.MachineBusyPct)
	return nil
}

// sustainEvidence says why the machine did not sustain the simulated
// datastore's load ("" if it did): heartbeats falling well behind what the
// leases need (the etcd client renews a little after its nominal period),
// or nodes lost to expired leases.
func sustainEvidence(x Row) string {
	var why []string
	if x.HeartbeatsPerS < 0.75*x.HeartbeatsWantPerS {
		why = append(why, fmt.Sprintf("heartbeats at %.1f/s, %.0f %% of the %.1f/s the leases need", x.HeartbeatsPerS, 100*x.HeartbeatsPerS/x.HeartbeatsWantPerS, x.HeartbeatsWantPerS))
	}
	if x.Alive < x.Nodes {
		why = append(why, fmt.Sprintf("%d of %d simulated nodes' leases had expired", x.Nodes-x.Alive, x.Nodes))
	}
	if len(why) == 0 {
		return ""
	}
	return fmt.Sprintf("%s (machine %.0f %% busy, datastore %.1f %% and simulator %.1f %% of a core)", strings.Join(why, "; "), x.MachineBusyPct, x.DatastoreCPUPct, x.SimCPUPct)
}

// changes times one node's arrival (registration until its route is in
// the agent's kernel: the controller allocates and the agent programs)
// and its removal (until the route is gone), Changes times each.
func (r *run) changes(ctx context.Context) error {
	for i := 0; i < r.o.Changes; i++ {
		start := time.Now()
		names, err := r.sim.Add(ctx, 1)
		if err != nil {
			return err
		}
		var cidr netip.Prefix
		if err := r.poll(ctx, func() (bool, error) {
			if !cidr.IsValid() { // not allocated yet
				var err error
				if cidr, err = r.sim.CIDR(ctx, names[0]); err != nil || !cidr.IsValid() {
					return false, err
				}
			}
			return r.k.Routes(cidr)
		}); err != nil {
			return fmt.Errorf("added node %s (CIDR %v): %w", names[0], cidr, err)
		}
		add := time.Since(start).Seconds()
		start = time.Now()
		if err := r.sim.Remove(ctx, names[0]); err != nil {
			return err
		}
		if err := r.poll(ctx, func() (bool, error) { ok, err := r.k.Routes(cidr); return !ok, err }); err != nil {
			return fmt.Errorf("removed node %s (CIDR %s): %w", names[0], cidr, err)
		}
		remove := time.Since(start).Seconds()
		r.row.ChangeAddS = append(r.row.ChangeAddS, add)
		r.row.ChangeRemoveS = append(r.row.ChangeRemoveS, remove)
		r.row.ChangeS = max(r.row.ChangeS, add, remove)
		r.logf("change %d: add visible in %.3fs, removal in %.3fs", i+1, add, remove)
	}
	return nil
}

// poll runs cond every 5 ms (a route lookup is one cheap netlink request)
// until it holds, for at most a minute.
func (r *run) poll(ctx context.Context, cond func() (bool, error)) error {
	deadline := time.Now().Add(time.Minute)
	for {
		ok, err := cond()
		if err != nil || ok {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not visible on the agent's node after a minute")
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
}
