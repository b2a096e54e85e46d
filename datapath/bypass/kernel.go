package bypass

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/cilium/ebpf/btf"
	"golang.org/x/sys/unix"
)

// kernelSupports checks what the bypass needs beyond loading:
//   - sk_psock.msg_tot_len, the count of a socket's unread bypassed bytes
//     that bounds a stalled reader's queue (without it a reader that stops
//     would let its peer fill the host's TCP memory);
//   - SOCK_DESTROY (CONFIG_INET_DIAG_DESTROY), without which a policy
//     change could not end a bypassed connection it denies.
func kernelSupports() error {
	spec, err := btf.LoadKernelSpec()
	if err != nil {
		return fmt.Errorf("bypass: kernel BTF: %w", err)
	}
	var psock *btf.Struct
	if err := spec.TypeByName("sk_psock", &psock); err != nil {
		return fmt.Errorf("bypass: the kernel has no sockmap (struct sk_psock): %w", err)
	}
	found := false
	for _, m := range psock.Members {
		found = found || m.Name == "msg_tot_len"
	}
	if !found {
		return errors.New("bypass: this kernel's sockmap does not count a socket's unread redirected bytes (sk_psock.msg_tot_len), so a stalled reader could not be bounded")
	}
	// A socket that cannot exist: ENOENT where SOCK_DESTROY works.
	err = sockDestroy(netip.MustParseAddrPort("127.0.0.1:1"), netip.MustParseAddrPort("127.0.0.1:1"), 0)
	if errors.Is(err, unix.EOPNOTSUPP) {
		return errors.New("bypass: the kernel cannot end sockets on request (SOCK_DESTROY, CONFIG_INET_DIAG_DESTROY), so a policy change could not end a bypassed connection")
	}
	return err
}
