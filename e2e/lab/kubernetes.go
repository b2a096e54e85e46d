package lab

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/onc-net/onc/internal/daemon"
	"github.com/onc-net/onc/internal/kubeapiserver"
	"github.com/onc-net/onc/manifests"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

const apiServerPort = 6443

// startKubernetes runs etcd (onc-lab etcd) and kube-apiserver in the
// controller's namespace and applies ONC's CRD and RBAC from the manifest;
// the workloads are the lab's own processes.
func (l *Lab) startKubernetes(ctx context.Context, kubeBin string) error {
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
	a, err := kubeapiserver.Start(ctx, l.ctlNetns(), filepath.Join(l.Dir, "kube"), bin, etcdURL, controllerIP, apiServerPort)
	if a != nil {
		l.APIServer = a
	}
	if err != nil {
		return err
	}
	if err := l.Save(); err != nil {
		return err
	}
	for _, sa := range []string{"onc-controller", "onc-agent"} {
		if err := a.WriteKubeconfig(l.kubeconfig(sa), "onc-system:"+sa); err != nil {
			return err
		}
	}
	return manifests.Apply(ctx, a.RESTConfig(), manifests.NotWorkloads)
}

// kubeconfig of an ONC service account, for the lab's processes.
func (l *Lab) kubeconfig(sa string) string { return filepath.Join(l.Dir, "kube", sa+".kubeconfig") }

// createNode registers n as a Kubernetes Node, as its kubelet would.
func (l *Lab) createNode(ctx context.Context, n *Node) error {
	kube, err := kubernetes.NewForConfig(l.APIServer.RESTConfig())
	if err != nil {
		return err
	}
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.Name, Labels: map[string]string{"kubernetes.io/hostname": n.Name}},
		Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: n.IP.String()}}}}
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
