// Package etcdstore is the etcd backend of the datastore. Layout under the
// key prefix (default /onc/):
//
//	config              cluster configuration (JSON)
//	nodes/<name>        node spec written by its agent (JSON)
//	cidrs/<a.b.c.d-len> node name owning the block
//	nodecidrs/<name>    the node's block
//	alive/<name>        bound to the agent's lease
//
// A block and its owner are written in one transaction that requires both
// keys to be absent (a batch of claims: every claim's), so a block is never
// handed out twice and a node never gets two.
package etcdstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/onc-net/onc/datastore"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
)

// DefaultPrefix is where ONC keeps its keys.
const DefaultPrefix = "/onc/"

// Options configure the connection.
type Options struct {
	Endpoints   []string
	Prefix      string // default DefaultPrefix
	TLSFiles           // all empty: plain HTTP
	DialTimeout time.Duration
	// Dial, if set, opens the connections to the endpoints: e.g. from
	// inside another network namespace (a lab's datastore, from its host).
	Dial func(ctx context.Context, addr string) (net.Conn, error)
}

// Store implements datastore.Store on etcd.
type Store struct {
	cli    *clientv3.Client
	prefix string
	desc   string
}

var _ datastore.Store = (*Store)(nil)

// New connects to etcd and checks it answers.
func New(ctx context.Context, o Options) (*Store, error) {
	if len(o.Endpoints) == 0 {
		return nil, errors.New("etcd: no endpoints")
	}
	if o.Prefix == "" {
		o.Prefix = DefaultPrefix
	}
	if !strings.HasSuffix(o.Prefix, "/") {
		o.Prefix += "/"
	}
	if o.DialTimeout == 0 {
		o.DialTimeout = 5 * time.Second
	}
	tlsCfg, err := o.TLSFiles.Config()
	if err != nil {
		return nil, err
	}
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   o.Endpoints,
		DialTimeout: o.DialTimeout,
		TLS:         tlsCfg,
		Logger:      zap.NewNop(),
		DialOptions: dialOptions(o.Dial),
	})
	if err != nil {
		return nil, fmt.Errorf("etcd %v: %w", o.Endpoints, err)
	}
	cctx, cancel := context.WithTimeout(ctx, o.DialTimeout)
	defer cancel()
	if _, err := cli.Get(cctx, o.Prefix+"config"); err != nil {
		cli.Close()
		return nil, fmt.Errorf("etcd %v unreachable: %w", o.Endpoints, err)
	}
	return &Store{cli: cli, prefix: o.Prefix, desc: "etcd " + strings.Join(o.Endpoints, ",")}, nil
}

func dialOptions(dial func(context.Context, string) (net.Conn, error)) []grpc.DialOption {
	if dial == nil {
		return nil
	}
	return []grpc.DialOption{grpc.WithContextDialer(dial)}
}

func (s *Store) Describe() string { return s.desc }
func (s *Store) Close() error     { return s.cli.Close() }

func (s *Store) key(parts ...string) string { return s.prefix + strings.Join(parts, "/") }

func cidrKey(p netip.Prefix) string { return strings.Replace(p.String(), "/", "-", 1) }

type nodeRecord struct {
	IP       string `json:"ip"`
	VTEPMAC  string `json:"vtepMAC"`
	FastPath bool   `json:"fastPath"`
}

func (s *Store) PutClusterConfig(ctx context.Context, cfg datastore.ClusterConfig) error {
	val, err := json.Marshal(cfg)
	if err != nil {
		return err
	}
	k := s.key("config")
	resp, err := s.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(k), "=", 0)).
		Then(clientv3.OpPut(k, string(val))).
		Else(clientv3.OpGet(k)).Commit()
	if err != nil {
		return err
	}
	if resp.Succeeded {
		return nil
	}
	var have datastore.ClusterConfig
	if err := json.Unmarshal(resp.Responses[0].GetResponseRange().Kvs[0].Value, &have); err != nil {
		return fmt.Errorf("stored cluster config: %w", err)
	}
	if have != cfg {
		return fmt.Errorf("cluster config mismatch: the datastore has cluster CIDR %s with /%d node blocks, this controller is configured for %s with /%d; the cluster CIDR cannot change under a running cluster",
			have.ClusterCIDR, have.NodePrefixLen, cfg.ClusterCIDR, cfg.NodePrefixLen)
	}
	return nil
}

