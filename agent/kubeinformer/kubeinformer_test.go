package kubeinformer

import (
	"reflect"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"
)

// A store's list comes out by namespace, then name, whatever its map order.
func TestListOrder(t *testing.T) {
	store := cache.NewStore(cache.MetaNamespaceKeyFunc)
	want := []string{"a/x", "a/y", "b/a", "b/b", "c/a"}
	for _, key := range []string{"b/b", "c/a", "a/y", "b/a", "a/x"} {
		ns, name, _ := cache.SplitMetaNamespaceKey(key)
		if err := store.Add(&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}); err != nil {
			t.Fatal(err)
		}
	}
	var got []string
	for _, p := range List[*corev1.Pod](store) {
		got = append(got, p.Namespace+"/"+p.Name)
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got %v, want %v", got, want)
	}
}
