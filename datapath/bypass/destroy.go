package bypass

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"syscall"

	"github.com/onc-net/onc/internal/netns"

	"golang.org/x/sys/unix"
)

// Destroy ends a bypassed connection now, both ends: each socket is
// aborted as `ss -K` does (its calls fail with ECONNABORTED, its peer gets
// a reset). Conns no longer lists it; the kernel unlinks it from the map
// when its file is closed. An end no longer there is fine. Bypassed bytes
// never pass netfilter, so this is how a policy change that denies the
// pair ends it.
func (b *Bypass) Destroy(c Conn) error {
	b.mu.Lock()
	clientNS, serverNS := b.netns[c.Client.Addr()], b.netns[c.Server.Addr()]
	b.mu.Unlock()
	var errs []error
	if c.ClientCookie != 0 {
		errs = append(errs, destroyIn(clientNS, c.Client, c.Server, c.ClientCookie))
	}
	if c.ServerCookie != 0 {
		errs = append(errs, destroyIn(serverNS, c.Server, c.Client, c.ServerCookie))
	}
	return errors.Join(errs...)
}

// destroyIn aborts the TCP socket local→remote with the given cookie in
// the network namespace at path: SOCK_DESTROY acts in the namespace of the
// netlink socket that asks.
func destroyIn(path string, local, remote netip.AddrPort, cookie uint64) error {
	if path == "" {
		return fmt.Errorf("bypass: no network namespace known for pod %s", local.Addr())
	}
	ns, err := netns.Open(path)
	if err != nil {
		if errors.Is(err, netns.ErrNotExist) {
			return nil // the pod is gone, and its sockets with it
		}
		return err
	}
	defer ns.Close()
	err = netns.Do(ns, func() error { return sockDestroy(local, remote, cookie) })
	if err != nil {
		return fmt.Errorf("bypass: end %s -> %s: %w", local, remote, err)
	}
	return nil
}

// sockDestroy sends one SOCK_DESTROY for a TCP socket in any state,
// matched on its addresses, ports and cookie: AF_INET for IPv4 addresses
// (which finds a dual-stack socket talking IPv4 too), AF_INET6 for IPv6.
func sockDestroy(local, remote netip.AddrPort, cookie uint64) error {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_SOCK_DIAG)
	if err != nil {
		return fmt.Errorf("sock_diag socket: %w", err)
	}
	defer unix.Close(fd)
	const hdrLen, reqLen = unix.SizeofNlMsghdr, 56 // struct inet_diag_req_v2
	msg := make([]byte, hdrLen+reqLen)
	ne := binary.NativeEndian
	ne.PutUint32(msg[0:], uint32(len(msg)))
	ne.PutUint16(msg[4:], sockDestroyType)
	ne.PutUint16(msg[6:], unix.NLM_F_REQUEST|unix.NLM_F_ACK)
	ne.PutUint32(msg[8:], 1) // sequence
	req := msg[hdrLen:]
	req[0] = unix.AF_INET
	if !local.Addr().Unmap().Is4() {
		req[0] = unix.AF_INET6
	}
	req[1] = unix.IPPROTO_TCP
	ne.PutUint32(req[4:], ^uint32(0)) // every state
	id := req[8:]                     // struct inet_diag_sockid
	binary.BigEndian.PutUint16(id[0:], local.Port())
	binary.BigEndian.PutUint16(id[2:], remote.Port())
	// idiag_src and idiag_dst: 16 bytes each, an IPv4 address in the first 4.
	copy(id[4:20], local.Addr().Unmap().AsSlice())
	copy(id[20:36], remote.Addr().Unmap().AsSlice())
	ne.PutUint32(id[40:], uint32(cookie))
	ne.PutUint32(id[44:], uint32(cookie>>32))
	if err := unix.Sendto(fd, msg, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return fmt.Errorf("SOCK_DESTROY: %w", err)
	}
	buf := make([]byte, 4096)
	n, _, err := unix.Recvfrom(fd, buf, 0)
	if err != nil {
		return fmt.Errorf("SOCK_DESTROY reply: %w", err)
	}
	msgs, err := syscall.ParseNetlinkMessage(buf[:n])
	if err != nil || len(msgs) == 0 || msgs[0].Header.Type != unix.NLMSG_ERROR || len(msgs[0].Data) < 4 {
		return fmt.Errorf("SOCK_DESTROY: unexpected reply")
	}
	switch errno := -int32(ne.Uint32(msgs[0].Data)); errno {
	case 0, int32(unix.ENOENT):
		return nil // ENOENT: already closed
	default:
		return fmt.Errorf("SOCK_DESTROY: %w", unix.Errno(errno))
	}
}

// sockDestroyType is SOCK_DESTROY from linux/sock_diag.h.
const sockDestroyType = 21
