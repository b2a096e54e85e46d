// Package netns enters network namespaces and names them by cookie: the
// few steps every part of ONC that works inside a pod's namespace shares.
package netns

import (
	"errors"
	"fmt"
	"os"
	"runtime"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Handle is an open network namespace; Close it when done.
type Handle = netns.NsHandle

// ErrNotExist: the network namespace does not exist.
var ErrNotExist = errors.New("network namespace does not exist")

// Open opens the namespace at path, telling a missing one apart.
func Open(path string) (Handle, error) {
	h, err := netns.GetFromPath(path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return h, fmt.Errorf("%w: %s", ErrNotExist, path)
		}
		return h, fmt.Errorf("open netns %s: %w", path, err)
	}
	return h, nil
}

// Cookie is the kernel's cookie of the network namespace at path
// ("" for the caller's own), as the programs read it from a socket.
func Cookie(path string) (uint64, error) {
	if path == "" {
		return socketNetnsCookie()
	}
	ns, err := Open(path)
	if err != nil {
		return 0, err
	}
	defer ns.Close()
	return CookieOf(ns)
}

// CookieOf is the cookie of the open namespace ns.
func CookieOf(ns Handle) (uint64, error) {
	var cookie uint64
	err := Do(ns, func() (err error) {
		cookie, err = socketNetnsCookie()
		return err
	})
	return cookie, err
}

func socketNetnsCookie() (uint64, error) {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return 0, err
	}
	defer unix.Close(fd)
	v, err := unix.GetsockoptUint64(fd, unix.SOL_SOCKET, unix.SO_NETNS_COOKIE)
	if err != nil {
		return 0, fmt.Errorf("SO_NETNS_COOKIE: %w", err)
	}
	return v, nil
}

// Do runs fn on a thread switched into ns, then switches back.
func Do(ns Handle, fn func() error) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	orig, err := netns.Get()
	if err != nil {
		return err
	}
	defer orig.Close()
	if err := netns.Set(ns); err != nil {
		return fmt.Errorf("enter netns: %w", err)
	}
	defer func() {
		if err := netns.Set(orig); err != nil {
			// A thread stuck in the wrong namespace must not be reused.
			panic(fmt.Sprintf("cannot return to the agent's netns: %v", err))
		}
	}()
	return fn()
}
