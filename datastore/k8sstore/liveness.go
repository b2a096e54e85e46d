package k8sstore

// Liveness and change notification: the agent's heartbeat (KeepAlive),
// Changes subscriptions, and the timer that signals heartbeat expiry.

import (
	"context"
	"log/slog"
	"time"
)

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
