// Package k8sstore is the Kubernetes backend of the datastore. It keeps
//
//   - one ONCNode (cluster-scoped custom resource) per node: the tunnel
//     endpoint its agent publishes, the pod CIDR and the agent's heartbeat;
//   - the ConfigMap <namespace>/onc-ipam: the cluster configuration and the
//     ledger of allocated blocks. Every claim is one compare-and-swap update
//     of it, so a block is never handed out twice and a node never gets
//     two, even while two controllers overlap during a leader change;
//   - Node.spec.podCIDR(s), written once when a node gets its block, for
//     kube-proxy and anything else that reads it.
//
// Reads come from informer caches; every write waits until the cache has
// seen it, so a caller reads its own writes.
package k8sstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/onc-net/onc/controller/datastore"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/retry"
)

// LedgerName is the ConfigMap holding the cluster config and allocations.
const LedgerName = "onc-ipam"

// Ledger keys: the config, and one "block.<a.b.c.d-len>" = node per block.
const (
	keyClusterCIDR   = "clusterCIDR"
	keyNodePrefixLen = "nodePrefixLen"
	blockKeyPrefix   = "block."
)

// Options configure the backend.
type Options struct {
	Config    *rest.Config
	Namespace string        // where the ledger lives; default "onc-system"
	SyncWait  time.Duration // how long New waits for the caches; default 60s
}

// Store implements datastore.Store on the Kubernetes API.
type Store struct {
	kube    kubernetes.Interface
	dyn     dynamic.Interface
	ns      string
	desc    string
	stop    chan struct{}
	oncInf  cache.SharedIndexInformer
	ledger  cache.SharedIndexInformer
	nodeInf cache.SharedIndexInformer

	mu   sync.Mutex
	subs map[chan struct{}]struct{}
	poke chan struct{} // wakes the heartbeat-expiry timer
}

var (
	_ datastore.Store      = (*Store)(nil)
	_ datastore.Membership = (*Store)(nil)
)

// New connects, starts the informers and waits until their caches are
// filled: a missing CRD or RBAC rule shows up here, named.
func New(ctx context.Context, o Options) (*Store, error) {
	if o.Config == nil {
		return nil, errors.New("kubernetes: no client config")
	}
	if o.Namespace == "" {
		o.Namespace = "onc-system"
	}
	if o.SyncWait == 0 {
		o.SyncWait = 60 * time.Second
	}
	kube, err := kubernetes.NewForConfig(o.Config)
	if err != nil {
		return nil, err
	}
	dyn, err := dynamic.NewForConfig(o.Config)
	if err != nil {
		return nil, err
	}
	s := &Store{
		kube: kube, dyn: dyn, ns: o.Namespace,
		desc: fmt.Sprintf("kubernetes %s (ledger %s/%s)", o.Config.Host, o.Namespace, LedgerName),
		stop: make(chan struct{}), subs: map[chan struct{}]struct{}{}, poke: make(chan struct{}, 1),
	}
	s.oncInf = dynamicinformer.NewFilteredDynamicInformer(dyn, oncNodes, "", 0, cache.Indexers{}, nil).Informer()
	s.ledger = cache.NewSharedIndexInformer(
		cache.NewListWatchFromClient(kube.CoreV1().RESTClient(), "configmaps", o.Namespace, fields.OneTermEqualSelector("metadata.name", LedgerName)),
		&corev1.ConfigMap{}, 0, cache.Indexers{})
	s.nodeInf = cache.NewSharedIndexInformer(
		cache.NewListWatchFromClient(kube.CoreV1().RESTClient(), "nodes", "", fields.Everything()),
		&corev1.Node{}, 0, cache.Indexers{})
	// Only the name and pod CIDR of a Node matter here; drop the rest
	// (images, conditions) so big clusters cost little memory.
	if err := s.nodeInf.SetTransform(slimNode); err != nil {
		return nil, err
	}
	handler := cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { s.notify() },
		UpdateFunc: func(any, any) { s.notify() },
		DeleteFunc: func(any) { s.notify() },
	}
	infs := map[string]cache.SharedIndexInformer{"ONCNodes": s.oncInf, "ConfigMap " + LedgerName: s.ledger, "Nodes": s.nodeInf}
	for name, inf := range infs {
		if _, err := inf.AddEventHandler(handler); err != nil {
			return nil, err
		}
		inf.SetWatchErrorHandlerWithContext(watchErrorLogger(name))
		go inf.Run(s.stop)
	}
	go s.expiryLoop()
	sctx, cancel := context.WithTimeout(ctx, o.SyncWait)
	defer cancel()
	for name, inf := range infs {
		if !cache.WaitForCacheSync(sctx.Done(), inf.HasSynced) {
			close(s.stop)
			return nil, fmt.Errorf("kubernetes %s: cannot list and watch %s within %v: is manifests/onc.yaml applied (CRD, RBAC)? The log shows the API's answer",
				o.Config.Host, name, o.SyncWait)
		}
	}
	return s, nil
}

