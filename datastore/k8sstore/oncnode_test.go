package k8sstore

import (
	"fmt"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/tools/cache"
)

// The ONCNode cache holds each record converted once; one that does not
// convert stays as it came, and a read names it.
func TestONCNodeCacheConvertsOnce(t *testing.T) {
	good, err := toUnstructured(&oncNode{Spec: oncNodeSpec{NodeIP: "192.0.2.1", VTEPMAC: "02:00:00:00:00:01", PodCIDR: "10.244.1.0/24"}})
	if err != nil {
		t.Fatal(err)
	}
	good.SetName("good")
	good.SetResourceVersion("7")
	bad := &unstructured.Unstructured{Object: map[string]any{"metadata": map[string]any{"name": "bad"}, "spec": map[string]any{"nodeIP": 42}}}
	tombstone := cache.DeletedFinalStateUnknown{Key: "gone"}

	obj, err := typedONCNode(good)
	if err != nil {
		t.Fatal(err)
	}
	n, ok := obj.(*oncNode)
	if !ok || n.Name != "good" || n.Spec.PodCIDR != "10.244.1.0/24" {
		t.Fatalf("typed %#v", obj)
	}
	if key, err := cache.MetaNamespaceKeyFunc(obj); err != nil || key != "good" {
		t.Fatalf("cache key %q, %v", key, err)
	}
	if read, err := cachedONCNode(obj); err != nil || read != n {
		t.Fatalf("read %v, %v", read, err)
	}
	for _, in := range []any{bad, tombstone} {
		if out, err := typedONCNode(in); err != nil || out != in {
			t.Fatalf("%T transformed to %#v, %v; want it as it was", in, out, err)
		}
	}
	if _, err := cachedONCNode(bad); err == nil || !strings.Contains(err.Error(), "ONCNode bad") {
		t.Fatalf("reading a malformed record: %v, want an error naming it", err)
	}
}

// A record's pod CIDRs are its list while the list starts with podCIDR;
// where a controller before IPv6, which writes podCIDR alone, changed or
// removed that, podCIDR alone.
func TestPodCIDRsOf(t *testing.T) {
	both := []string{"10.244.1.0/24", "fd00::/64"}
	for _, c := range []struct {
		spec oncNodeSpec
		want string
	}{
		{oncNodeSpec{PodCIDR: both[0], PodCIDRs: both}, "[10.244.1.0/24 fd00::/64]"},
		{oncNodeSpec{PodCIDR: both[0]}, "[10.244.1.0/24]"},
		{oncNodeSpec{PodCIDR: "10.244.2.0/24", PodCIDRs: both}, "[10.244.2.0/24]"},
		{oncNodeSpec{PodCIDRs: both}, "[]"},
		{oncNodeSpec{}, "[]"},
	} {
		got, err := podCIDRsOf(c.spec)
		if err != nil || fmt.Sprint(got) != c.want {
			t.Errorf("podCIDRsOf(%+v) = %v, %v; want %s", c.spec, got, err, c.want)
		}
	}
	if got, err := podCIDRsOf(oncNodeSpec{PodCIDR: "10.244.1.0/24", PodCIDRs: []string{"10.244.1.0/24", "nonsense"}}); err == nil {
		t.Errorf("a malformed list reads as %v", got)
	}
}
