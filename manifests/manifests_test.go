package manifests

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"
)

// The agent runs as root with three capabilities, not privileged, on a
// read-only root and the runtime's seccomp profile; its init containers
// have none; the controller runs as a non-root user with none.
func TestLeastPrivilege(t *testing.T) {
	var agent appsv1.DaemonSet
	var controller appsv1.Deployment
	decode(t, "DaemonSet", "onc-agent", &agent)
	decode(t, "Deployment", "onc-controller", &controller)

	agentCaps := []corev1.Capability{"NET_ADMIN", "SYS_ADMIN", "NET_RAW"}
	pod := agent.Spec.Template.Spec
	for _, c := range pod.Containers {
		if sc := c.SecurityContext; c.Name != "onc-agent" || sc == nil || sc.Capabilities == nil ||
			!slices.Equal(sc.Capabilities.Add, agentCaps) || !ptr.Deref(sc.ReadOnlyRootFilesystem, false) ||
			sc.SeccompProfile == nil || sc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
			t.Errorf("agent container %s: %+v, want onc-agent with %v, a read-only root and the runtime's seccomp profile", c.Name, sc, agentCaps)
		}
	}
	for _, c := range slices.Concat(pod.InitContainers, pod.Containers) {
		sc := c.SecurityContext
		if sc == nil || sc.Capabilities == nil {
			t.Fatalf("agent container %s: no securityContext capabilities", c.Name)
		}
		if ptr.Deref(sc.Privileged, false) {
			t.Errorf("agent container %s is privileged", c.Name)
		}
		if !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) {
			t.Errorf("agent container %s drops %v, want ALL", c.Name, sc.Capabilities.Drop)
		}
		for _, add := range sc.Capabilities.Add {
			if c.Name != "onc-agent" || !slices.Contains(agentCaps, add) {
				t.Errorf("container %s adds %s", c.Name, add)
			}
		}
		for _, m := range c.VolumeMounts {
			if ptr.Deref(m.MountPropagation, "") == corev1.MountPropagationBidirectional {
				t.Errorf("container %s mounts %s Bidirectional: its mounts would reach the host", c.Name, m.MountPath)
			}
		}
	}
	for _, c := range controller.Spec.Template.Spec.Containers {
		sc := c.SecurityContext
		if sc == nil || !ptr.Deref(sc.RunAsNonRoot, false) || sc.Capabilities == nil || len(sc.Capabilities.Add) > 0 ||
			!slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || ptr.Deref(sc.AllowPrivilegeEscalation, true) {
			t.Errorf("controller container %s: %+v, want non-root, no capabilities, no privilege escalation", c.Name, sc)
		}
	}
}

func decode(t *testing.T, kind, name string, into any) {
	t.Helper()
	objs, err := Objects()
	if err != nil {
		t.Fatal(err)
	}
	for _, u := range objs {
		if u.GetKind() == kind && u.GetName() == name {
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, into); err != nil {
				t.Fatal(err)
			}
			return
		}
	}
	t.Fatalf("onc.yaml has no %s %s", kind, name)
}

