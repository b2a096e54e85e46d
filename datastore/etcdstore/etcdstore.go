// Package etcdstore is the etcd backend of the datastore. Layout under the
// key prefix (default /onc/):
//
//	config                  cluster configuration (JSON, configRecord)
//	nodes/<name>            node spec written by its agent (JSON)
//	cidrs/<a.b.c.d-len>     node name owning the IPv4 block
//	nodecidrs/<name>        the node's IPv4 block
//	cidrs-ipv6/<block>      node name owning the IPv6 block (datastore.EncodeBlock: fd00_10_244__-64)
//	nodecidrs-ipv6/<name>   the node's IPv6 block
//	alive/<name>            bound to the agent's lease
//
// A block and its owner are written in one transaction that requires both
// keys to be absent (a batch of claims: every claim's), so a block is never
// handed out twice and a node never gets two of one family. The IPv4 keys
// are those of every release before IPv6, which ignores the others.
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

// ledgerDirs are a family's directories of blocks (block → node) and of
// nodes' blocks (node → block).
type ledgerDirs struct{ byBlock, byNode string }

var ledgers = map[datastore.Family]ledgerDirs{
	datastore.IPv4: {"cidrs", "nodecidrs"},
	datastore.IPv6: {"cidrs-ipv6", "nodecidrs-ipv6"},
}

// blockKey is the key naming the owner of block p.
func (s *Store) blockKey(p netip.Prefix) string {
	return s.key(ledgers[datastore.FamilyOf(p)].byBlock, datastore.EncodeBlock(p))
}

// nodeBlockKey is the key holding node's block of family f.
func (s *Store) nodeBlockKey(f datastore.Family, node string) string {
	return s.key(ledgers[f].byNode, node)
}

// configRecord is the config key's JSON: the primary pool in the fields
// every release wrote (so an IPv4 cluster's record is what it always
// was, and an older agent reads it during an upgrade), the secondary in
// fields an older reader ignores.
type configRecord struct {
	ClusterCIDR            netip.Prefix `json:"clusterCIDR"`
	NodePrefixLen          int          `json:"nodePrefixLen"`
	SecondaryClusterCIDR   netip.Prefix `json:"secondaryClusterCIDR,omitzero"`
	SecondaryNodePrefixLen int          `json:"secondaryNodePrefixLen,omitzero"`
}

func encodeConfig(cfg datastore.ClusterConfig) ([]byte, error) {
	var r configRecord
	if len(cfg.Pools) > 0 {
		r.ClusterCIDR, r.NodePrefixLen = cfg.Pools[0].CIDR, cfg.Pools[0].NodePrefixLen
	}
	if len(cfg.Pools) > 1 {
		r.SecondaryClusterCIDR, r.SecondaryNodePrefixLen = cfg.Pools[1].CIDR, cfg.Pools[1].NodePrefixLen
	}
	return json.Marshal(r)
}

func decodeConfig(val []byte) (datastore.ClusterConfig, error) {
	var r configRecord
	if err := json.Unmarshal(val, &r); err != nil {
		return datastore.ClusterConfig{}, fmt.Errorf("stored cluster config: %w", err)
	}
	cfg := datastore.ClusterConfig{Pools: []datastore.Pool{{CIDR: r.ClusterCIDR, NodePrefixLen: r.NodePrefixLen}}}
	if r.SecondaryClusterCIDR.IsValid() {
		cfg.Pools = append(cfg.Pools, datastore.Pool{CIDR: r.SecondaryClusterCIDR, NodePrefixLen: r.SecondaryNodePrefixLen})
	}
	return cfg, nil
}

type nodeRecord struct {
	IP       string `json:"ip"`
	VTEPMAC  string `json:"vtepMAC"`
	FastPath bool   `json:"fastPath"`
	PeerPin  string `json:"peerPin,omitempty"`
}

// PutClusterConfig writes what ClusterConfig.Extend makes of the
// recorded config and cfg, if that differs, by compare-and-swap.
func (s *Store) PutClusterConfig(ctx context.Context, cfg datastore.ClusterConfig) error {
	k := s.key("config")
	for {
		resp, err := s.cli.Get(ctx, k)
		if err != nil {
			return err
		}
		var have datastore.ClusterConfig
		var rev int64 // an absent key's
		if len(resp.Kvs) > 0 {
			if have, err = decodeConfig(resp.Kvs[0].Value); err != nil {
				return err
			}
			rev = resp.Kvs[0].ModRevision
		}
		next, err := have.Extend(cfg, "etcd key "+k)
		if err != nil || next.Equal(have) {
			return err
		}
		val, err := encodeConfig(next)
		if err != nil {
			return err
		}
		put, err := s.cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(k), "=", rev)).Then(clientv3.OpPut(k, string(val))).Commit()
		if err != nil || put.Succeeded {
			return err
		}
	}
}

func (s *Store) ClusterConfig(ctx context.Context) (datastore.ClusterConfig, error) {
	resp, err := s.cli.Get(ctx, s.key("config"))
	if err != nil {
		return datastore.ClusterConfig{}, err
	}
	if len(resp.Kvs) == 0 {
		return datastore.ClusterConfig{}, datastore.ErrNotFound
	}
	return decodeConfig(resp.Kvs[0].Value)
}

