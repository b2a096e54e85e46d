package policy

import (
	"log/slog"
	"maps"
	"net/netip"
	"slices"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/onc-net/onc/datapath/policy"
)

// Incremental compiles like Compile, but keeps what its last compile
// found and recompiles only what a change can affect: a full compile
// resolves the peers of every policy selecting a local pod against every
// pod of the cluster (most of a second of CPU at 5,000 pods × 1,000
// policies), and most changes touch one policy, pod or namespace.
//
// What it keeps: each policy parsed, with its rules' peers once resolved;
// each local pod's rules and the policies that select it. On the next
// compile it compares the snapshot's objects with the last one's (the
// informers replace an object on every update and never change one, so a
// different pointer is a change) and
//   - parses again a policy added or changed, and recompiles the local
//     pods it selected before or selects now;
//   - for a pod added, changed or removed (or a local pod's own address
//     changed), looks up again, in the peers of each rule that selected
//     it before or selects it now, only the pod's addresses, old and new;
//     recompiles the local pods of the policies whose peers that changed,
//     and the pod itself if it is local;
//   - for a namespace whose labels changed, does the same for every pod
//     of the namespace.
//
// ClusterNetworkPolicy is coarser (tierChanges): while any exists, a
// change of one, of a node, of a pod (of what the cache keeps of it), of
// a local pod's address or of a namespace's labels recompiles the tier
// rules of every local pod. A change of policies alone resolves only the
// policies added or changed; any other resolves each policy that selects
// a local pod against every pod once. A pod whose tier rules and
// NetworkPolicy rules come out as before keeps its last directions.
// Without any, this costs nothing.
//
// Its result is what Compile returns for the same inputs, which the tests
// check after random sequences of changes. The zero value is ready; the
// first compile is a full one. It is not safe for concurrent use.
type Incremental struct {
	last  *compiler              // nil before the first compile
	local map[string]compiledPod // by key
}

// compiledPod is a local pod as last compiled.
type compiledPod struct {
	lp         LocalPod
	np         policy.Pod // its NetworkPolicy rules alone
	selectedBy []string   // the NetworkPolicies selecting it, by key
	tiers      podTiers
	rules      policy.Pod // np with its tiers
}

// Compile returns what Compile(s, local) would. The local pods' keys must
// be unique, as must each list's of s (as informers' are).
func (inc *Incremental) Compile(s Snapshot, local []LocalPod) policy.Ruleset {
	next := newCompiler(s, local, inc.last)
	warnBadModes(inc.last, next)
	warnCNPs(inc.last, next)
	tiersStale := inc.last == nil
	if !tiersStale {
		policies, peers := tierChanges(inc.last, next)
		if !peers {
			next.keepResolved(inc.last)
		}
		tiersStale = policies || peers
	}
	// The policies added, changed or removed, and those and the others
	// whose rules changed.
	var policies, stale map[string]bool
	if inc.last != nil {
		policies = changedKeys(inc.last.policy, next.policy, func(a, b *networkPolicy) bool { return a == b })
		stale = staleRules(inc.last, next, policies)
	}
	compiled := make(map[string]compiledPod, len(local))
	rs := policy.Ruleset{Pods: make([]policy.Pod, 0, len(local))}
	for _, lp := range local {
		key := lp.key()
		cp, ok := inc.local[key]
		npStale := !ok || inc.recompiles(cp, lp, next, policies, stale)
		if npStale {
			cp.lp = lp
			cp.np, cp.selectedBy = next.compileLocal(lp)
		}
		tiers, tiersNew := cp.tiers, !ok || tiersStale
		if tiersNew {
			tiers = next.compileTiers(lp)
		}
		if npStale || tiersNew && !tiers.equal(cp.tiers) {
			cp.tiers, cp.rules = tiers, withTiers(cp.np, tiers)
		}
		compiled[key] = cp
		rs.Pods = append(rs.Pods, cp.rules)
	}
	sortPods(rs.Pods)
	dropUnselected(next, compiled)
	inc.last, inc.local = next, compiled
	return rs
}

// warnBadModes logs each policy of next whose mode annotation names no
// mode, once: when it is new, or its value is not the one prev had.
func warnBadModes(prev, next *compiler) {
	for _, pol := range next.policies {
		if pol.badMode == "" {
			continue
		}
		if prev != nil {
			if was := prev.policy[pol.key]; was != nil && was.badMode == pol.badMode {
				continue
			}
		}
		slog.Warn("network policy: unknown mode annotation; the policy is enforced", "policy", pol.key,
			"annotation", ModeAnnotation, "value", pol.badMode, "modes", "enforce, audit")
	}
}

// dropUnselected forgets the resolved rules of the policies no local pod
// selects: kept, they would be patched at every change and held for as
// long as the policy lives. A pod selected later resolves them afresh.
func dropUnselected(c *compiler, local map[string]compiledPod) {
	selected := map[string]bool{}
	for _, cp := range local {
		for _, key := range cp.selectedBy {
			selected[key] = true
		}
	}
	for _, pol := range c.policies {
		if !selected[pol.key] {
			pol.rules = nil
		}
	}
}