func watchErrorLogger(what string) cache.WatchErrorHandlerWithContext {
	return func(_ context.Context, _ *cache.Reflector, err error) {
		slog.Warn("kubernetes watch failed; retrying", "resource", what, "err", err)
	}
}

func slimNode(obj any) (any, error) {
	n, ok := obj.(*corev1.Node)
	if !ok {
		return obj, nil // a tombstone
	}
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: n.Name, ResourceVersion: n.ResourceVersion, UID: n.UID},
		Spec:       corev1.NodeSpec{PodCIDR: n.Spec.PodCIDR, PodCIDRs: n.Spec.PodCIDRs},
	}, nil
}

func (s *Store) Describe() string { return s.desc }

func (s *Store) Close() error {
	select {
	case <-s.stop:
	default:
		close(s.stop)
	}
	return nil
}

// ---- cluster config and ledger ----

func blockKey(p netip.Prefix) string {
	return blockKeyPrefix + strings.Replace(p.String(), "/", "-", 1)
}

func parseBlockKey(k string) (netip.Prefix, bool) {
	rest, ok := strings.CutPrefix(k, blockKeyPrefix)
	if !ok {
		return netip.Prefix{}, false
	}
	p, err := netip.ParsePrefix(strings.Replace(rest, "-", "/", 1))
	return p, err == nil
}

// cachedLedger is the ledger's data as the cache has it (nil if none).
func (s *Store) cachedLedger() map[string]string {
	obj, ok, _ := s.ledger.GetStore().GetByKey(s.ns + "/" + LedgerName)
	if !ok {
		return nil
	}
	return obj.(*corev1.ConfigMap).Data
}

// updateLedger applies fn to a fresh copy of the ledger and writes it back
// if fn reports a change, retrying on conflicts: a compare-and-swap on the
// ConfigMap's resourceVersion.
func (s *Store) updateLedger(ctx context.Context, fn func(data map[string]string) (bool, error)) error {
	cms := s.kube.CoreV1().ConfigMaps(s.ns)
	var written string
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cm, err := cms.Get(ctx, LedgerName, metav1.GetOptions{})
		create := apierrors.IsNotFound(err)
		if create {
			cm = &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: LedgerName, Namespace: s.ns,
				Labels: map[string]string{"app.kubernetes.io/part-of": "onc"}}}
		} else if err != nil {
			return err
		}
		data := make(map[string]string, len(cm.Data)+1)
		for k, v := range cm.Data {
			data[k] = v
		}
		changed, err := fn(data)
		if err != nil || !changed {
			return err
		}
		cm.Data = data
		if create {
			cm, err = cms.Create(ctx, cm, metav1.CreateOptions{})
			if apierrors.IsAlreadyExists(err) {
				return apierrors.NewConflict(corev1.Resource("configmaps"), LedgerName, err)
			}
		} else {
			cm, err = cms.Update(ctx, cm, metav1.UpdateOptions{})
		}
		if err == nil {
			written = cm.ResourceVersion
		}
		return err
	})
	if err != nil || written == "" {
		return err
	}
	return s.awaitCache(ctx, s.ledger, s.ns+"/"+LedgerName, written)
}

func (s *Store) PutClusterConfig(ctx context.Context, cfg datastore.ClusterConfig) error {
	want := map[string]string{keyClusterCIDR: cfg.ClusterCIDR.String(), keyNodePrefixLen: strconv.Itoa(cfg.NodePrefixLen)}
	return s.updateLedger(ctx, func(d map[string]string) (bool, error) {
		if d[keyClusterCIDR] == "" {
			for k, v := range want {
				d[k] = v
			}
			return true, nil
		}
		if d[keyClusterCIDR] != want[keyClusterCIDR] || d[keyNodePrefixLen] != want[keyNodePrefixLen] {
			return false, fmt.Errorf("the cluster was set up with cluster CIDR %s and node prefix /%s (ConfigMap %s/%s); they cannot change to %s and /%d under a running cluster",
				d[keyClusterCIDR], d[keyNodePrefixLen], s.ns, LedgerName, cfg.ClusterCIDR, cfg.NodePrefixLen)
		}
		return false, nil
	})
}

