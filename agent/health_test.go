package agent

import (
	corev1 "k8s.io/api/core/v1"
	"net"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/onc-net/onc/agent/services"
)

// noInputs is a cluster without Services.
type noInputs struct{}

func (noInputs) Snapshot() services.Snapshot          { return services.Snapshot{} }
func (noInputs) OnChange(fn func())                   { fn() }
func (noInputs) Warn(*corev1.Service, string, string) {}

// kube-proxy's /healthz is the agent's only with the replacement on: with
// kube-proxy present, its port is kube-proxy's.
func TestHealthzOnlyReplacingKubeProxy(t *testing.T) {
	for _, replacing := range []bool{false, true} {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := l.Addr().String()
		l.Close()
		ta := newTestAgent(t, func(c *Config) {
			c.Services, c.Health.Healthz, c.Datapath.KubeProxyReplacement = noInputs{}, addr, replacing
		})
		stop := ta.run(t)
		var names []string
		for _, w := range ta.watchers() {
			names = append(names, w.Status().Name)
		}
		if slices.Contains(names, "health") != replacing {
			t.Errorf("replacing kube-proxy: %v; watchers %v", replacing, names)
		}
		var resp *http.Response
		for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
			if resp, err = http.Get("http://" + addr + "/healthz"); err == nil {
				resp.Body.Close()
				break
			}
		}
		if replacing && (err != nil || resp.StatusCode != http.StatusOK) {
			t.Errorf("replacing kube-proxy, /healthz: %v, %v", resp, err)
		}
		if !replacing && err == nil {
			t.Errorf("beside kube-proxy, the agent serves its /healthz: %s", resp.Status)
		}
		stop()
	}
}