func (s *Store) ClusterConfig(ctx context.Context) (datastore.ClusterConfig, error) {
	var cfg datastore.ClusterConfig
	resp, err := s.cli.Get(ctx, s.key("config"))
	if err != nil {
		return cfg, err
	}
	if len(resp.Kvs) == 0 {
		return cfg, datastore.ErrNotFound
	}
	return cfg, json.Unmarshal(resp.Kvs[0].Value, &cfg)
}

func (s *Store) RegisterNode(ctx context.Context, spec datastore.NodeSpec) error {
	if err := ValidNodeName(spec.Name); err != nil {
		return err
	}
	val, err := json.Marshal(nodeRecord{IP: spec.IP.String(), VTEPMAC: spec.VTEPMAC.String(), FastPath: spec.FastPath})
	if err != nil {
		return err
	}
	_, err = s.cli.Put(ctx, s.key("nodes", spec.Name), string(val))
	return err
}

func (s *Store) KeepAlive(ctx context.Context, name string, ttl time.Duration) error {
	secs := int64(ttl / time.Second)
	if secs < 1 {
		secs = 1
	}
	for {
		err := s.holdLease(ctx, name, secs)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		slog.Warn("node liveness lease lost, renewing", "node", name, "err", err)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Second):
		}
	}
}

// holdLease grants a lease, binds alive/<name> to it and keeps it alive until
// ctx ends (then revokes it, so peers see the agent go at once) or etcd drops it.
func (s *Store) holdLease(ctx context.Context, name string, ttl int64) error {
	lease, err := s.cli.Grant(ctx, ttl)
	if err != nil {
		return err
	}
	defer func() {
		rctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_, _ = s.cli.Revoke(rctx, lease.ID)
	}()
	if _, err := s.cli.Put(ctx, s.key("alive", name), "1", clientv3.WithLease(lease.ID)); err != nil {
		return err
	}
	ch, err := s.cli.KeepAlive(ctx, lease.ID)
	if err != nil {
		return err
	}
	for range ch {
	}
	return errors.New("keepalive channel closed")
}

func (s *Store) DeleteNode(ctx context.Context, name string) error {
	ops := []clientv3.Op{clientv3.OpDelete(s.key("nodes", name)), clientv3.OpDelete(s.key("alive", name))}
	release, cmp, err := s.releaseOps(ctx, name)
	if err != nil {
		return err
	}
	resp, err := s.cli.Txn(ctx).If(cmp...).Then(append(ops, release...)...).Commit()
	if err != nil {
		return err
	}
	if !resp.Succeeded {
		return s.DeleteNode(ctx, name) // the allocation changed under us
	}
	return nil
}

// maxClaimsPerTxn keeps a claim transaction within etcd's default
// --max-txn-ops, 128: a claim is two comparisons and two puts, or two
// reads when the transaction fails.
const maxClaimsPerTxn = 64

// ClaimCIDRs makes the claims maxClaimsPerTxn at a time, each batch in one
// transaction that requires every node and every block to be free. A
// transaction that fails reads why in the same revision: a node that holds
// a block keeps it, a claim of a taken block is dropped, and the others
// are tried again; each failure settles at least one claim.
func (s *Store) ClaimCIDRs(ctx context.Context, claims map[string]netip.Prefix) (map[string]netip.Prefix, error) {
	got := make(map[string]netip.Prefix, len(claims))
	pending := slices.Sorted(maps.Keys(claims))
	for len(pending) > 0 {
		var txn []string
		txn, pending = nextTxn(pending, claims)
		again, err := s.claimTxn(ctx, txn, claims, got)
		if err != nil {
			return got, err
		}
		pending = append(again, pending...)
	}
	return got, nil
}

// nextTxn takes from pending the claims of the next transaction: at most
// maxClaimsPerTxn, of distinct blocks (etcd refuses a key put twice in one
// transaction; a second claim of a block waits and then finds it taken).
func nextTxn(pending []string, claims map[string]netip.Prefix) (txn, rest []string) {
	blocks := map[netip.Prefix]bool{}
	for i, node := range pending {
		if len(txn) == maxClaimsPerTxn {
			return txn, append(rest, pending[i:]...)
		}
		if blocks[claims[node]] {
			rest = append(rest, node)
			continue
		}
		blocks[claims[node]] = true
		txn = append(txn, node)
	}
	return txn, rest
}

