package policy

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
)

// audited is the direction of the audited policy ns/audit with rules.
func audited(rules ...Rule) *Direction {
	for i := range rules {
		rules[i].Policy = "ns/audit"
	}
	return &Direction{Policies: []string{"ns/audit"}, Rules: rules}
}

// Audit's log prefixes beside the allowed-new logging: an enforcing
// rule's match goes to the allow-log chain (A, the enforcing rules'
// fingerprint), an audited one's to the would-allow chain (U), never to
// the allow-log chain: enforcement did not allow it. W and U carry the
// audited rules' fingerprint, which Logged turns back into those rules
// (and, for U, the enforcing ones beside them). An audited-only direction
// logs W and no A. A change of audited rules alone rewrites the prefixes
// and changes no pod for Revoke.
func TestAuditLogPrefixes(t *testing.T) {
	e, nft := fakeEnforcer(t)
	e.logGroup = 1707
	id := PodID("ns/b")
	in, eg := ingress.chain(id), egress.chain(id)
	apply := func(p Pod, wantChanged ...string) {
		t.Helper()
		p.Key, p.Iface, p.IPs = "ns/b", "vethb", []netip.Addr{netip.MustParseAddr("10.99.0.2")}
		changed, err := e.Apply(Ruleset{Pods: []Pod{p}}, false)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(changed, wantChanged) {
			t.Errorf("Apply changed %v, want %v", changed, wantChanged)
		}
	}
	rules := func(chain string) string {
		t.Helper()
		rs, err := nft.ListRules(context.Background(), chain)
		if err != nil {
			t.Fatalf("chain %s: %v", chain, err)
		}
		var out []string
		for _, r := range rs {
			out = append(out, r.Rule)
		}
		return strings.Join(out, "\n")
	}
	prefix := func(verdict, dir, fp string) string {
		return fmt.Sprintf("prefix %q", "onc1 "+verdict+" "+dir+" "+id+" "+fp)
	}

	enforced := isolate(allow(hosts(0, 2), PortRange{TCP, 80, 80}))
	au1 := audited(allow(prefixes("10.1.0.0/16")))
	apply(Pod{Ingress: enforced, AuditIngress: au1}, "ns/b")
	fpE, fpA1 := e.pods["ns/b"].inLog, e.pods["ns/b"].auInLog
	if fpE == "" || fpA1 == "" || fpE == fpA1 {
		t.Fatalf("fingerprints: enforcing %q, audited %q; want two", fpE, fpA1)
	}
	chain := rules(in)
	for _, line := range strings.Split(chain, "\n") {
		audit := strings.Contains(line, "@"+auditSets(in)+"-")
		if audit && (!strings.HasSuffix(line, "goto "+wouldAllowChain(in)) || strings.Contains(line, "al-")) {
			t.Errorf("an audited lookup does not go to the would-allow chain alone: %s", line)
		}
		if !audit && strings.Contains(line, "@"+in+"-") && !strings.HasSuffix(line, "goto al-"+in) {
			t.Errorf("an enforcing lookup does not go to the allow-log chain: %s", line)
		}
	}
	if !strings.Contains(chain, prefix("D", "in", fpE)) || !strings.Contains(rules("al-"+in), prefix("A", "in", fpE)) {
		t.Errorf("D and A do not carry the enforcing rules' fingerprint %s:\n%s\n%s", fpE, chain, rules("al-"+in))
	}
	if got := rules(wouldAllowChain(in)); !strings.Contains(got, prefix("U", "in", fpA1+" "+fpE)) {
		t.Errorf("the would-allow chain does not log U with the audited rules' fingerprint %s and the enforcing ones' %s:\n%s", fpA1, fpE, got)
	}
	if l, ok := e.Logged(id, true, fpA1); !ok || l.Pod != "ns/b" || l.Direction != au1 {
		t.Errorf("Logged(%s): %+v, %v; want ns/b's audited rules", fpA1, l, ok)
	}

	// The audited rules change, and an audited deny-all comes on the
	// egress no enforcing policy isolates: new prefixes, no pod changed.
	au2 := audited(allow(prefixes("10.2.0.0/16")))
	auEg := audited()
	apply(Pod{Ingress: enforced, AuditIngress: au2, AuditEgress: auEg})
	fpA2, fpW := e.pods["ns/b"].auInLog, e.pods["ns/b"].auEgLog
	if fpA2 == fpA1 || !strings.Contains(rules(wouldAllowChain(in)), prefix("U", "in", fpA2+" "+fpE)) {
		t.Errorf("U after the audited rules changed: fingerprint %s (was %s):\n%s", fpA2, fpA1, rules(wouldAllowChain(in)))
	}
	if got := rules(eg); !strings.Contains(got, prefix("W", "eg", fpW)) || strings.Contains(got, "al-") {
		t.Errorf("the audited-only egress chain logs no W with %s, or goes to an allow-log chain:\n%s", fpW, got)
	}
	if got := rules("al-" + eg); got != "" {
		t.Errorf("the audited-only egress logs allowed connections:\n%s", got)
	}
	if l, ok := e.Logged(id, false, fpW); !ok || l.Direction != auEg {
		t.Errorf("Logged(%s): %+v, %v; want the audited egress alone", fpW, l, ok)
	}
	// The enforcing rules change beside the audited ones: b changed, and
	// U names the new enforcing rules, while a U logged before still
	// resolves to the rules that dropped it.
	enforced2 := isolate(allow(hosts(4, 2), PortRange{TCP, 80, 80}))
	apply(Pod{Ingress: enforced2, AuditIngress: au2, AuditEgress: auEg}, "ns/b")
	fpE2 := e.pods["ns/b"].inLog
	if got := rules(wouldAllowChain(in)); fpE2 == fpE || !strings.Contains(got, prefix("U", "in", fpA2+" "+fpE2)) {
		t.Errorf("U after the enforcing rules changed: want fingerprints %s %s (enforcing was %s):\n%s", fpA2, fpE2, fpE, got)
	}
	for fp, want := range map[string]*Direction{fpE: enforced, fpE2: enforced2, fpA2: au2} {
		if l, ok := e.Logged(id, true, fp); !ok || l.Direction != want {
			t.Errorf("Logged(%s) after the enforcing rules changed: %+v, %v; want %+v", fp, l, ok, want)
		}
	}
}
