package services

import (
	"fmt"
	"net/netip"
	"testing"
	"time"
)

// The flow records' questions (PodOfNetns, ServiceAt) never wait for a
// Sync, which holds the LB's lock throughout: they read the names the
// last change published.
func TestNamesDoNotWaitForSync(t *testing.T) {
	pod, vip := netip.MustParseAddr("10.244.1.5"), netip.MustParseAddrPort("10.96.0.10:80")
	lb := &LB{services: map[Key]*programmed{}, pods: map[uint64]netip.Addr{7: pod}}
	if _, ok := lb.PodOfNetns(7); ok {
		t.Fatal("a pod named before anything was published")
	}
	lb.services[Key{vip.Addr(), vip.Port(), TCP, Socket}] = &programmed{svc: Service{Name: "app/web:http"}}
	lb.publishPods()
	lb.publishServices()
	lb.mu.Lock() // a Sync under way
	defer lb.mu.Unlock()
	lb.pods[8] = netip.MustParseAddr("10.244.1.6") // not published yet
	done := make(chan struct{})
	var got []any
	go func() {
		a, ok := lb.PodOfNetns(7)
		_, ok8 := lb.PodOfNetns(8)
		name, okSvc := lb.ServiceAt(Socket, vip, TCP)
		_, okUplink := lb.ServiceAt(Uplink, vip, TCP)
		got = []any{a, ok, ok8, name, okSvc, okUplink}
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("PodOfNetns or ServiceAt waited for the LB's lock")
	}
	if want := []any{pod, true, false, "app/web:http", true, false}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("names %v, want %v", got, want)
	}
}
