package testutil

import (
	"net"
	"testing"
	"time"
)

// Delivered sends msg on c up to three times and reports whether pc reads
// it, waiting 300 ms after each try: one-way UDP, for the checks that a
// datagram is dropped (a spoofed source, whose reply would go elsewhere).
func Delivered(t testing.TB, c net.Conn, pc net.PacketConn, msg string) bool {
	t.Helper()
	buf := make([]byte, len(msg)+1)
	for range 3 {
		if _, err := c.Write([]byte(msg)); err != nil {
			t.Fatal(err)
		}
		_ = pc.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
		for {
			n, _, err := pc.ReadFrom(buf)
			if err != nil {
				break
			}
			if string(buf[:n]) == msg {
				return true
			}
		}
	}
	return false
}
