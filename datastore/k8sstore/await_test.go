package k8sstore

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"
)

// A wait for an update of an object the cache holds ends when the cache
// shows the update, or when the object is gone (deleted since: nothing
// will ever show the update); a wait for an object to appear does not end
// for its absence.
func TestAwaitCacheOfAnUpdatedObject(t *testing.T) {
	inf := cache.NewSharedIndexInformer(&cache.ListWatch{}, &corev1.Node{}, 0, cache.Indexers{})
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n", ResourceVersion: "5"}}
	if err := inf.GetStore().Add(node); err != nil {
		t.Fatal(err)
	}
	s := &Store{}
	wait := func(updated bool, timeout time.Duration) chan error {
		done := make(chan error, 1)
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), timeout)
			defer cancel()
			done <- s.awaitCacheOf(ctx, inf, "n", "6", updated)
		}()
		return done
	}

	shown := wait(true, 5*time.Second)
	if err := inf.GetStore().Update(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n", ResourceVersion: "6"}}); err != nil {
		t.Fatal(err)
	}
	if err := <-shown; err != nil {
		t.Errorf("the update shown: %v", err)
	}

	node.ResourceVersion = "5"
	if err := inf.GetStore().Update(node); err != nil {
		t.Fatal(err)
	}
	gone := wait(true, 5*time.Second)
	if err := inf.GetStore().Delete(node); err != nil {
		t.Fatal(err)
	}
	if err := <-gone; err != nil {
		t.Errorf("the object deleted before the cache showed the update: %v; want the wait over", err)
	}

	if err := <-wait(false, 100*time.Millisecond); err == nil {
		t.Error("a wait for a created object ended while the cache has none")
	}
}
