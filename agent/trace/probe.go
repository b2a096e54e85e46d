package trace

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/onc-net/onc/agent/flows"
	apiv1 "github.com/onc-net/onc/api/v1"
	"github.com/onc-net/onc/datapath/l4"
	"github.com/onc-net/onc/internal/netns"
)

// Outcomes of a probe.
const (
	Connected   = "connected"
	Refused     = "refused"
	TimedOut    = "timed-out"
	Replied     = "replied"
	NoReply     = "no-reply"
	Unreachable = "unreachable"
)

// ProbeWait bounds how long a probe waits for an answer, and recordWait
// how long it then waits for the flow records of its packets (the policy
// table's log reaches the agent within about 100 ms).
var (
	ProbeWait  = time.Second
	recordWait = 300 * time.Millisecond
)

// clockSkew is how far behind this node's clock another node's records
// of a probe may be stamped: the probe's own source port tells them apart.
const clockSkew = 2 * time.Second

// probePayload is the one datagram a UDP probe sends.
var probePayload = []byte("onc trace probe\n")

// probing lets one probe run at a time on a node.
var probing = make(chan struct{}, 1)

// sent is what a probe met.
type sent struct {
	local   netip.AddrPort
	outcome string
	err     error // the socket's error behind the outcome, if any
	took    time.Duration
}

// send makes one real connection from the network namespace at path,
// from the address from (port chosen by the kernel) to dst: TCP connects
// and closes without data, UDP sends one datagram and waits for one back.
// The socket is the agent's, made in the pod's namespace, so the socket
// LB translates it as the pod's own (where the agent's cgroup is under
// the LB's).
func send(path string, proto l4.Proto, from netip.Addr, dst netip.AddrPort, wait time.Duration) (sent, error) {
	var s sent
	ns, err := netns.Open(path)
	if err != nil {
		return s, err
	}
	defer ns.Close()
	family, typ := unix.AF_INET, unix.SOCK_STREAM
	if dst.Addr().Is6() {
		family = unix.AF_INET6
	}
	if proto == l4.UDP {
		typ = unix.SOCK_DGRAM
	}
	var fd int
	err = netns.Do(ns, func() (err error) {
		fd, err = unix.Socket(family, typ|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
		return err
	})
	if err != nil {
		return s, fmt.Errorf("probe socket in %s: %w", path, err)
	}
	defer unix.Close(fd)
	if err := unix.Bind(fd, sockaddr(netip.AddrPortFrom(from, 0))); err != nil {
		return s, fmt.Errorf("probe: bind %s: %w", from, err)
	}
	if sa, err := unix.Getsockname(fd); err == nil {
		s.local = addrPort(sa)
	}
	start := time.Now()
	defer func() { s.took = time.Since(start) }()
	err = unix.Connect(fd, sockaddr(dst))
	switch {
	case err == nil && proto == l4.TCP:
		s.outcome = Connected
		return s, nil
	case err != nil && !errors.Is(err, unix.EINPROGRESS):
		s.outcome, s.err = outcomeOf(err), err
		return s, nil
	}
	events := int16(unix.POLLOUT)
	if proto == l4.UDP {
		if _, err := unix.Write(fd, probePayload); err != nil {
			s.outcome, s.err = outcomeOf(err), err
			return s, nil
		}
		events = unix.POLLIN
	}
	pfd := []unix.PollFd{{Fd: int32(fd), Events: events}}
	for deadline := start.Add(wait); ; {
		left := time.Until(deadline)
		if left <= 0 {
			s.outcome = map[l4.Proto]string{l4.TCP: TimedOut, l4.UDP: NoReply}[proto]
			return s, nil
		}
		n, err := unix.Poll(pfd, int(left.Milliseconds())+1)
		if errors.Is(err, unix.EINTR) || err == nil && n == 0 {
			continue
		}
		if err != nil {
			return s, fmt.Errorf("probe: poll: %w", err)
		}
		break
	}
	if proto == l4.UDP {
		if _, err := unix.Read(fd, make([]byte, 64)); err != nil {
			s.outcome, s.err = outcomeOf(err), err
			return s, nil
		}
		s.outcome = Replied
		return s, nil
	}
	if soerr, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_ERROR); err != nil {
		return s, fmt.Errorf("probe: SO_ERROR: %w", err)
	} else if soerr != 0 {
		s.err = unix.Errno(soerr)
		s.outcome = outcomeOf(s.err)
		return s, nil
	}
	s.outcome = Connected
	return s, nil
}

