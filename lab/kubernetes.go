package lab

import (
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"

	"github.com/onc-net/onc/internal/daemon"
	"github.com/onc-net/onc/internal/kubeapiserver"
	"github.com/onc-net/onc/manifests"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
)

const apiServerPort = 6443

// startKubernetes runs etcd (onc-lab etcd) and kube-apiserver in the
// controller's namespace and applies ONC's CRD and RBAC from the manifest;
// the workloads are the lab's own processes. In a lab with IPv6 pods
// (ipv6) Services may have a cluster IP of each family; the API server
// itself stays IPv4's, as the rest of the control plane.
func (l *Lab) startKubernetes(ctx context.Context, kubeBin string, ipv6 bool) error {
	bin := filepath.Join(kubeBin, "kube-apiserver")
	if _, err := os.Stat(bin); err != nil {
		return fmt.Errorf("kube-apiserver not found in %q (run make kube-bins): %w", kubeBin, err)
	}
	etcdURL := "http://127.0.0.1:2379" // loopback of the controller's namespace
	p, err := daemon.Start(l.ctlNetns(), filepath.Join(l.Dir, "etcd.log"), filepath.Join(l.BinDir, "onc-lab"),
		"etcd", "--dir", filepath.Join(l.Dir, "kube-etcd"), "--listen", etcdURL)
	if err != nil {
		return err
	}
	l.Etcd = p
	if err := l.Save(); err != nil {
		return err
	}
	serviceCIDRs := []string{kubeapiserver.ServiceCIDR}
	if ipv6 {
		serviceCIDRs = append(serviceCIDRs, kubeapiserver.ServiceCIDR6)
	}
	a, err := kubeapiserver.Start(ctx, l.ctlNetns(), filepath.Join(l.Dir, "kube"), bin, etcdURL, controllerIP, apiServerPort, serviceCIDRs...)
	if a != nil {
		l.APIServer = a
	}
	if err != nil {
		return err
	}
	if err := l.Save(); err != nil {
		return err
	}
	if err := a.WriteKubeconfig(l.controllerKubeconfig(), "onc-system:onc-controller", ""); err != nil {
		return err
	}
	return manifests.Apply(ctx, a.RESTConfig(), manifests.NotWorkloads)
}

// controllerKubeconfig is the controller's, as its service account.
func (l *Lab) controllerKubeconfig() string {
	return filepath.Join(l.Dir, "kube", "onc-controller.kubeconfig")
}

// agentKubeconfig writes n's agent's kubeconfig: the agent's service
// account as a pod on n, with the node claim ONC's admission policy checks.
func (l *Lab) agentKubeconfig(n *Node) (string, error) {
	path := filepath.Join(n.Dir, "agent.kubeconfig")
	return path, l.APIServer.WriteKubeconfig(path, "onc-system:onc-agent", n.Name)
}

// createNode registers n as a Kubernetes Node, as its kubelet would: its
// tunnel address as an InternalIP, and in a dual-stack lab its IPv6 one
// too, as a dual-stack kubelet lists both.
func (l *Lab) createNode(ctx context.Context, n *Node) error {
	kube, err := kubernetes.NewForConfig(l.APIServer.RESTConfig())
	if err != nil {
		return err
	}
	addrs := []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: l.TunnelIP(n).String()}}
	if n.IPv6.IsValid() && n.IPv6 != l.TunnelIP(n) {
		addrs = append(addrs, corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: n.IPv6.String()})
	}
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.Name, Labels: map[string]string{"kubernetes.io/hostname": n.Name}},
		Status: corev1.NodeStatus{Addresses: addrs}}
	_, err = kube.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{})
	return err
}

func (l *Lab) deleteNode(ctx context.Context, n *Node) error {
	kube, err := kubernetes.NewForConfig(l.APIServer.RESTConfig())
	if err != nil {
		return err
	}
	err = kube.CoreV1().Nodes().Delete(ctx, n.Name, metav1.DeleteOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}

// Kube is an admin client of the lab's kube-apiserver (Kubernetes mode).
func (l *Lab) Kube() (kubernetes.Interface, error) {
	if l.Datastore != "kubernetes" || l.APIServer == nil {
		return nil, fmt.Errorf("lab %s has no Kubernetes API (datastore %q)", l.Prefix, l.Datastore)
	}
	l.kubeOnce.Do(func() {
		cfg := l.APIServer.RESTConfig()
		// The lab makes what its caller asks for, e.g. two names for one
		// container port on purpose: the API's warnings about it are noise.
		cfg.WarningHandler = rest.NoWarnings{}
		l.kube, l.kubeErr = kubernetes.NewForConfig(cfg)
	})
	return l.kube, l.kubeErr
}

// recordNamespace notes a namespace in the state; labels nil keeps the
// recorded ones.
func (l *Lab) recordNamespace(name string, labels map[string]string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.Namespaces == nil {
		l.Namespaces = map[string]map[string]string{}
	}
	if _, ok := l.Namespaces[name]; !ok || labels != nil {
		l.Namespaces[name] = maps.Clone(labels)
	}
}

// SetNamespace creates the pod namespace name with labels, or gives the
// existing one exactly these labels (the API server keeps its own
// kubernetes.io/metadata.name). In Kubernetes mode the namespace also gets
// its "default" ServiceAccount, which pods need and no controller here
// makes. On etcd the labels are only recorded.
func (l *Lab) SetNamespace(ctx context.Context, name string, labels map[string]string) error {
	if labels == nil {
		labels = map[string]string{}
	}
	if l.Datastore == "kubernetes" {
		if err := l.namespace(ctx, name, labels); err != nil {
			return err
		}
	}
	l.recordNamespace(name, labels)
	return l.Save()
}

// namespace makes sure namespace name and its default ServiceAccount
// exist; labels, if not nil, replace the namespace's labels.
func (l *Lab) namespace(ctx context.Context, name string, labels map[string]string) error {
	kube, err := l.Kube()
	if err != nil {
		return err
	}
	nss := kube.CoreV1().Namespaces()
	_, err = nss.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}, metav1.CreateOptions{})
	switch {
	case apierrors.IsAlreadyExists(err) && labels != nil:
		err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
			ns, err := nss.Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			ns.Labels = maps.Clone(labels)
			_, err = nss.Update(ctx, ns, metav1.UpdateOptions{})
			return err
		})
	case apierrors.IsAlreadyExists(err):
		err = nil
	}
	if err != nil {
		return fmt.Errorf("namespace %s: %w", name, err)
	}
	_, err = kube.CoreV1().ServiceAccounts(name).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("service account %s/default: %w", name, err)
	}
	return nil
}

