package etcdstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// RootUser is etcd's superuser, the controller's certificate's common name.
const RootUser = "root"

// NodeUser is the etcd user, and its role, of node's agent: its
// certificate's common name.
func NodeUser(node string) string { return "node:" + node }

// ValidNodeName says what is wrong with a node name, if anything: it is a
// path element of the node's keys.
func ValidNodeName(name string) error {
	if name == "" || strings.Contains(name, "/") {
		return fmt.Errorf("invalid node name %q: must be non-empty and without '/'", name)
	}
	return nil
}

type permission struct {
	key, end string // end "" is the key alone
	typ      clientv3.PermissionType
}

// nodePermissions are what node's agent does: it reads everything under
// the prefix (its watch covers all of it) and writes its own registration
// and liveness, nothing else.
func (s *Store) nodePermissions(node string) []permission {
	return []permission{
		{s.prefix, clientv3.GetPrefixRangeEnd(s.prefix), clientv3.PermissionType(clientv3.PermRead)},
		{s.key("nodes", node), "", clientv3.PermissionType(clientv3.PermWrite)},
		{s.key("alive", node), "", clientv3.PermissionType(clientv3.PermWrite)},
	}
}

// AuthorizeNode makes node's etcd user and role (NodeUser), or corrects
// them: the role has exactly nodePermissions. The store must be root's.
func (s *Store) AuthorizeNode(ctx context.Context, node string) error {
	if err := ValidNodeName(node); err != nil {
		return err
	}
	name := NodeUser(node)
	if _, err := s.cli.RoleAdd(ctx, name); err != nil && !errors.Is(err, rpctypes.ErrRoleAlreadyExist) {
		return fmt.Errorf("add etcd role %s: %w", name, err)
	}
	role, err := s.cli.RoleGet(ctx, name)
	if err != nil {
		return fmt.Errorf("etcd role %s: %w", name, err)
	}
	want := s.nodePermissions(node)
	for _, p := range role.Perm {
		if !slices.Contains(want, permission{string(p.Key), string(p.RangeEnd), clientv3.PermissionType(p.PermType)}) {
			if _, err := s.cli.RoleRevokePermission(ctx, name, string(p.Key), string(p.RangeEnd)); err != nil {
				return fmt.Errorf("revoke %q from etcd role %s: %w", p.Key, name, err)
			}
		}
	}
	for _, p := range want {
		if _, err := s.cli.RoleGrantPermission(ctx, name, p.key, p.end, p.typ); err != nil {
			return fmt.Errorf("grant etcd role %s %q: %w", name, p.key, err)
		}
	}
	if _, err := s.cli.UserAddWithOptions(ctx, name, "", &clientv3.UserAddOptions{NoPassword: true}); err != nil && !errors.Is(err, rpctypes.ErrUserAlreadyExist) {
		return fmt.Errorf("add etcd user %s: %w", name, err)
	}
	if _, err := s.cli.UserGrantRole(ctx, name, name); err != nil {
		return fmt.Errorf("grant etcd user %s its role: %w", name, err)
	}
	return nil
}

// RevokeNode deletes node's etcd user and role: its certificate, still
// valid, then names no user and may do nothing. Absent ones are fine.
func (s *Store) RevokeNode(ctx context.Context, node string) error {
	name := NodeUser(node)
	if _, err := s.cli.UserDelete(ctx, name); err != nil && !errors.Is(err, rpctypes.ErrUserNotFound) {
		return fmt.Errorf("delete etcd user %s: %w", name, err)
	}
	if _, err := s.cli.RoleDelete(ctx, name); err != nil && !errors.Is(err, rpctypes.ErrRoleNotFound) {
		return fmt.Errorf("delete etcd role %s: %w", name, err)
	}
	return nil
}

// EndLiveness ends node's liveness: it revokes the lease its alive/<node>
// key is bound to, which deletes the key (and any other key on that
// lease), then deletes the key in case it had no lease. etcd checks no
// permission on renewing a lease, so any client may keep a node's lease
// alive; revoking it needs write access to its keys, root's. A missing
// key, or a lease already gone, is fine.
func (s *Store) EndLiveness(ctx context.Context, node string) error {
	if err := ValidNodeName(node); err != nil {
		return err
	}
	k := s.key("alive", node)
	resp, err := s.cli.Get(ctx, k)
	if err != nil || len(resp.Kvs) == 0 {
		return err
	}
	if id := clientv3.LeaseID(resp.Kvs[0].Lease); id != clientv3.NoLease {
		if _, err := s.cli.Revoke(ctx, id); err != nil && !errors.Is(err, rpctypes.ErrLeaseNotFound) {
			return fmt.Errorf("revoke lease %x of %s: %w", int64(id), k, err)
		}
	}
	if _, err := s.cli.Delete(ctx, k); err != nil {
		return fmt.Errorf("delete %s: %w", k, err)
	}
	return nil
}
