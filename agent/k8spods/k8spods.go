// Package k8spods watches the Kubernetes pods of one node, so the agent can
// tell, for each attachment it holds, whether its pod still exists.
package k8spods

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
)

// Pods is an informer cache of the pods scheduled to one node.
type Pods struct {
	store cache.Store
	stop  chan struct{}
}

// Watch starts the informer and waits until its cache is filled.
func Watch(ctx context.Context, cfg *rest.Config, node string) (*Pods, error) {
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	inf := cache.NewSharedIndexInformer(
		cache.NewListWatchFromClient(kube.CoreV1().RESTClient(), "pods", "", fields.OneTermEqualSelector("spec.nodeName", node)),
		&corev1.Pod{}, 0, cache.Indexers{})
	// Keep only what the agent reads.
	if err := inf.SetTransform(func(obj any) (any, error) {
		p, ok := obj.(*corev1.Pod)
		if !ok {
			return obj, nil
		}
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: p.Name, Namespace: p.Namespace, ResourceVersion: p.ResourceVersion},
			Status: corev1.PodStatus{Phase: p.Status.Phase}}, nil
	}); err != nil {
		return nil, err
	}
	p := &Pods{store: inf.GetStore(), stop: make(chan struct{})}
	go inf.Run(p.stop)
	sctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if !cache.WaitForCacheSync(sctx.Done(), inf.HasSynced) {
		p.Close()
		return nil, fmt.Errorf("cannot list and watch the pods of node %s (RBAC: pods list and watch)", node)
	}
	return p, nil
}

// Phase is the pod's phase, or "gone" if this node has no such pod.
func (p *Pods) Phase(namespace, name string) string {
	obj, ok, _ := p.store.GetByKey(namespace + "/" + name)
	if !ok {
		return "gone"
	}
	return string(obj.(*corev1.Pod).Status.Phase)
}

// Close stops the informer.
func (p *Pods) Close() { close(p.stop) }