// recompiles reports whether local pod lp, last compiled as cp, needs
// compiling again against next; policies and stale are Compile's.
func (inc *Incremental) recompiles(cp compiledPod, lp LocalPod, next *compiler, policies, stale map[string]bool) bool {
	key := lp.key()
	pod := next.pods[key]
	if cp.lp.Iface != lp.Iface || !slices.Equal(cp.lp.IPs, lp.IPs) || pod != inc.last.pods[key] {
		return true
	}
	for _, pol := range cp.selectedBy {
		if stale[pol] {
			return true
		}
	}
	if pod == nil {
		return false // selected by nothing, before and now
	}
	// Unchanged, the pod can only be selected anew by a new or changed
	// policy.
	for key := range policies {
		if pol := next.policy[key]; pol != nil && pol.selects(pod) {
			return true
		}
	}
	return false
}

// staleRules is the keys of the policies whose rules may differ between
// prev and next: policies, those added, changed or removed, and those
// carried over whose resolved peers it changes.
func staleRules(prev, next *compiler, policies map[string]bool) map[string]bool {
	stale := maps.Clone(policies)
	changed := changedPeers(prev, next)
	if len(changed) == 0 {
		return stale
	}
	byAddr := make(map[netip.Prefix][]*peerPod, len(next.peers))
	for i := range next.peers {
		for _, a := range next.peers[i].addrs {
			byAddr[a] = append(byAddr[a], &next.peers[i])
		}
	}
	for _, pol := range next.policies {
		if pol.rules != nil && !stale[pol.key] && next.repeer(pol, changed, byAddr) {
			stale[pol.key] = true
		}
	}
	return stale
}

// peerVersion is a pod as one compile sees it as a peer; pod is nil
// where it is none.
type peerVersion struct {
	pod      *corev1.Pod
	addrs    []netip.Prefix
	nsLabels labels.Set
}

// peerChange is a pod that next may select as a peer differently from
// prev.
type peerChange struct{ before, after peerVersion }

// namespaceOnly reports whether only the pod's namespace's labels changed:
// the same object, a peer with the same addresses before and after.
func (ch *peerChange) namespaceOnly() bool {
	return ch.before.pod != nil && ch.before.pod == ch.after.pod && slices.Equal(ch.before.addrs, ch.after.addrs)
}

// changedPeers is the pods that next may select as peers differently from
// prev: those added, changed or removed, with a local pod's address
// changed, or in a namespace whose labels changed. Only they can change a
// rule's peers.
func changedPeers(prev, next *compiler) []*peerChange {
	// A pod's standing as a peer is its object and, while the API shows no
	// address, the local pod's.
	pods := changedKeys(prev.pods, next.pods, func(a, b *corev1.Pod) bool { return a == b })
	for key := range changedKeys(prev.localIP, next.localIP, slices.Equal[[]netip.Addr]) {
		pods[key] = true
	}
	namespaces := changedKeys(prev.namespaces, next.namespaces, maps.Equal)
	if len(pods) == 0 && len(namespaces) == 0 {
		return nil
	}
	byKey := map[string]*peerChange{}
	var changed []*peerChange
	for _, c := range []*compiler{prev, next} {
		for _, pp := range c.peers {
			key := pp.pod.Namespace + "/" + pp.pod.Name
			if !pods[key] && !namespaces[pp.pod.Namespace] {
				continue
			}
			ch := byKey[key]
			if ch == nil {
				ch = &peerChange{}
				byKey[key] = ch
				changed = append(changed, ch)
			}
			v := peerVersion{pp.pod, pp.addrs, c.namespaces[pp.pod.Namespace]}
			if c == prev {
				ch.before = v
			} else {
				ch.after = v
			}
		}
	}
	return changed
}