// claimTxn claims the blocks of nodes in one transaction, recording in got
// what each settled claim gives; it returns the claims to try again.
func (s *Store) claimTxn(ctx context.Context, nodes []string, claims, got map[string]netip.Prefix) ([]string, error) {
	var cmps []clientv3.Cmp
	var puts, reads []clientv3.Op
	for _, node := range nodes {
		nk, ck := s.key("nodecidrs", node), s.key("cidrs", cidrKey(claims[node]))
		cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(nk), "=", 0), clientv3.Compare(clientv3.CreateRevision(ck), "=", 0))
		puts = append(puts, clientv3.OpPut(nk, claims[node].String()), clientv3.OpPut(ck, node))
		reads = append(reads, clientv3.OpGet(nk), clientv3.OpGet(ck, clientv3.WithKeysOnly()))
	}
	resp, err := s.cli.Txn(ctx).If(cmps...).Then(puts...).Else(reads...).Commit()
	if err != nil {
		return nil, fmt.Errorf("claiming %d pod CIDRs: %w", len(nodes), err)
	}
	var again []string
	for i, node := range nodes {
		if resp.Succeeded {
			got[node] = claims[node]
			continue
		}
		held, taken := resp.Responses[2*i].GetResponseRange().Kvs, resp.Responses[2*i+1].GetResponseRange().Kvs
		switch {
		case len(held) > 0:
			p, err := netip.ParsePrefix(string(held[0].Value))
			if err != nil {
				return nil, fmt.Errorf("node %s's pod CIDR %q: %w", node, held[0].Value, err)
			}
			got[node] = p
		case len(taken) == 0:
			again = append(again, node)
		}
	}
	return again, nil
}

func (s *Store) ClaimCIDR(ctx context.Context, node string, cidr netip.Prefix) (netip.Prefix, error) {
	return datastore.ClaimOne(ctx, s, node, cidr)
}

func (s *Store) ReleaseCIDR(ctx context.Context, node string) error {
	ops, cmp, err := s.releaseOps(ctx, node)
	if err != nil || len(ops) == 0 {
		return err
	}
	resp, err := s.cli.Txn(ctx).If(cmp...).Then(ops...).Commit()
	if err != nil {
		return err
	}
	if !resp.Succeeded {
		return s.ReleaseCIDR(ctx, node)
	}
	return nil
}

// releaseOps returns the deletes that free node's block, guarded by a
// comparison that the allocation is still the one read.
func (s *Store) releaseOps(ctx context.Context, node string) ([]clientv3.Op, []clientv3.Cmp, error) {
	nk := s.key("nodecidrs", node)
	resp, err := s.cli.Get(ctx, nk)
	if err != nil {
		return nil, nil, err
	}
	if len(resp.Kvs) == 0 {
		return nil, []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(nk), "=", 0)}, nil
	}
	kv := resp.Kvs[0]
	ops := []clientv3.Op{clientv3.OpDelete(nk)}
	if p, err := netip.ParsePrefix(string(kv.Value)); err == nil {
		ops = append(ops, clientv3.OpDelete(s.key("cidrs", cidrKey(p))))
	}
	return ops, []clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(nk), "=", kv.ModRevision)}, nil
}

func (s *Store) Allocations(ctx context.Context) (map[netip.Prefix]string, error) {
	resp, err := s.cli.Get(ctx, s.key("cidrs")+"/", clientv3.WithPrefix())
	if err != nil {
		return nil, err
	}
	out := make(map[netip.Prefix]string, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		k := strings.TrimPrefix(string(kv.Key), s.key("cidrs")+"/")
		p, err := netip.ParsePrefix(strings.Replace(k, "-", "/", 1))
		if err != nil {
			slog.Warn("ignoring malformed allocation key", "key", string(kv.Key))
			continue
		}
		out[p] = string(kv.Value)
	}
	return out, nil
}