// Every ConfigMap key the workloads read is in onc-config, or optional
// (kubelet cannot start a container whose required key is missing). The
// optional ones are the API server's address, which the agent and the
// controller take instead of the kubernetes Service's ClusterIP where they
// are set (without kube-proxy), and which are unset by default, so that
// kubelet's ClusterIP stays.
func TestConfigMapKeys(t *testing.T) {
	var agent appsv1.DaemonSet
	var controller appsv1.Deployment
	var config corev1.ConfigMap
	decode(t, "DaemonSet", "onc-agent", &agent)
	decode(t, "Deployment", "onc-controller", &controller)
	decode(t, "ConfigMap", "onc-config", &config)
	apiServer := map[string]string{"KUBERNETES_SERVICE_HOST": "k8s-service-host", "KUBERNETES_SERVICE_PORT": "k8s-service-port"}
	for _, c := range slices.Concat(agent.Spec.Template.Spec.Containers, controller.Spec.Template.Spec.Containers) {
		fromAPIServer := map[string]bool{}
		for _, e := range c.Env {
			ref := (*corev1.ConfigMapKeySelector)(nil)
			if e.ValueFrom != nil {
				ref = e.ValueFrom.ConfigMapKeyRef
			}
			if ref == nil {
				continue
			}
			if ref.Name != "onc-config" {
				t.Errorf("container %s: env %s from ConfigMap %s", c.Name, e.Name, ref.Name)
			}
			_, set := config.Data[ref.Key]
			optional := ptr.Deref(ref.Optional, false)
			switch {
			case apiServer[e.Name] != "":
				if ref.Key != apiServer[e.Name] || !optional || set {
					t.Errorf("container %s: %s from key %s (optional %v, set %v), want from %s, optional and unset", c.Name, e.Name, ref.Key, optional, set, apiServer[e.Name])
				}
				fromAPIServer[e.Name] = true
			case !set:
				t.Errorf("container %s: env %s from key %s, which onc-config lacks", c.Name, e.Name, ref.Key)
			}
		}
		if len(fromAPIServer) != len(apiServer) {
			t.Errorf("container %s takes %v of %v from onc-config", c.Name, fromAPIServer, apiServer)
		}
	}
	if v := config.Data["kube-proxy-replacement"]; v != "false" {
		t.Errorf("kube-proxy-replacement is %q by default, want \"false\": kube-proxy stays unless the user says", v)
	}
	c := agent.Spec.Template.Spec.Containers[0]
	i := slices.IndexFunc(c.Env, func(e corev1.EnvVar) bool { return e.Name == "KUBE_PROXY_REPLACEMENT" })
	if !slices.Contains(c.Args, "--kube-proxy-replacement=$(KUBE_PROXY_REPLACEMENT)") || i < 0 ||
		c.Env[i].ValueFrom.ConfigMapKeyRef.Key != "kube-proxy-replacement" {
		t.Errorf("the agent's --kube-proxy-replacement does not come from key kube-proxy-replacement: args %v", c.Args)
	}
}

// The install-cni script writes the conflist the replacement setting asks
// for: ONC chained with portmap beside kube-proxy, ONC serving hostPorts
// itself (the portMappings capability) without it.
func TestConflistFollowsTheReplacement(t *testing.T) {
	var agent appsv1.DaemonSet
	decode(t, "DaemonSet", "onc-agent", &agent)
	var script string
	for _, c := range agent.Spec.Template.Spec.InitContainers {
		if c.Name == "install-cni" {
			script = c.Args[0]
		}
	}
	for _, tc := range []struct {
		replace string
		want    []map[string]any
	}{
		{"false", []map[string]any{{"type": "onc", "agentSocket": "/var/run/onc/cni.sock"},
			{"type": "portmap", "capabilities": map[string]any{"portMappings": true}}}},
		{"true", []map[string]any{{"type": "onc", "agentSocket": "/var/run/onc/cni.sock", "capabilities": map[string]any{"portMappings": true}}}},
	} {
		root := t.TempDir()
		for _, d := range []string{"host/opt/cni/bin", "host/etc/cni/net.d", "bin"} {
			if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.WriteFile(filepath.Join(root, "bin", "onc"), nil, 0o755); err != nil {
			t.Fatal(err)
		}
		s := strings.ReplaceAll(strings.ReplaceAll(script, "/host/", root+"/host/"), "/usr/local/bin/onc", root+"/bin/onc")
		cmd := exec.Command("/bin/sh", "-ec", s)
		cmd.Env = []string{"KUBE_PROXY_REPLACEMENT=" + tc.replace}
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("replacement %s: %v\n%s", tc.replace, err, out)
		}
		raw, err := os.ReadFile(filepath.Join(root, "host/etc/cni/net.d/10-onc.conflist"))
		if err != nil {
			t.Fatal(err)
		}
		var conf struct {
			Plugins []map[string]any `json:"plugins"`
		}
		if err := json.Unmarshal(raw, &conf); err != nil {
			t.Fatalf("replacement %s: %v\n%s", tc.replace, err, raw)
		}
		if !reflect.DeepEqual(conf.Plugins, tc.want) {
			t.Errorf("replacement %s: plugins %v, want %v", tc.replace, conf.Plugins, tc.want)
		}
	}
}

