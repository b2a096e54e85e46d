//go:build privileged

package services

import (
	"context"
	"maps"
	"net/netip"
	"reflect"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/onc-net/onc/datapath/services"
	"github.com/onc-net/onc/datastore/etcdserver/etcdtest"
	"github.com/onc-net/onc/internal/testutil"
	"github.com/onc-net/onc/manifests"
)

// The informers against a real kube-apiserver: they see what kube-proxy
// sees, trimmed, and signal every change Compile reads, and only those.
func TestInputs(t *testing.T) {
	api := testutil.KubeAPIServer(t, etcdtest.Embedded(t, "").ClientURL)
	ctx := context.Background()
	kube := kubernetes.NewForConfigOrDie(api.RESTConfig())
	if _, err := kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// As the agent, with the RBAC the manifest gives it.
	if err := manifests.Apply(ctx, api.RESTConfig(), manifests.NotWorkloads); err != nil {
		t.Fatal(err)
	}
	in, err := Watch(ctx, api.ServiceAccountConfig("onc-system:onc-agent"), "n1")
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	var signals atomic.Int64
	in.OnChange(func() { signals.Add(1) })
	if signals.Load() != 1 {
		t.Fatal("OnChange did not call back at once")
	}
	svcs, ess := kube.CoreV1().Services(ns), kube.DiscoveryV1().EndpointSlices(ns)

	// What kube-proxy does not proxy comes first: once the informers show
	// web, they would show these too.
	mesh := map[string]string{"service.kubernetes.io/service-proxy-name": "mesh"}
	for _, s := range []*corev1.Service{
		{ObjectMeta: metav1.ObjectMeta{Name: "meshed", Labels: mesh}, Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 80}}}},
		{ObjectMeta: metav1.ObjectMeta{Name: "headless"}, Spec: corev1.ServiceSpec{ClusterIP: corev1.ClusterIPNone, Ports: []corev1.ServicePort{{Port: 80}}}},
	} {
		if _, err := svcs.Create(ctx, s, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	meshed, headless := slice("meshed-1", "meshed", http, ep("10.0.2.8", "n2", ready)), slice("headless-1", "headless", http, ep("10.0.2.9", "n2", ready))
	maps.Copy(meshed.Labels, mesh)
	headless.Labels[corev1.IsHeadlessService] = ""
	for _, es := range []*discoveryv1.EndpointSlice{meshed, headless} {
		if _, err := ess.Create(ctx, es, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	created, err := svcs.Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "web", Annotations: map[string]string{"note": "1"}},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromString("http")}}}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	es := slice("web-1", "web", http, ep("10.0.2.1", "n2", ready))
	es.Endpoints[0].Zone = ptr.To("z1")
	if _, err := ess.Create(ctx, es, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	vip := netip.MustParseAddr(created.Spec.ClusterIP)
	want := services.Service{Name: "app/web:http", VIP: vip, Port: 80, Proto: services.TCP,
		Backends: []services.Backend{backend("10.0.2.1", 8080, "n2", true)}}
	table := func() []services.Service { return Compile(inApp(in.Snapshot()), Node{Name: "n1"}, Proxying{}) }
	var snap Snapshot
	testutil.WaitFor(t, "web and web-1", 10*time.Second, func() bool {
		snap = inApp(in.Snapshot())
		return slices.ContainsFunc(snap.Services, func(s *corev1.Service) bool { return s.Name == "web" }) &&
			slices.ContainsFunc(snap.EndpointSlices, func(es *discoveryv1.EndpointSlice) bool { return es.Name == "web-1" })
	})
	if len(snap.Services) != 1 || len(snap.EndpointSlices) != 1 {
		t.Fatalf("the informers hold %+v, want web and web-1 only", snap)
	}
	if got := Compile(snap, Node{Name: "n1"}, Proxying{}); !reflect.DeepEqual(got, []services.Service{want}) {
		t.Errorf("table:\n%+v\nwant\n%+v", got, want)
	}
	// Trimmed to what Compile reads.
	wantSvc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "web", UID: created.UID, ResourceVersion: snap.Services[0].ResourceVersion},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeClusterIP, ClusterIP: vip.String(), ClusterIPs: []string{vip.String()},
			IPFamilies: []corev1.IPFamily{corev1.IPv4Protocol}, Ports: []corev1.ServicePort{svcPort("http", corev1.ProtocolTCP, 80)},
			SessionAffinity: corev1.ServiceAffinityNone, InternalTrafficPolicy: ptr.To(corev1.ServiceInternalTrafficPolicyCluster)},
		Status: corev1.ServiceStatus{LoadBalancer: corev1.LoadBalancerStatus{}}}
	if !reflect.DeepEqual(snap.Services[0], wantSvc) {
		t.Errorf("service in the cache:\n%+v\nwant\n%+v", snap.Services[0], wantSvc)
	}
	wantES := slice("web-1", "web", http, ep("10.0.2.1", "n2", ready))
	wantES.ResourceVersion = snap.EndpointSlices[0].ResourceVersion
	if !reflect.DeepEqual(snap.EndpointSlices[0], wantES) {
		t.Errorf("EndpointSlice in the cache:\n%+v\nwant\n%+v", snap.EndpointSlices[0], wantES)
	}

	// An update of what Compile does not read signals nothing. Events of
	// one informer arrive in order: once the update after it has
	// signalled, it would have.
	signalsOnce := func(what string, noop, change func()) {
		t.Helper()
		before := signals.Load()
		noop()
		change()
		testutil.WaitFor(t, what, 10*time.Second, func() bool {
			return reflect.DeepEqual(table(), []services.Service{want}) && signals.Load() > before
		})
		time.Sleep(200 * time.Millisecond)
		if n := signals.Load() - before; n != 1 {
			t.Errorf("%s: %d signals for an update that matters and one that does not; want 1", what, n)
		}
	}
	want.Affinity = 3 * time.Hour
	signalsOnce("web's session affinity",
		update(t, svcs, "web", func(s *corev1.Service) {
			s.Annotations["note"] = "2"
			s.Spec.Ports[0].TargetPort = intstr.FromInt32(8080)
		}),
		update(t, svcs, "web", func(s *corev1.Service) { s.Spec.SessionAffinity = corev1.ServiceAffinityClientIP }))
	want.Backends = nil
	signalsOnce("web's endpoint not ready",
		update(t, ess, "web-1", func(es *discoveryv1.EndpointSlice) {
			es.Endpoints[0].Zone = ptr.To("z2")
			es.Annotations = map[string]string{"a": "b"}
		}),
		update(t, ess, "web-1", func(es *discoveryv1.EndpointSlice) { es.Endpoints[0].Conditions.Ready = ptr.To(false) }))

	// An event on a Service, with the agent's RBAC, as kubectl describe
	// finds it.
	in.Warn(snap.Services[0], "ProtocolNotSupported", "a test")
	testutil.WaitFor(t, "the event", 10*time.Second, func() bool {
		evs, err := kube.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.uid=" + string(created.UID)})
		return err == nil && len(evs.Items) == 1 && evs.Items[0].Reason == "ProtocolNotSupported" && evs.Items[0].Type == corev1.EventTypeWarning
	})

	// This node's Node, trimmed to its zone and addresses; another node's
	// is not watched.
	nodes := kube.CoreV1().Nodes()
	for _, name := range []string{"n2", "n1"} {
		if _, err := nodes.Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name,
			Labels: map[string]string{corev1.LabelTopologyZone: "z1", "other": "1"}},
			Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "192.0.2.1"}}}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	testutil.WaitFor(t, "node n1", 10*time.Second, func() bool { return in.Snapshot().Node != nil })
	if n := in.Snapshot().Node; n.Name != "n1" || !reflect.DeepEqual(n.Labels, map[string]string{corev1.LabelTopologyZone: "z1"}) {
		t.Errorf("node in the cache: %+v, want n1 with its zone label only", n)
	}
	signalsOnce("n1's zone",
		update(t, nodes, "n1", func(n *corev1.Node) { n.Labels["other"] = "2" }),
		update(t, nodes, "n1", func(n *corev1.Node) { n.Labels[corev1.LabelTopologyZone] = "z2" }))

	before := signals.Load()
	if err := ess.Delete(ctx, "web-1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, "web-1 deleted", 10*time.Second, func() bool {
		return len(inApp(in.Snapshot()).EndpointSlices) == 0 && signals.Load() > before
	})
	before = signals.Load()
	if err := svcs.Delete(ctx, "web", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, "web deleted", 10*time.Second, func() bool {
		return len(table()) == 0 && len(inApp(in.Snapshot()).Services) == 0 && signals.Load() > before
	})
}

// inApp is the part of a snapshot in namespace app: not the API server's
// own Service.
func inApp(s Snapshot) Snapshot {
	return Snapshot{
		Services:       slices.DeleteFunc(s.Services, func(s *corev1.Service) bool { return s.Namespace != ns }),
		EndpointSlices: slices.DeleteFunc(s.EndpointSlices, func(es *discoveryv1.EndpointSlice) bool { return es.Namespace != ns }),
		Node:           s.Node,
	}
}

// client is what update needs of a typed client.
type client[T any] interface {
	Get(context.Context, string, metav1.GetOptions) (T, error)
	Update(context.Context, T, metav1.UpdateOptions) (T, error)
}

// update returns a function that reads object name, edits it and writes
// it back.
func update[T any](t *testing.T, c client[T], name string, edit func(T)) func() {
	return func() {
		obj, err := c.Get(context.Background(), name, metav1.GetOptions{})
		if err == nil {
			edit(obj)
			_, err = c.Update(context.Background(), obj, metav1.UpdateOptions{})
		}
		if err != nil {
			t.Fatal(err)
		}
	}
}