func (s *Store) RegisterNode(ctx context.Context, spec datastore.NodeSpec) error {
	if err := ValidNodeName(spec.Name); err != nil {
		return err
	}
	val, err := json.Marshal(nodeRecord{IP: spec.IP.String(), VTEPMAC: spec.VTEPMAC.String(), FastPath: spec.FastPath, PeerPin: spec.PeerPin})
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
// transaction that requires every node to hold no block of its claim's
// family and every block to be free. A transaction that fails reads why
// in the same revision: a node that holds a block of the family keeps
// it, a claim of a taken block is dropped, and the others are tried
// again; each failure settles at least one claim.
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
		nk, ck := s.nodeBlockKey(datastore.FamilyOf(claims[node]), node), s.blockKey(claims[node])
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

// releaseOps returns the deletes that free node's blocks, guarded by
// comparisons that its allocations are still the ones read.
func (s *Store) releaseOps(ctx context.Context, node string) ([]clientv3.Op, []clientv3.Cmp, error) {
	var gets []clientv3.Op
	for _, f := range datastore.Families {
		gets = append(gets, clientv3.OpGet(s.nodeBlockKey(f, node)))
	}
	resp, err := s.cli.Txn(ctx).Then(gets...).Commit()
	if err != nil {
		return nil, nil, err
	}
	var ops []clientv3.Op
	var cmps []clientv3.Cmp
	for i, f := range datastore.Families {
		nk := s.nodeBlockKey(f, node)
		kvs := resp.Responses[i].GetResponseRange().Kvs
		if len(kvs) == 0 {
			cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(nk), "=", 0))
			continue
		}
		ops = append(ops, clientv3.OpDelete(nk))
		if p, err := netip.ParsePrefix(string(kvs[0].Value)); err == nil {
			ops = append(ops, clientv3.OpDelete(s.blockKey(p)))
		}
		cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(nk), "=", kvs[0].ModRevision))
	}
	return ops, cmps, nil
}

// Allocations reads both families' blocks in one transaction.
func (s *Store) Allocations(ctx context.Context) (map[netip.Prefix]string, error) {
	var gets []clientv3.Op
	for _, f := range datastore.Families {
		gets = append(gets, clientv3.OpGet(s.key(ledgers[f].byBlock)+"/", clientv3.WithPrefix()))
	}
	resp, err := s.cli.Txn(ctx).Then(gets...).Commit()
	if err != nil {
		return nil, err
	}
	out := map[netip.Prefix]string{}
	for i, f := range datastore.Families {
		dir := s.key(ledgers[f].byBlock) + "/"
		for _, kv := range resp.Responses[i].GetResponseRange().Kvs {
			p, err := datastore.ParseBlock(strings.TrimPrefix(string(kv.Key), dir))
			if err != nil {
				slog.Warn("ignoring malformed allocation key", "key", string(kv.Key))
				continue
			}
			out[p] = string(kv.Value)
		}
	}
	return out, nil
}

// nodeReads are the reads of a snapshot of node records (key: one
// record, or the directory's with WithPrefix): the records, then each
// family's node blocks, then the config, whose family order their
// blocks take.
func (s *Store) nodeReads(key string, opts ...clientv3.OpOption) []clientv3.Op {
	ops := []clientv3.Op{clientv3.OpGet(s.key("nodes")+"/"+key, opts...)}
	for _, f := range datastore.Families {
		ops = append(ops, clientv3.OpGet(s.key(ledgers[f].byNode)+"/"+key, opts...))
	}
	return append(ops, clientv3.OpGet(s.key("config")))
}

// nodeBlocks reads the answers to nodeReads: each node's blocks in the
// cluster's family order.
func (s *Store) nodeBlocks(resp *clientv3.TxnResponse) map[string][]netip.Prefix {
	blocks := map[string][]netip.Prefix{}
	for i, f := range datastore.Families {
		dir := s.key(ledgers[f].byNode) + "/"
		for _, kv := range resp.Responses[1+i].GetResponseRange().Kvs {
			if p, err := netip.ParsePrefix(string(kv.Value)); err == nil {
				name := strings.TrimPrefix(string(kv.Key), dir)
				blocks[name] = append(blocks[name], p)
			}
		}
	}
	// Without a config (none written yet, or one that does not decode,
	// which the controller reports) the order is IPv4 first.
	var cfg datastore.ClusterConfig
	if kvs := resp.Responses[1+len(datastore.Families)].GetResponseRange().Kvs; len(kvs) > 0 {
		cfg, _ = decodeConfig(kvs[0].Value)
	}
	for name, b := range blocks {
		blocks[name] = cfg.InFamilyOrder(b)
	}
	return blocks
}

func (s *Store) Nodes(ctx context.Context) ([]datastore.Node, error) {
	// Records and their CIDRs in one transaction: a consistent snapshot
	// that skips the allocations and liveness keys under the same prefix.
	resp, err := s.cli.Txn(ctx).Then(s.nodeReads("", clientv3.WithPrefix())...).Commit()
	if err != nil {
		return nil, err
	}
	blocks := s.nodeBlocks(resp)
	nodesDir := s.key("nodes") + "/"
	recs := resp.Responses[0].GetResponseRange().Kvs
	nodes := make([]datastore.Node, 0, len(recs))
	for _, kv := range recs {
		name := strings.TrimPrefix(string(kv.Key), nodesDir)
		spec, err := decodeNode(name, kv.Value)
		if err != nil {
			slog.Warn("ignoring malformed node record", "node", name, "err", err)
			continue
		}
		nodes = append(nodes, datastore.Node{NodeSpec: spec, PodCIDRs: blocks[name]})
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
	resp, err := s.cli.Txn(ctx).Then(s.nodeReads(name)...).Commit()
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
	return datastore.Node{NodeSpec: spec, PodCIDRs: s.nodeBlocks(resp)[name]}, nil
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
	return datastore.NodeSpec{Name: name, IP: ip, VTEPMAC: mac, FastPath: rec.FastPath, PeerPin: rec.PeerPin}, nil
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
