// Package npa runs the upstream ClusterNetworkPolicy conformance suite
// (sigs.k8s.io/network-policy-api, conformance/) on the kind bed, whose
// kernel has no SCTP sockets. The tests and the suite's code are upstream's;
// what differs is said here: the base pods lack their SCTP servers, and the
// tests that probe SCTP are skipped through the suite's own SkipTests, so
// the report names them.
package npa

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"

	"sigs.k8s.io/network-policy-api/conformance"
)

// BaseManifests is the path of the suite's base manifests (a Go template
// its applier renders) in conformance.Manifests.
const BaseManifests = "base/manifests.yaml"

// SkipReasons names every upstream test that probes SCTP (agnhost connect
// --protocol=sctp), with the probes it makes. Without SCTP in the kernel an
// allowed probe cannot connect, and a denied one ends in an error rather
// than the TIMEOUT the suite requires of a drop, so each would fail for
// the machine, not for the implementation.
var SkipReasons = map[string]string{
	"CNPAdminTierEgressSCTP":               "every subtest probes SCTP",
	"CNPAdminTierIngressSCTP":              "every subtest probes SCTP",
	"CNPBaselineTierEgressSCTP":            "every subtest probes SCTP",
	"CNPBaselineTierIngressSCTP":           "every subtest probes SCTP",
	"CNPAdminTierGress":                    "every subtest probes SCTP beside TCP and UDP",
	"CNPBaselineTierGress":                 "every subtest probes SCTP beside TCP and UDP",
	"CNPAdminTierEgressInlineCIDRPeers":    "its allow and deny subtests probe SCTP",
	"CNPBaselineTierEgressInlineCIDRPeers": "its allow and deny subtests probe SCTP",
	"CNPAdminTierPortRange":                "both subtests probe an SCTP port range (9003-9005)",
	"CNPBaselineTierPortRange":             "both subtests probe an SCTP port range (9003-9005)",
	"CNPAdminTierEgressNodePeers":          "its deny subtest probes SCTP to a host-network pod",
	"CNPBaselineTierEgressNodePeers":       "its deny subtest probes SCTP to a host-network pod",
}

// A list item begins with "- " after its indentation.
var listItem = regexp.MustCompile(`^( *)- `)

// StripSCTPServers returns the base manifests without the containers that
// run agnhost porter as SCTP servers (SERVE_SCTP_PORT_*): porter exits when
// it cannot listen, so no base pod would become ready. It works on the
// text, leaving the template's actions for the applier to render, and
// fails unless it removed something, so a new upstream layout is noticed.
func StripSCTPServers(manifests string) (string, error) {
	lines := strings.SplitAfter(manifests, "\n")
	var out []string
	removed := 0
	for i := 0; i < len(lines); {
		end := itemEnd(lines, i)
		if end > i && isSCTPServer(lines[i:end]) {
			removed++
			i = end
			continue
		}
		out = append(out, lines[i])
		i++
	}
	if removed == 0 {
		return "", fmt.Errorf("%s: no agnhost porter SCTP server container found", BaseManifests)
	}
	return strings.Join(out, ""), nil
}

// itemEnd returns the end of the list item starting at line i (the first
// later non-blank line indented no deeper than its dash), or i when line i
// starts no list item.
func itemEnd(lines []string, i int) int {
	m := listItem.FindStringSubmatch(lines[i])
	if m == nil {
		return i
	}
	dash := len(m[1])
	j := i + 1
	for ; j < len(lines); j++ {
		trimmed := strings.TrimLeft(lines[j], " ")
		if strings.TrimSpace(trimmed) != "" && len(lines[j])-len(trimmed) <= dash {
			break
		}
	}
	return j
}

// isSCTPServer reports whether a list item runs agnhost porter told to
// serve SCTP, and holds no such item itself: only the innermost item, the
// container, matches (its env list's items hold no command).
func isSCTPServer(item []string) bool {
	porter, sctp := false, false
	for k, l := range item {
		if end := itemEnd(item, k); k > 0 && end > k && isSCTPServer(item[k:end]) {
			return false
		}
		t := strings.TrimSpace(l)
		porter = porter || strings.HasPrefix(t, "command:") && strings.Contains(t, `"/agnhost porter"`)
		sctp = sctp || strings.HasPrefix(t, "- name: SERVE_SCTP_PORT_")
	}
	return porter && sctp
}

// StrippedBaseManifests is the module's base manifests less their SCTP
// servers.
func StrippedBaseManifests() (string, error) {
	b, err := conformance.Manifests.ReadFile(BaseManifests)
	if err != nil {
		return "", err
	}
	return StripSCTPServers(string(b))
}

// ServeTLS serves body over https from a test server in this process until
// the returned stop, and returns its URL. The suite's applier fetches an
// https BaseManifests with http.DefaultClient, which checks the server's
// certificate: so http.DefaultTransport is made to trust this server's
// (and only it: nothing else in the runner fetches through that transport).
func ServeTLS(body string) (url string, stop func()) {
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, body)
	}))
	roots := x509.NewCertPool()
	roots.AddCert(srv.Certificate())
	http.DefaultTransport.(*http.Transport).TLSClientConfig = &tls.Config{RootCAs: roots}
	return srv.URL + "/" + BaseManifests, srv.Close
}