func (s *Store) ClusterConfig(context.Context) (datastore.ClusterConfig, error) {
	d := s.cachedLedger()
	if d[keyClusterCIDR] == "" {
		return datastore.ClusterConfig{}, datastore.ErrNotFound
	}
	p, err := netip.ParsePrefix(d[keyClusterCIDR])
	if err != nil {
		return datastore.ClusterConfig{}, fmt.Errorf("ConfigMap %s/%s: %s: %w", s.ns, LedgerName, keyClusterCIDR, err)
	}
	n, err := strconv.Atoi(d[keyNodePrefixLen])
	if err != nil {
		return datastore.ClusterConfig{}, fmt.Errorf("ConfigMap %s/%s: %s: %w", s.ns, LedgerName, keyNodePrefixLen, err)
	}
	return datastore.ClusterConfig{ClusterCIDR: p, NodePrefixLen: n}, nil
}

func (s *Store) ClaimCIDR(ctx context.Context, node string, cidr netip.Prefix) (netip.Prefix, error) {
	var got netip.Prefix
	err := s.updateLedger(ctx, func(d map[string]string) (bool, error) {
		for k, owner := range d {
			if p, ok := parseBlockKey(k); ok && owner == node {
				got = p
				return false, nil
			}
		}
		if owner, ok := d[blockKey(cidr)]; ok {
			return false, fmt.Errorf("%s held by %s: %w", cidr, owner, datastore.ErrCIDRTaken)
		}
		d[blockKey(cidr)] = node
		got = cidr
		return true, nil
	})
	if err != nil {
		return netip.Prefix{}, err
	}
	return got, s.mirrorCIDR(ctx, node, got)
}

func (s *Store) ReleaseCIDR(ctx context.Context, node string) error {
	err := s.updateLedger(ctx, func(d map[string]string) (bool, error) {
		changed := false
		for k, owner := range d {
			if _, ok := parseBlockKey(k); ok && owner == node {
				delete(d, k)
				changed = true
			}
		}
		return changed, nil
	})
	if err != nil {
		return err
	}
	return s.mirrorCIDR(ctx, node, netip.Prefix{})
}

func (s *Store) Allocations(context.Context) (map[netip.Prefix]string, error) { return s.blocks(), nil }

// blocks maps each allocated block to its node, from the cache.
func (s *Store) blocks() map[netip.Prefix]string {
	out := map[netip.Prefix]string{}
	for k, owner := range s.cachedLedger() {
		if p, ok := parseBlockKey(k); ok {
			out[p] = owner
		}
	}
	return out
}

// mirrorCIDR copies a node's block into its ONCNode (for kubectl get) and,
// once, into Node.spec.podCIDR(s), which Kubernetes never lets change.
func (s *Store) mirrorCIDR(ctx context.Context, node string, p netip.Prefix) error {
	if _, ok, _ := s.oncInf.GetStore().GetByKey(node); ok {
		var v any
		if p.IsValid() {
			v = p.String()
		}
		if err := s.patchONCNode(ctx, node, map[string]any{"spec": map[string]any{"podCIDR": v}}, ""); err != nil && !apierrors.IsNotFound(err) {
			return err
		}
	}
	if !p.IsValid() {
		return nil
	}
	obj, ok, _ := s.nodeInf.GetStore().GetByKey(node)
	if !ok {
		return nil
	}
	switch have := obj.(*corev1.Node).Spec.PodCIDR; have {
	case p.String():
		return nil
	case "":
		patch, _ := json.Marshal(map[string]any{"spec": map[string]any{"podCIDR": p.String(), "podCIDRs": []string{p.String()}}})
		_, err := s.kube.CoreV1().Nodes().Patch(ctx, node, types.StrategicMergePatchType, patch, metav1.PatchOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("node %s: setting spec.podCIDR: %w", node, err)
		}
	default:
		slog.Warn("the Node already has another pod CIDR, which Kubernetes does not let change; ONC routes its pods by ONC's",
			"node", node, "node.spec.podCIDR", have, "onc", p)
	}
	return nil
}