// repeer updates pol's resolved peers, resolved against the compile
// before c, for c, where the peers in changed are all that differ (byAddr
// is c's peers by address), and reports whether any changed. An address
// no changed pod has keeps its standing; one that a changed pod the rule
// selects (before, now or both) has is looked up again.
func (c *compiler) repeer(pol *networkPolicy, changed []*peerChange, byAddr map[netip.Prefix][]*peerPod) bool {
	ns := pol.np.Namespace
	// The versions of the changed pods rp selected or selects, and their
	// addresses; but a pod it selects as before, with the same object
	// (only its namespace's labels changed), keeps its standing.
	selected := func(rp *rulePeers) (versions []peerVersion, addrs []netip.Prefix) {
		byNamespace := slices.ContainsFunc(rp.selectors, func(s peerSelector) bool { return s.namespaces != nil })
		for _, ch := range changed {
			if !byNamespace && ch.namespaceOnly() {
				continue
			}
			was := ch.before.pod != nil && rp.selects(ns, ch.before.pod, ch.before.nsLabels)
			is := ch.after.pod != nil && rp.selects(ns, ch.after.pod, ch.after.nsLabels)
			if was && is && ch.namespaceOnly() {
				continue
			}
			if was {
				versions, addrs = append(versions, ch.before), append(addrs, ch.before.addrs...)
			}
			if is {
				versions, addrs = append(versions, ch.after), append(addrs, ch.after.addrs...)
			}
		}
		return versions, sortPrefixes(addrs)
	}
	// A pod of c has an address, and rp selects it.
	selects := func(rp *rulePeers, a netip.Prefix, and func(*corev1.Pod) bool) bool {
		return slices.ContainsFunc(byAddr[a], func(pp *peerPod) bool {
			return rp.selects(ns, pp.pod, c.namespaces[pp.pod.Namespace]) && and(pp.pod)
		})
	}
	anyPod := func(*corev1.Pod) bool { return true }
	patch := func(rp *rulePeers, peers, touched []netip.Prefix) []netip.Prefix {
		if rp.everyone {
			return peers // every address, whatever the pods
		}
		return patchPeers(peers, touched, func(a netip.Prefix) bool { return slices.Contains(rp.blocks, a) || selects(rp, a, anyPod) })
	}

	// The rules are patched into copies: the last ruleset holds them.
	patched := false
	ingress := slices.Clone(pol.rules.ingressPeers)
	for ri, before := range ingress {
		rp := &pol.from[ri]
		if _, touched := selected(rp); len(touched) > 0 {
			ingress[ri] = patch(rp, before, touched)
			patched = patched || !slices.Equal(ingress[ri], before)
		}
	}
	egress := slices.Clone(pol.rules.egress)
	for ri, before := range egress {
		rp := &pol.to[ri]
		versions, touched := selected(rp)
		if len(touched) == 0 {
			continue
		}
		er := before
		er.peers = patch(rp, before.peers, touched)
		if rp.namedPorts {
			_, named := splitPorts(pol.np.Spec.Egress[ri].Ports)
			er.named = patchNamed(before.named, touched, versions, named, func(a netip.Prefix, pr policy.PortRange) bool {
				return selects(rp, a, func(pod *corev1.Pod) bool { return slices.Contains(resolve(named, pod), pr) })
			})
		}
		if !slices.Equal(er.peers, before.peers) || !maps.EqualFunc(er.named, before.named, slices.Equal) {
			er.rules = er.compile(pol, ri)
			egress[ri], patched = er, true
		}
	}
	if patched {
		pol.rules = &resolved{ingressPeers: ingress, egress: egress}
	}
	return patched
}

// patchNamed is named, an egress rule's peers by the number their named
// ports resolve to, with the touched addresses looked up again: allows
// says whether a selected pod of the new compile with an address resolves
// a named port to a number. versions are the changed pods the rule
// selected or selects, which may bring numbers named has not.
func patchNamed(named map[policy.PortRange][]netip.Prefix, touched []netip.Prefix, versions []peerVersion, ports []namedPort,
	allows func(netip.Prefix, policy.PortRange) bool) map[policy.PortRange][]netip.Prefix {
	numbers := maps.Clone(named)
	for _, v := range versions {
		for _, pr := range resolve(ports, v.pod) {
			if _, ok := numbers[pr]; !ok {
				numbers[pr] = nil
			}
		}
	}
	for pr, peers := range numbers {
		if peers = patchPeers(peers, touched, func(a netip.Prefix) bool { return allows(a, pr) }); peers != nil {
			numbers[pr] = peers
		} else {
			delete(numbers, pr)
		}
	}
	return numbers
}

// patchPeers is peers, sorted addresses, with the touched ones (sorted)
// looked up again: kept if allows says so, else left out.
func patchPeers(peers, touched []netip.Prefix, allows func(netip.Prefix) bool) []netip.Prefix {
	var kept []netip.Prefix // the touched addresses still allowed, sorted
	for _, a := range touched {
		if allows(a) {
			kept = append(kept, a)
		}
	}
	// Merge peers but the touched addresses with kept, both sorted.
	out := make([]netip.Prefix, 0, len(peers)+len(kept))
	t, k := 0, 0
	for _, p := range peers {
		for t < len(touched) && touched[t].Compare(p) < 0 {
			t++
		}
		if t < len(touched) && touched[t] == p {
			continue
		}
		for k < len(kept) && kept[k].Compare(p) < 0 {
			out = append(out, kept[k])
			k++
		}
		out = append(out, p)
	}
	if out = append(out, kept[k:]...); len(out) == 0 {
		return nil // as selectPeers has it
	}
	return out
}

// changedKeys is the keys whose values differ between a and b, or that
// only one of them has.
func changedKeys[V any](a, b map[string]V, same func(V, V) bool) map[string]bool {
	changed := map[string]bool{}
	for key, va := range a {
		if vb, ok := b[key]; !ok || !same(va, vb) {
			changed[key] = true
		}
	}
	for key := range b {
		if _, ok := a[key]; !ok {
			changed[key] = true
		}
	}
	return changed
}
