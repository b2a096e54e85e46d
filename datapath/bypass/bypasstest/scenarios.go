// Package bypasstest holds the TCP scenarios whose outcome must be the
// same with the intra-node bypass on and off (half-close, a peer that dies
// mid-stream, many connections at once). datapath/bypass runs them in a
// network-namespace bed, e2e in the lab through real agents.
package bypasstest

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/onc-net/onc/internal/testutil"
)

// Pair opens a connection between the two pods under test: its client
// end and the server's accepted end.
type Pair func() (client, server *net.TCPConn)

// Outcome is what each step of a scenario saw, to compare with the bypass
// on and off.
type Outcome []string

// Result names an error the way both paths must agree on.
func Result(err error) string {
	switch {
	case err == nil:
		return "ok"
	case errors.Is(err, io.EOF):
		return "EOF"
	case errors.Is(err, syscall.EPIPE), errors.Is(err, syscall.ECONNRESET):
		return "EPIPE/ECONNRESET" // which one depends on timing, with or without the bypass
	case errors.Is(err, syscall.ECONNABORTED):
		return "ECONNABORTED"
	}
	return err.Error()
}

// HalfClose: the client shuts its side, its next write fails, the server
// reads the request then EOF, still replies, and the client reads it.
func HalfClose(t testing.TB, pair Pair) Outcome {
	c, s := pair()
	var o Outcome
	_, err := c.Write([]byte("request"))
	o = append(o, "client write: "+Result(err))
	o = append(o, "client shutdown(SHUT_WR): "+Result(c.CloseWrite()))
	_, err = c.Write([]byte("after shutdown"))
	o = append(o, "client write after SHUT_WR: "+Result(err))
	testutil.Must(t, s.SetReadDeadline(time.Now().Add(5*time.Second)))
	req, err := io.ReadAll(s)
	o = append(o, fmt.Sprintf("server reads %q then %s", req, Result(err)))
	_, err = s.Write([]byte("reply after EOF"))
	o = append(o, "server write: "+Result(err))
	o = append(o, "server close: "+Result(s.Close()))
	testutil.Must(t, c.SetReadDeadline(time.Now().Add(5*time.Second)))
	rep, err := io.ReadAll(c)
	o = append(o, fmt.Sprintf("client reads %q then %s", rep, Result(err)))
	return o
}

// PeerDies: a reader that goes with bytes unread fails its writer; a
// writer that goes leaves its reader every byte, then EOF; a writer that
// resets fails its reader.
func PeerDies(t testing.TB, pair Pair) Outcome {
	var o Outcome
	c, s := pair()
	chunk := make([]byte, 16<<10)
	for range 8 {
		_, err := c.Write(chunk)
		testutil.Must(t, err)
	}
	s.Close()
	var err error
	for deadline := time.Now().Add(5 * time.Second); err == nil && time.Now().Before(deadline); {
		_, err = c.Write(chunk)
		time.Sleep(time.Millisecond)
	}
	o = append(o, "writer, reader gone: "+Result(err))

	c2, s2 := pair()
	for range 8 {
		_, err := c2.Write(chunk)
		testutil.Must(t, err)
	}
	c2.Close()
	testutil.Must(t, s2.SetReadDeadline(time.Now().Add(5*time.Second)))
	got, err := io.ReadAll(s2)
	o = append(o, fmt.Sprintf("reader, writer gone: %d bytes then %s", len(got), Result(err)))

	c3, s3 := pair()
	_, err = c3.Write(chunk)
	testutil.Must(t, err)
	testutil.Must(t, s3.SetReadDeadline(time.Now().Add(5*time.Second)))
	_, err = io.ReadFull(s3, make([]byte, len(chunk)))
	testutil.Must(t, err)
	testutil.Must(t, c3.SetLinger(0))
	c3.Close()
	_, err = s3.Read(make([]byte, 1))
	o = append(o, "reader, writer reset: "+Result(err))
	return o
}

// ServeEcho echoes every connection l accepts until l closes. It reads
// with a plain loop: io.Copy from one TCP connection to another splices,
// and splice(2) does not see bypassed bytes.
func ServeEcho(l net.Listener) {
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_, _ = io.Copy(c, struct{ io.Reader }{c})
			}()
		}
	}()
}

// EchoMany opens n connections with dial (to a ServeEcho server), all
// open at once, and checks that each gets back exactly the 64 KiB it sent.
func EchoMany(t testing.TB, n int, dial func() *net.TCPConn) {
	conns := make([]*net.TCPConn, n)
	for i := range conns {
		conns[i] = dial()
	}
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i, c := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			msg := bytes.Repeat([]byte{byte(i)}, 64<<10)
			go func() { _, _ = c.Write(msg); _ = c.CloseWrite() }()
			got, err := io.ReadAll(c)
			if err == nil && !bytes.Equal(got, msg) {
				err = fmt.Errorf("connection %d: echoed %d bytes, not what it sent", i, len(got))
			}
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		testutil.Must(t, err)
	}
}