// ---- nodes ----

func validName(name string) error {
	if errs := validation.IsDNS1123Subdomain(name); len(errs) > 0 {
		return fmt.Errorf("invalid node name %q: %s", name, strings.Join(errs, "; "))
	}
	return nil
}

func (s *Store) RegisterNode(ctx context.Context, spec datastore.NodeSpec) error {
	if err := validName(spec.Name); err != nil {
		return err
	}
	fields := map[string]any{"nodeIP": spec.IP.String(), "vtepMAC": spec.VTEPMAC.String(), "fastPath": spec.FastPath}
	err := s.patchONCNode(ctx, spec.Name, map[string]any{"spec": fields}, "")
	if !apierrors.IsNotFound(err) {
		return err
	}
	n := &oncNode{ObjectMeta: metav1.ObjectMeta{Name: spec.Name, Labels: map[string]string{"app.kubernetes.io/part-of": "onc"}},
		Spec: oncNodeSpec{NodeIP: spec.IP.String(), VTEPMAC: spec.VTEPMAC.String(), FastPath: spec.FastPath}}
	for p, owner := range s.blocks() {
		if owner == spec.Name {
			n.Spec.PodCIDR = p.String()
		}
	}
	u, err := toUnstructured(n)
	if err != nil {
		return err
	}
	created, err := s.dyn.Resource(oncNodes).Create(ctx, u, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) { // raced with another writer: patch it
		return s.RegisterNode(ctx, spec)
	}
	if err != nil {
		return err
	}
	return s.awaitCache(ctx, s.oncInf, spec.Name, created.GetResourceVersion())
}

// patchONCNode merge-patches an ONCNode (or its status subresource) and
// waits until the cache has the result.
func (s *Store) patchONCNode(ctx context.Context, name string, patch map[string]any, subresource string) error {
	body, err := json.Marshal(patch)
	if err != nil {
		return err
	}
	var sub []string
	if subresource != "" {
		sub = []string{subresource}
	}
	u, err := s.dyn.Resource(oncNodes).Patch(ctx, name, types.MergePatchType, body, metav1.PatchOptions{}, sub...)
	if err != nil {
		return err
	}
	return s.awaitCache(ctx, s.oncInf, name, u.GetResourceVersion())
}

func (s *Store) KeepAlive(ctx context.Context, name string, ttl time.Duration) error {
	if err := validName(name); err != nil {
		return err
	}
	secs := max(int64(ttl/time.Second), 1)
	every := time.Duration(secs) * time.Second / 3
	defer func() {
		// Say goodbye so peers see the agent go at once, not after the TTL.
		cctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = s.patchONCNode(cctx, name, map[string]any{"status": map[string]any{"heartbeatTime": nil}}, "status")
	}()
	for {
		hb := map[string]any{"status": map[string]any{
			"heartbeatTime": time.Now().UTC().Format(time.RFC3339Nano), "heartbeatTTLSeconds": secs}}
		wait := every
		if err := s.patchONCNode(ctx, name, hb, "status"); err != nil && ctx.Err() == nil {
			slog.Warn("node heartbeat failed; retrying", "node", name, "err", err)
			wait = time.Second
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(wait):
		}
	}
}