func (s *Store) Nodes(ctx context.Context) ([]datastore.Node, error) {
	// Records and their CIDRs in one transaction: a consistent snapshot
	// that skips the allocations and liveness keys under the same prefix.
	nodesDir, cidrsDir := s.key("nodes")+"/", s.key("nodecidrs")+"/"
	resp, err := s.cli.Txn(ctx).Then(
		clientv3.OpGet(nodesDir, clientv3.WithPrefix()),
		clientv3.OpGet(cidrsDir, clientv3.WithPrefix())).Commit()
	if err != nil {
		return nil, err
	}
	cidrs := map[string]netip.Prefix{}
	for _, kv := range resp.Responses[1].GetResponseRange().Kvs {
		if p, err := netip.ParsePrefix(string(kv.Value)); err == nil {
			cidrs[strings.TrimPrefix(string(kv.Key), cidrsDir)] = p
		}
	}
	recs := resp.Responses[0].GetResponseRange().Kvs
	nodes := make([]datastore.Node, 0, len(recs))
	for _, kv := range recs {
		name := strings.TrimPrefix(string(kv.Key), nodesDir)
		spec, err := decodeNode(name, kv.Value)
		if err != nil {
			slog.Warn("ignoring malformed node record", "node", name, "err", err)
			continue
		}
		nodes = append(nodes, datastore.Node{NodeSpec: spec, PodCIDR: cidrs[name]})
	}
	return nodes, nil
}

// Liveness lists the alive/ keys: each exists while its agent's etcd lease
// does.
func (s *Store) Liveness(ctx context.Context) (map[string]bool, error) {
	dir := s.key("alive") + "/"
	resp, err := s.cli.Get(ctx, dir, clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		return nil, err
	}
	out := make(map[string]bool, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		out[strings.TrimPrefix(string(kv.Key), dir)] = true
	}
	return out, nil
}

func (s *Store) Node(ctx context.Context, name string) (datastore.Node, error) {
	resp, err := s.cli.Txn(ctx).Then(
		clientv3.OpGet(s.key("nodes", name)),
		clientv3.OpGet(s.key("nodecidrs", name))).Commit()
	if err != nil {
		return datastore.Node{}, err
	}
	rec := resp.Responses[0].GetResponseRange().Kvs
	if len(rec) == 0 {
		return datastore.Node{}, datastore.ErrNotFound
	}
	spec, err := decodeNode(name, rec[0].Value)
	if err != nil {
		return datastore.Node{}, err
	}
	n := datastore.Node{NodeSpec: spec}
	if kvs := resp.Responses[1].GetResponseRange().Kvs; len(kvs) > 0 {
		n.PodCIDR, _ = netip.ParsePrefix(string(kvs[0].Value))
	}
	return n, nil
}

func decodeNode(name string, val []byte) (datastore.NodeSpec, error) {
	var rec nodeRecord
	if err := json.Unmarshal(val, &rec); err != nil {
		return datastore.NodeSpec{}, err
	}
	ip, err := netip.ParseAddr(rec.IP)
	if err != nil {
		return datastore.NodeSpec{}, fmt.Errorf("ip: %w", err)
	}
	mac, err := net.ParseMAC(rec.VTEPMAC)
	if err != nil {
		return datastore.NodeSpec{}, fmt.Errorf("vtepMAC: %w", err)
	}
	return datastore.NodeSpec{Name: name, IP: ip, VTEPMAC: mac, FastPath: rec.FastPath}, nil
}

// onlyLiveness: every event is of an alive/ key. The creation notice has
// no events and is not one of these.
func (s *Store) onlyLiveness(events []*clientv3.Event) bool {
	alive := s.key("alive") + "/"
	for _, e := range events {
		if !strings.HasPrefix(string(e.Kv.Key), alive) {
			return false
		}
	}
	return len(events) > 0
}

func (s *Store) Changes(ctx context.Context) <-chan struct{} {
	out := make(chan struct{}, 1)
	go func() {
		defer close(out)
		for ctx.Err() == nil {
			// Signal only once the watch exists: a consumer reads on the
			// signal, and every write after that read must reach the watch.
			wch := s.cli.Watch(clientv3.WithRequireLeader(ctx), s.prefix, clientv3.WithPrefix(), clientv3.WithCreatedNotify())
			for resp := range wch {
				if resp.Err() != nil {
					break
				}
				if s.onlyLiveness(resp.Events) {
					continue // an agent came or went: no record changed
				}
				select {
				case out <- struct{}{}:
				default:
				}
			}
			// The watch broke (compaction, leader loss): watch again, and
			// the new watch's creation makes consumers re-read from scratch.
			select {
			case <-ctx.Done():
			case <-time.After(500 * time.Millisecond):
			}
		}
	}()
	return out
}
