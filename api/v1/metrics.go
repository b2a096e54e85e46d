package apiv1

import "net"

// MetricsURL is the URL of the agent's /metrics, with the node IP for a
// host that means every address; "" when the agent serves no metrics.
func (x *NodeStatus) MetricsURL() string {
	host, port, err := net.SplitHostPort(x.GetMetricsAddr())
	if err != nil {
		return ""
	}
	if ip := net.ParseIP(host); host == "" || ip != nil && ip.IsUnspecified() {
		host = x.GetNodeIp()
	}
	return "http://" + net.JoinHostPort(host, port) + "/metrics"
}
