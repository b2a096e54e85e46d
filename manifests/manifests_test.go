package manifests

import (
	"slices"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
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