// outcomeOf names what a socket error says of the path.
func outcomeOf(err error) string {
	switch {
	case errors.Is(err, unix.ECONNREFUSED):
		return Refused
	case errors.Is(err, unix.EHOSTUNREACH), errors.Is(err, unix.ENETUNREACH):
		return Unreachable
	case errors.Is(err, unix.ETIMEDOUT):
		return TimedOut
	}
	return "error: " + err.Error()
}

func sockaddr(ap netip.AddrPort) unix.Sockaddr {
	if ap.Addr().Is4() {
		return &unix.SockaddrInet4{Addr: ap.Addr().As4(), Port: int(ap.Port())}
	}
	return &unix.SockaddrInet6{Addr: ap.Addr().As16(), Port: int(ap.Port())}
}

func addrPort(sa unix.Sockaddr) netip.AddrPort {
	switch sa := sa.(type) {
	case *unix.SockaddrInet4:
		return netip.AddrPortFrom(netip.AddrFrom4(sa.Addr), uint16(sa.Port))
	case *unix.SockaddrInet6:
		return netip.AddrPortFrom(netip.AddrFrom16(sa.Addr), uint16(sa.Port))
	}
	return netip.AddrPort{}
}

// probe sends the probe of a trace, gathers this node's and the
// destination pods' nodes' records of it, and judges it against the
// traced answer resp.
func (t *tracer) probe(ctx context.Context, src local, dst end, resp *apiv1.TraceResponse) (*apiv1.TraceProbe, error) {
	path := t.Netns(src.Key)
	if path == "" {
		return nil, fmt.Errorf("probe: no network namespace for %s", src.Key)
	}
	// A caller that gave up while another probe ran sends nothing.
	select {
	case probing <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	defer func() { <-probing }()
	start := time.Now()
	s, err := send(path, t.proto, fromFor(src, dst.ip), netip.AddrPortFrom(dst.ip, dst.port), ProbeWait)
	if err != nil {
		return nil, err
	}
	p := &apiv1.TraceProbe{Local: s.local.String(), Outcome: s.outcome, Seconds: s.took.Seconds()}
	// The policy table's log reaches the agent a little after the drop.
	time.Sleep(recordWait)
	p.Records = t.recordsOf(start, s.local)
	read, unread := t.remoteRecords(ctx, p, resp, s.local, start)
	p.Agreement, p.Detail = judgeProbe(resp, t.proto, s, p.Records, append([]string{t.Node}, read...))
	for _, n := range unread {
		p.Detail += "; " + n
	}
	return p, nil
}

// remoteRecords adds to p the records of the probe from local that the
// nodes of the paths' destination pods made since start, asking each node
// once; it returns the nodes read, and for the others why not.
func (t *tracer) remoteRecords(ctx context.Context, p *apiv1.TraceProbe, resp *apiv1.TraceResponse, local netip.AddrPort, start time.Time) (read, unread []string) {
	asked := map[string]bool{t.Node: true}
	for _, path := range resp.Paths {
		d := path.Destination
		if d.GetKind() != "pod" || asked[d.Node] {
			continue
		}
		asked[d.Node] = true
		ans, why := t.ask(ctx, d.Node, &apiv1.TraceIngressRequest{Source: local.Addr().String(), SourcePort: uint32(local.Port()),
			Destination: d.Ip, Port: d.Port, Protocol: t.proto.String(), RecordsSinceUnixNano: start.Add(-clockSkew).UnixNano()})
		if ans == nil {
			unread = append(unread, d.Node+"'s records unread: "+why)
			continue
		}
		read = append(read, d.Node)
		p.Records = append(p.Records, ans.Records...)
	}
	return read, unread
}

// recordWords is a record in a probe's detail: its node, event (a policy
// verdict's is its verdict), verdict, direction and reason, those it has.
func recordWords(r *apiv1.FlowRecord) string {
	words := []string{r.Node}
	if r.Event != "" && r.Event != flows.EventPolicy {
		words = append(words, r.Event)
	}
	words = append(words, strings.ToUpper(r.Verdict))
	if r.Direction != "" {
		words = append(words, r.Direction)
	}
	s := strings.Join(words, " ")
	if r.Reason != "" {
		s += " (" + r.Reason + ")"
	}
	return s
}

// judgeProbe says whether what the probe met is what the trace gives,
// and why, in words, by the records of the nodes whose records were read.
func judgeProbe(resp *apiv1.TraceResponse, proto l4.Proto, s sent, records []*apiv1.FlowRecord, nodes []string) (agreement, detail string) {
	var seen []string
	for _, r := range records {
		seen = append(seen, recordWords(r))
	}
	saw := strings.Join(nodes, " and ") + " recorded nothing of it"
	if len(seen) > 0 {
		saw = "recorded: " + strings.Join(seen, "; ")
	}
	met := s.outcome
	if s.err != nil {
		met += " (" + s.err.Error() + ")"
	}
	passed := s.outcome == Connected || s.outcome == Replied || s.outcome == Refused
	var lbRefused bool
	for _, h := range resp.Hops {
		lbRefused = lbRefused || h.Step == StepSocketLB && h.Verdict == "refused"
	}
	paths, picked := resp.Paths, ""
	if len(paths) > 1 {
		// A record of the probe's packets names the backend the socket
		// LB picked: judge by its path alone.
		for _, r := range records {
			for _, p := range resp.Paths {
				if r.Destination.GetIp() == p.Destination.GetIp() && r.Destination.GetPort() == p.Destination.GetPort() {
					paths, picked = []*apiv1.TracePath{p}, fmt.Sprintf(" (the socket LB picked %s, as %s's record says)", p.Destination.Summary(), r.Node)
				}
			}
		}
	}
	met += picked
	allowed, denied := 0, 0
	for _, p := range paths {
		if p.Verdict == "allowed" {
			allowed++
		} else {
			denied++
		}
	}
	want := ""
	switch {
	case lbRefused:
		want = "refused at connect by the socket LB"
		if s.outcome == Refused && s.took < ProbeWait/2 {
			return "agrees", fmt.Sprintf("%s in %.3f s: %s; %s", met, s.took.Seconds(), want, saw)
		}
	case allowed > 0 && denied > 0:
		return "agrees", fmt.Sprintf("%s: the Service's backends differ (%d allowed, %d denied) and the socket LB picked one; %s", met, allowed, denied, saw)
	case allowed > 0:
		want = "allowed: an answer from the destination"
		if passed {
			return "agrees", fmt.Sprintf("%s: %s; %s", met, want, saw)
		}
		if proto == l4.UDP && s.outcome == NoReply && !hasDenial(records) {
			return "inconclusive", fmt.Sprintf("%s: allowed, but a UDP server need not answer, and %s recorded no denial; %s", met, strings.Join(nodes, " and "), saw)
		}
	default:
		want = "denied or unreachable: no answer"
		if !passed {
			return "agrees", fmt.Sprintf("%s: %s; %s", met, want, saw)
		}
	}
	return "disagrees", fmt.Sprintf("%s, but the trace says %s; %s", met, want, saw)
}

func hasDenial(records []*apiv1.FlowRecord) bool {
	for _, r := range records {
		if r.Verdict == "denied" {
			return true
		}
	}
	return false
}
