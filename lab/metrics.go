package lab

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"

	"github.com/onc-net/onc/controller"
)

// MetricsTarget is where one of the lab's daemons serves its Prometheus
// metrics: URL, reachable from inside Netns (each daemon listens in its
// own namespace).
type MetricsTarget struct {
	Name  string // the node's, or "controller"
	Netns string
	URL   string
}

// MetricsTargets lists every agent's metrics (as its status gives them),
// in the lab's node order, then the controller's (its default address:
// the lab gives it no --metrics-addr).
func (l *Lab) MetricsTargets(ctx context.Context) ([]MetricsTarget, error) {
	var out []MetricsTarget
	for _, n := range l.Nodes {
		st, err := n.Status(ctx)
		if err != nil {
			return nil, fmt.Errorf("status of %s: %w", n.Name, err)
		}
		if st.MetricsURL() == "" {
			return nil, fmt.Errorf("the agent of %s serves no metrics", n.Name)
		}
		out = append(out, MetricsTarget{Name: n.Name, Netns: n.Netns, URL: st.MetricsURL()})
	}
	_, port, err := net.SplitHostPort(controller.DefaultMetricsAddr)
	if err != nil {
		return nil, err
	}
	return append(out, MetricsTarget{Name: "controller", Netns: l.ctlNetns(),
		URL: "http://" + net.JoinHostPort(controllerIP.String(), port) + "/metrics"}), nil
}

// Command is a shell command that scrapes t.
func (t MetricsTarget) Command() string {
	return fmt.Sprintf("ip netns exec %s curl -s %s", t.Netns, t.URL)
}

// Scrape GETs t's metrics from inside its namespace.
func (t MetricsTarget) Scrape(ctx context.Context) ([]byte, error) {
	c := &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			return DialIn(ctx, t.Netns, network, addr)
		}}}
	defer c.CloseIdleConnections()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, t.URL, nil)
	if err != nil {
		return nil, err
	}
	resp, err := c.Do(req)
	if err != nil {
		return nil, fmt.Errorf("scrape %s: %w", t.Name, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err == nil && resp.StatusCode != http.StatusOK {
		err = fmt.Errorf("%s", resp.Status)
	}
	if err != nil {
		return nil, fmt.Errorf("scrape %s (%s): %w", t.Name, t.URL, err)
	}
	return b, nil
}
