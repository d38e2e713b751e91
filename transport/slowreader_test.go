package transport

import (
	"fmt"
	"net"
	"strings"
	"testing"
	"time"
)

// The write deadline bounds the time the peer takes no byte, not the time
// one write takes: a peer reading steadily but slowly keeps its
// connection while far more than a deadline's worth of bytes waits for
// it, on the server and on the client alike; one that then stops reading
// is cut off within about the deadline.
func TestWriteDeadlineRenewedOnProgress(t *testing.T) {
	const timeout = 400 * time.Millisecond
	t.Run("server", func(t *testing.T) {
		s := newServer(t, ServerConfig{WriteTimeout: timeout})
		c := rawConsumers(t, s, "slow")[0] // the server's send buffer is small
		g := serverConn(t, s, "slow")
		steadyThenStop(t, c, g, timeout, func(p []byte) error { return s.Reply([]byte("slow"), p) })
	})
	t.Run("client", func(t *testing.T) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		accepted := make(chan net.Conn, 1)
		go func() {
			defer close(accepted)
			c, err := ln.Accept()
			if err != nil {
				return
			}
			ready := readyCommand()
			copy(ready[len(ready)-6:], "ROUTER")
			if err := zmtpHello(c, ready); err != nil {
				c.Close()
				return
			}
			accepted <- c
		}()
		cl := newClient(t, ClientConfig{WriteTimeout: timeout})
		ep := "tcp://" + ln.Addr().String()
		g := clientConn(t, cl, ep)
		c := <-accepted
		if c == nil {
			t.Fatal("the producer's handshake failed")
		}
		defer c.Close()
		if q, ok := g.Conn.(*quietConn); ok {
			q.tc.SetWriteBuffer(8 << 10)
		}
		steadyThenStop(t, c, g, timeout, func(p []byte) error { return cl.Send(ep, p) })
	})
}

// steadyThenStop queues 6 MiB for c with send while reading half of it
// from c at 16 KiB every 5 ms (at least 0.96 s, more than twice timeout),
// checking that the connection stays up, then stops reading and checks
// that g is cut off within a few timeouts.
func steadyThenStop(t *testing.T, c net.Conn, g *guardConn, timeout time.Duration, send func([]byte) error) {
	t.Helper()
	sent := make(chan error, 1)
	go func() {
		p := make([]byte, 200<<10)
		for i := range 30 {
			if err := send(p); err != nil {
				sent <- fmt.Errorf("send %d: %w", i, err)
				return
			}
		}
		sent <- nil
	}()
	buf := make([]byte, 16<<10)
	start := time.Now()
	for total := 0; total < 3<<20; {
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		n, err := c.Read(buf)
		total += n
		if err != nil {
			t.Fatalf("cut off after %d bytes in %v of steady reading: %v (our side: %v)", total, time.Since(start), err, g.cause())
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := <-sent; err != nil {
		t.Fatal(err)
	}
	select {
	case <-g.done:
		t.Fatalf("the connection failed while its peer read steadily: %v", g.cause())
	default:
	}
	select {
	case <-g.done:
	case <-time.After(8 * timeout):
		t.Fatalf("still up %v after its peer stopped reading", 8*timeout)
	}
	if got := g.cause().Error(); !strings.Contains(got, "took no byte for "+timeout.String()) {
		t.Fatalf("cut off as %q: it should say the peer took no byte for the write timeout", got)
	}
}

// writeFull and writeBy notice a stall between the timeout and a quarter
// more after the last byte the peer took: a byte taken just after a try
// began does not buy the peer a second timeout.
func TestWriteNoticesAStallWithinItsTimeout(t *testing.T) {
	const timeout = 400 * time.Millisecond
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	// The last byte the peer took was taken between before and after: a
	// loaded machine may delay either stamp, never move the byte out.
	type taken struct{ before, after time.Time }
	took := make(chan taken, 1)
	go func() {
		var one [1]byte
		var last taken
		defer func() { took <- last }()
		for _, pause := range []time.Duration{10 * time.Millisecond, 3 * timeout / 4, timeout / 4} {
			// 3/4 of the timeout: not a stall; then a quarter more, just
			// after a whole-timeout deadline would be renewed; then
			// nothing more.
			time.Sleep(pause)
			before := time.Now()
			if _, err := b.Read(one[:]); err != nil {
				return // the writer gave up first (a slow machine's sleep)
			}
			last = taken{before, time.Now()}
		}
	}()
	err := writeFull(a, net.Buffers{make([]byte, 1<<20)}, timeout)
	cut := time.Now()
	a.Close() // a Read still waiting returns
	var last taken
	select {
	case last = <-took:
	case <-time.After(10 * time.Second):
		t.Fatal("the reader did not end")
	}
	if err == nil {
		t.Fatal("a write the peer stopped taking succeeded")
	}
	if last.before.IsZero() {
		t.Fatal("the write was cut before the peer took a byte")
	}
	if early, late := cut.Sub(last.before), cut.Sub(last.after); early < timeout || late > timeout+timeout/4+100*time.Millisecond {
		t.Fatalf("cut %v after the last byte the peer took (read %v long); want between %v and %v (and scheduling)", late, early-late, timeout, timeout+timeout/4)
	}
}