// The ClusterNetworkPolicy CRD ends onc.yaml as network-policy-api v0.3.0
// ships it, experimental channel: byte for byte (its SHA-256, and the
// upstream file itself where the Go module cache holds it), serving
// v1alpha2 (what the agent watches) and storing v1beta1, with the
// experimental fields (a standard-channel CRD would prune them).
func TestClusterNetworkPolicyCRD(t *testing.T) {
	const (
		marker   = "# (manifests_test.go checks it): " + upstreamCRD + "\n"
		checksum = "04ad106ac16421e04e3852ee142b116fe18a40b8045178e397d98d2e8a81aefd" // sha256sum of upstreamCRD at v0.3.0
	)
	_, crd, ok := bytes.Cut(oncYAML, []byte(marker))
	if !ok {
		t.Fatalf("onc.yaml has no line %q", marker)
	}
	if sum := sha256.Sum256(crd); hex.EncodeToString(sum[:]) != checksum {
		t.Errorf("the CRD after %q has SHA-256 %x, want %s (network-policy-api v0.3.0's)", marker, sum, checksum)
	}
	if out, err := exec.Command("go", "env", "GOMODCACHE").Output(); err == nil {
		upstream, err := os.ReadFile(filepath.Join(strings.TrimSpace(string(out)), "sigs.k8s.io/network-policy-api@v0.3.0", upstreamCRD))
		switch {
		case err == nil && !bytes.Equal(crd, upstream):
			t.Error("the CRD differs from the module cache's network-policy-api@v0.3.0 file")
		case err != nil && !errors.Is(err, fs.ErrNotExist):
			t.Error(err)
		}
	}

	objs, err := Objects()
	if err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(objs, func(o *unstructured.Unstructured) bool {
		return o.GetKind() == "CustomResourceDefinition" && o.GetName() == "clusternetworkpolicies.policy.networking.k8s.io"
	})
	if i < 0 {
		t.Fatal("onc.yaml has no ClusterNetworkPolicy CRD")
	}
	u := objs[i].Object
	str := func(fields ...string) string {
		s, _, _ := unstructured.NestedString(u, fields...)
		return s
	}
	annotations, _, _ := unstructured.NestedStringMap(u, "metadata", "annotations")
	if g, k, scope := str("spec", "group"), str("spec", "names", "kind"), str("spec", "scope"); g != "policy.networking.k8s.io" ||
		k != "ClusterNetworkPolicy" || scope != "Cluster" || str("spec", "names", "plural") != "clusternetworkpolicies" {
		t.Errorf("group %s, kind %s, scope %s", g, k, scope)
	}
	if v, c := annotations["policy.networking.k8s.io/bundle-version"], annotations["policy.networking.k8s.io/channel"]; v != "v0.3.0" || c != "experimental" {
		t.Errorf("bundle %s, channel %s, want v0.3.0 experimental", v, c)
	}
	versions, _, _ := unstructured.NestedSlice(u, "spec", "versions")
	got := map[string][2]bool{}
	for _, v := range versions {
		m := v.(map[string]any)
		name, _ := m["name"].(string)
		served, _ := m["served"].(bool)
		storage, _ := m["storage"].(bool)
		got[name] = [2]bool{served, storage}
		if name != "v1alpha2" {
			continue
		}
		spec := []string{"schema", "openAPIV3Schema", "properties", "spec", "properties"}
		for _, field := range [][]string{
			{"egress", "items", "properties", "to", "items", "properties", "nodes"},
			{"egress", "items", "properties", "to", "items", "properties", "domainNames"},
			{"egress", "items", "properties", "protocols", "items", "properties", "destinationNamedPort"},
			{"ingress", "items", "properties", "protocols", "items", "properties", "destinationNamedPort"},
		} {
			if _, ok, _ := unstructured.NestedMap(m, slices.Concat(spec, field)...); !ok {
				t.Errorf("v1alpha2 has no %s: not the experimental schema", strings.Join(field, "."))
			}
		}
	}
	if want := map[string][2]bool{"v1alpha2": {true, false}, "v1beta1": {true, true}}; !reflect.DeepEqual(got, want) {
		t.Errorf("versions (served, storage) %v, want %v", got, want)
	}
}

const upstreamCRD = "config/crd/experimental/policy.networking.k8s.io_clusternetworkpolicies.yaml"