// createPod makes p's namespace if missing and its Pod object, bound to n
// (pending: no IP yet), and records the object's UID in p.
func (l *Lab) createPod(ctx context.Context, n *Node, p *Pod) error {
	l.mu.Lock()
	_, known := l.Namespaces[p.Namespace]
	l.mu.Unlock()
	if !known {
		if err := l.namespace(ctx, p.Namespace, nil); err != nil {
			return err
		}
		l.recordNamespace(p.Namespace, nil)
	}
	kube, err := l.Kube()
	if err != nil {
		return err
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: p.Name, Namespace: p.Namespace, Labels: maps.Clone(p.Labels)},
		Spec: corev1.PodSpec{NodeName: n.Name, Containers: []corev1.Container{{Name: "c", Image: "lab", Ports: slices.Clone(p.Ports)}},
			TerminationGracePeriodSeconds: ptr.To[int64](0)},
	}
	created, err := kube.CoreV1().Pods(p.Namespace).Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("pod %s: %w", p.Key(), err)
	}
	p.UID = string(created.UID)
	return nil
}

// podRunning writes p's status as its kubelet would once the sandbox has
// its IP: Running, every condition true, status.podIP(s) = p.IP.
func (l *Lab) podRunning(ctx context.Context, n *Node, p *Pod) error {
	kube, err := l.Kube()
	if err != nil {
		return err
	}
	pods := kube.CoreV1().Pods(p.Namespace)
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		pod, err := pods.Get(ctx, p.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		now := metav1.Now()
		var conds []corev1.PodCondition
		for _, c := range []corev1.PodConditionType{corev1.PodScheduled, corev1.PodInitialized, corev1.ContainersReady, corev1.PodReady} {
			conds = append(conds, corev1.PodCondition{Type: c, Status: corev1.ConditionTrue, LastTransitionTime: now})
		}
		podIPs := []corev1.PodIP{{IP: p.IP.String()}}
		if p.IPv6.IsValid() && p.IPv6 != p.IP { // dual-stack
			podIPs = append(podIPs, corev1.PodIP{IP: p.IPv6.String()})
		}
		pod.Status = corev1.PodStatus{
			Phase:      corev1.PodRunning,
			Conditions: conds,
			HostIP:     l.TunnelIP(n).String(), HostIPs: []corev1.HostIP{{IP: l.TunnelIP(n).String()}},
			PodIP: p.IP.String(), PodIPs: podIPs,
			StartTime: &now,
			QOSClass:  corev1.PodQOSBestEffort,
			ContainerStatuses: []corev1.ContainerStatus{{Name: "c", Image: "lab", ImageID: "lab", Ready: true, Started: ptr.To(true),
				ContainerID: "onc-lab://" + p.ContainerID, State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: now}}}},
		}
		_, err = pods.UpdateStatus(ctx, pod, metav1.UpdateOptions{})
		return err
	})
}

// deletePod deletes p's Pod object at once (no kubelet waits on it here).
func (l *Lab) deletePod(ctx context.Context, p *Pod) error {
	kube, err := l.Kube()
	if err != nil {
		return err
	}
	err = kube.CoreV1().Pods(p.Namespace).Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete pod %s: %w", p.Key(), err)
	}
	return nil
}

// DeletePodObject deletes p's Pod object but leaves its attachment, as
// when a runtime never called CNI DEL for a deleted pod: the agent then
// holds an attachment the API does not have (a leak). DelPod still cleans
// up after it.
func (l *Lab) DeletePodObject(ctx context.Context, p *Pod) error {
	if p.UID == "" {
		return fmt.Errorf("pod %s has no Pod object", p.Key())
	}
	if err := l.deletePod(ctx, p); err != nil {
		return err
	}
	l.mu.Lock()
	p.UID = ""
	l.mu.Unlock()
	return l.Save()
}

// SetPodLabels gives p exactly these labels: on its Pod object if it has
// one, and in the state.
func (l *Lab) SetPodLabels(ctx context.Context, p *Pod, labels map[string]string) error {
	if p.UID != "" {
		kube, err := l.Kube()
		if err != nil {
			return err
		}
		pods := kube.CoreV1().Pods(p.Namespace)
		err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
			pod, err := pods.Get(ctx, p.Name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			pod.Labels = maps.Clone(labels)
			_, err = pods.Update(ctx, pod, metav1.UpdateOptions{})
			return err
		})
		if err != nil {
			return fmt.Errorf("labels of pod %s: %w", p.Key(), err)
		}
	}
	l.mu.Lock()
	p.Labels = maps.Clone(labels)
	l.mu.Unlock()
	return l.Save()
}
