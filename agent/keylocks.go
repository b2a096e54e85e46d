package agent

import (
	"sync"

	"github.com/onc-net/onc/agent/ipam"
)

// keyLocks serialises operations on one attachment.
type keyLocks struct {
	mu sync.Mutex
	m  map[ipam.Key]*lockRef
}

type lockRef struct {
	sync.Mutex
	n int
}

func (k *keyLocks) lock(key ipam.Key) func() {
	k.mu.Lock()
	if k.m == nil {
		k.m = map[ipam.Key]*lockRef{}
	}
	l := k.m[key]
	if l == nil {
		l = &lockRef{}
		k.m[key] = l
	}
	l.n++
	k.mu.Unlock()
	l.Lock()
	return func() {
		l.Unlock()
		k.mu.Lock()
		if l.n--; l.n == 0 {
			delete(k.m, key)
		}
		k.mu.Unlock()
	}
}