func (s *Store) DeleteNode(ctx context.Context, name string) error {
	err := s.dyn.Resource(oncNodes).Delete(ctx, name, metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	if err := s.awaitCache(ctx, s.oncInf, name, ""); err != nil {
		return err
	}
	return s.ReleaseCIDR(ctx, name)
}

// Nodes lists the registered nodes: ONCNodes whose agent has published
// its endpoint (an ONCNode can exist with only a pod CIDR).
func (s *Store) Nodes(context.Context) ([]datastore.Node, error) {
	cidrs := map[string]netip.Prefix{}
	for p, owner := range s.blocks() {
		cidrs[owner] = p
	}
	now := time.Now()
	var out []datastore.Node
	for _, obj := range s.oncInf.GetStore().List() {
		n, err := fromUnstructured(obj)
		if err != nil {
			slog.Warn("ignoring malformed ONCNode", "err", err)
			continue
		}
		dn, err := toNode(n, cidrs[n.Name], now)
		if err != nil {
			slog.Warn("ignoring malformed ONCNode", "node", n.Name, "err", err)
			continue
		}
		if dn != nil {
			out = append(out, *dn)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

func (s *Store) Node(ctx context.Context, name string) (datastore.Node, error) {
	obj, ok, _ := s.oncInf.GetStore().GetByKey(name)
	if !ok {
		return datastore.Node{}, datastore.ErrNotFound
	}
	n, err := fromUnstructured(obj)
	if err != nil {
		return datastore.Node{}, err
	}
	var cidr netip.Prefix
	for p, owner := range s.blocks() {
		if owner == name {
			cidr = p
		}
	}
	dn, err := toNode(n, cidr, time.Now())
	if err != nil {
		return datastore.Node{}, fmt.Errorf("ONCNode %s: %w", name, err)
	}
	if dn == nil {
		return datastore.Node{}, datastore.ErrNotFound
	}
	return *dn, nil
}

// toNode converts a registered ONCNode; nil if its agent never registered.
func toNode(n *oncNode, cidr netip.Prefix, now time.Time) (*datastore.Node, error) {
	if n.Spec.NodeIP == "" {
		return nil, nil
	}
	ip, err := netip.ParseAddr(n.Spec.NodeIP)
	if err != nil {
		return nil, fmt.Errorf("spec.nodeIP: %w", err)
	}
	mac, err := net.ParseMAC(n.Spec.VTEPMAC)
	if err != nil {
		return nil, fmt.Errorf("spec.vtepMAC: %w", err)
	}
	return &datastore.Node{
		NodeSpec: datastore.NodeSpec{Name: n.Name, IP: ip, VTEPMAC: mac, FastPath: n.Spec.FastPath},
		PodCIDR:  cidr, Alive: n.alive(now),
	}, nil
}

// ClusterNodes lists the cluster's Nodes and the pod CIDR each carries.
func (s *Store) ClusterNodes(context.Context) (map[string]netip.Prefix, error) {
	out := map[string]netip.Prefix{}
	for _, obj := range s.nodeInf.GetStore().List() {
		n := obj.(*corev1.Node)
		p, _ := netip.ParsePrefix(n.Spec.PodCIDR)
		out[n.Name] = p
	}
	return out, nil
}

// ---- change notification ----

func (s *Store) Changes(ctx context.Context) <-chan struct{} {
	ch := make(chan struct{}, 1)
	ch <- struct{}{}
	s.mu.Lock()
	s.subs[ch] = struct{}{}
	s.mu.Unlock()
	go func() {
		select {
		case <-ctx.Done():
		case <-s.stop:
		}
		s.mu.Lock()
		delete(s.subs, ch)
		close(ch)
		s.mu.Unlock()
	}()
	return ch
}

func (s *Store) notify() {
	s.mu.Lock()
	for ch := range s.subs {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
	s.mu.Unlock()
	select {
	case s.poke <- struct{}{}:
	default:
	}
}

// expiryLoop signals a change when a heartbeat runs out: nothing in the
// API changes then, only the clock.
func (s *Store) expiryLoop() {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		next := time.Now().Add(time.Hour)
		for _, obj := range s.oncInf.GetStore().List() {
			if n, err := fromUnstructured(obj); err == nil {
				if exp, ok := n.expiry(); ok && exp.After(time.Now()) && exp.Before(next) {
					next = exp
				}
			}
		}
		timer.Reset(time.Until(next) + 10*time.Millisecond)
		select {
		case <-s.stop:
			return
		case <-s.poke:
		case <-timer.C:
			s.notify()
		}
	}
}

// awaitCache waits until inf's cache holds key at resourceVersion rv or
// later, or (rv == "") no longer holds it.
func (s *Store) awaitCache(ctx context.Context, inf cache.SharedIndexInformer, key, rv string) error {
	want, _ := strconv.ParseUint(rv, 10, 64)
	for {
		obj, ok, _ := inf.GetStore().GetByKey(key)
		if rv == "" && !ok {
			return nil
		}
		if ok && rv != "" {
			have := obj.(metav1.Object).GetResourceVersion()
			if n, err := strconv.ParseUint(have, 10, 64); have == rv || (err == nil && want > 0 && n >= want) {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for the informer cache to see %s: %w", key, ctx.Err())
		case <-time.After(5 * time.Millisecond):
		}
	}
}
