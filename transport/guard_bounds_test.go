package transport

import (
	"bytes"
	"context"
	"encoding/binary"
	"io"
	"net"
	"runtime"
	"syscall"
	"testing"
	"time"
)

// What a peer can make the guard hold is bounded by us: one PONG and one
// PING unwritten however many PINGs arrive, and a declared frame's buffer
// grows only as its bytes arrive.

var (
	floodPing = appendCommand(nil, "PING", append([]byte{0, 0}, "0123456789abcdef"...))
	floodPong = len(appendCommand(nil, "PONG", []byte("0123456789abcdef")))
	ourPing   = len(appendCommand(nil, "PING", []byte{0, 0}))
)

// smallRcvbuf keeps a socket's receive buffer small, so that a peer that
// never reads fills it with little.
func smallRcvbuf(_, _ string, rc syscall.RawConn) error {
	var err error
	rc.Control(func(fd uintptr) {
		err = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096)
	})
	return err
}

// zmtpHello sends our greeting and the READY command ready on c, and
// reads the other side's.
func zmtpHello(c net.Conn, ready []byte) error {
	c.SetDeadline(time.Now().Add(10 * time.Second))
	defer c.SetDeadline(time.Time{})
	c.Write(zmtpGreeting)
	if _, err := io.ReadFull(c, make([]byte, greetingLen)); err != nil {
		return err
	}
	c.Write(ready)
	var hdr [2]byte
	if _, err := io.ReadFull(c, hdr[:]); err != nil {
		return err
	}
	_, err := io.ReadFull(c, make([]byte, hdr[1]))
	return err
}

// envelope encodes the message ["", payload] with short frames.
func envelope(payload string) []byte {
	return append([]byte{flagMore, 0, 0, byte(len(payload))}, payload...)
}

// poll waits until cond holds, failing after limit.
func poll(t testing.TB, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(limit); !cond(); time.Sleep(100 * time.Microsecond) {
		if time.Now().After(end) {
			t.Fatalf("no %s after %v", what, limit)
		}
	}
}

// floodPings writes rounds of PINGs on c, each followed by a message, and
// never reads. After each round has been read (marks reports the messages
// delivered) the guard's unwritten bytes must stay within limit. It goes
// on until the socket has been full (a PONG left unwritten) for 32 rounds.
func floodPings(t *testing.T, c net.Conn, marks func() int, pending func() int, limit int) {
	t.Helper()
	const perRound = 4096
	round := append(bytes.Repeat(floodPing, perRound), envelope("mark")...)
	full := -1
	for i := range 2000 { // 200 MiB of PINGs; the socket fills after a few MiB
		c.SetWriteDeadline(time.Now().Add(30 * time.Second))
		if _, err := c.Write(round); err != nil {
			t.Fatalf("round %d: %v", i, err)
		}
		poll(t, 30*time.Second, "mark", func() bool { return marks() > i })
		n := pending()
		if n > limit {
			t.Fatalf("after %d PINGs the guard holds %d bytes unwritten (limit %d; a PONG is %d)",
				(i+1)*perRound, n, limit, floodPong)
		}
		if n > 0 && full < 0 {
			full = i
			t.Logf("socket full after %d PINGs", (i+1)*perRound)
		}
		if full >= 0 && i >= full+32 {
			return
		}
	}
	t.Fatal("the socket never filled: the flood proved nothing")
}

// serverConn returns the server's connection for identity, once it is
// registered.
func serverConn(t testing.TB, s *Server, identity string) *guardConn {
	t.Helper()
	var g *guardConn
	poll(t, 10*time.Second, "connection", func() bool {
		s.connMu.Lock()
		g = s.conns[identity]
		s.connMu.Unlock()
		return g != nil
	})
	return g
}

// clientConn returns the client's connection to ep, once it is up.
func clientConn(t testing.TB, c *Client, ep string) *guardConn {
	t.Helper()
	if err := c.Connect(context.Background(), ep); err != nil {
		t.Fatal(err)
	}
	c.mu.Lock()
	d := c.peers[ep]
	c.mu.Unlock()
	d.qmu.Lock()
	defer d.qmu.Unlock()
	return d.g
}

// floodServer connects to a server as a DEALER that will never read.
func floodServer(t *testing.T, cfg ServerConfig) (*Server, net.Conn, *guardConn) {
	t.Helper()
	s := newServer(t, cfg)
	d := net.Dialer{Control: smallRcvbuf}
	c, err := d.Dial("tcp", s.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if err := zmtpHello(c, readyWithIdentity("flood")); err != nil {
		t.Fatalf("handshake: %v", err)
	}
	return s, c, serverConn(t, s, "flood")
}

func serverMarks(s *Server) func() int {
	n := 0
	return func() int {
		for _, m := range s.Drain(nil) {
			if string(m.Payload) == "mark" {
				n++
			}
		}
		return n
	}
}

// A consumer that floods PINGs and never reads leaves at most one PONG
// unwritten on the server.
func TestServerPingFloodKeepsOnePong(t *testing.T) {
	s, c, g := floodServer(t, ServerConfig{PingInterval: time.Hour, WriteTimeout: time.Minute})
	floodPings(t, c, serverMarks(s), g.pendingOut, floodPong)
}

// fakeProducer accepts one connection from a Client, as a ROUTER that will
// never read, and returns the client, our connection and the client's.
func fakeProducer(t *testing.T, cfg ClientConfig) (*Client, net.Conn, *guardConn) {
	t.Helper()
	lc := net.ListenConfig{Control: smallRcvbuf}
	ln, err := lc.Listen(context.Background(), "tcp", "127.0.0.1:0")
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
	cl := newClient(t, cfg)
	ep := "tcp://" + ln.Addr().String()
	g := clientConn(t, cl, ep)
	c := <-accepted
	if c == nil {
		t.Fatal("the producer's handshake failed")
	}
	t.Cleanup(func() { c.Close() })
	return cl, c, g
}

func clientMarks(cl *Client) func() int {
	n := 0
	return func() int {
		for _, m := range cl.Drain(nil) {
			if string(m.Payload) == "mark" {
				n++
			}
		}
		return n
	}
}

// A producer that floods PINGs and never reads leaves at most one PONG
// unwritten on the client.
func TestClientPingFloodKeepsOnePong(t *testing.T) {
	cl, c, g := fakeProducer(t, ClientConfig{PingInterval: time.Hour, WriteTimeout: time.Minute})
	floodPings(t, c, clientMarks(cl), g.pendingOut, floodPong)
}

// While the socket is full, the heartbeat's PINGs do not pile up either:
// one waits behind the PONG, and later ticks add nothing.
func TestHeartbeatKeepsOnePing(t *testing.T) {
	const interval = 5 * time.Millisecond
	s, c, g := floodServer(t, ServerConfig{PingInterval: interval, PeerTimeout: time.Hour, WriteTimeout: time.Minute})
	limit := floodPong + ourPing
	floodPings(t, c, serverMarks(s), g.pendingOut, limit)
	poll(t, 10*time.Second, "PING behind the PONG", func() bool {
		g.omu.Lock()
		defer g.omu.Unlock()
		return g.oqueued&ctlPing != 0
	})
	// Later ticks leave no trace to wait for: watch through 100 of them.
	for end := time.Now().Add(100 * interval); time.Now().Before(end); time.Sleep(interval / 5) {
		if n := g.pendingOut(); n > limit {
			t.Fatalf("the guard holds %d bytes unwritten (a PONG and a PING are %d)", n, limit)
		}
	}
}

// trickleFrame declares a frame of size bytes on c, in the message ["",
// body], and sends its first MiB in 64 KiB pieces, each read by g before
// the next: what the process has allocated meanwhile must stay far under
// size. Then it sends the rest and returns the body sent.
func trickleFrame(t *testing.T, c net.Conn, g *guardConn, size int) []byte {
	t.Helper()
	const piece, trickled = 64 << 10, 1 << 20
	const bound = 8 << 20 // twice what arrived, plus room for the rest of the process
	body := make([]byte, size)
	for i := range body {
		body[i] = byte(i * 7)
	}
	hdr := binary.BigEndian.AppendUint64([]byte{flagMore, 0, flagLong}, uint64(size))
	base := g.inBytes.Load()
	var m runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&m)
	before := m.TotalAlloc
	sent, most := 0, uint64(0)
	send := func(b []byte) {
		c.SetWriteDeadline(time.Now().Add(30 * time.Second))
		if _, err := c.Write(b); err != nil {
			t.Fatal(err)
		}
		sent += len(b)
	}
	send(hdr)
	for off := 0; off < trickled; off += piece {
		send(body[off : off+piece])
		poll(t, 10*time.Second, "bytes read", func() bool { return g.inBytes.Load() >= base+uint64(sent) })
		runtime.ReadMemStats(&m)
		d := m.TotalAlloc - before
		if d > bound {
			t.Fatalf("%d bytes of a declared %d-byte frame arrived; %d bytes allocated meanwhile", sent-len(hdr), size, d)
		}
		most = d
	}
	t.Logf("%d bytes allocated while the first %d of a declared %d arrived", most, trickled, size)
	send(body[trickled:])
	return body
}

// A consumer declaring a 48 MiB request and sending it slowly: the server
// allocates as the bytes arrive, and the request is delivered whole.
func TestServerLargeFrameGrowsAsItArrives(t *testing.T) {
	s, c, g := floodServer(t, ServerConfig{MaxFrame: 64 << 20, PingInterval: time.Hour})
	marks := serverMarks(s)
	c.Write(envelope("mark")) // everything before the frame has been read
	poll(t, 10*time.Second, "mark", func() bool { return marks() > 0 })
	body := trickleFrame(t, c, g, 48<<20)
	var got []byte
	poll(t, 30*time.Second, "request", func() bool {
		for _, m := range s.Drain(nil) {
			got = m.Payload
		}
		return got != nil
	})
	if !bytes.Equal(got, body) {
		t.Fatalf("request of %d bytes differs from the %d sent", len(got), len(body))
	}
}

// The same from a producer to a client (whose frames may be 64 MiB).
func TestClientLargeFrameGrowsAsItArrives(t *testing.T) {
	cl, c, g := fakeProducer(t, ClientConfig{PingInterval: time.Hour})
	marks := clientMarks(cl)
	c.Write(envelope("mark"))
	poll(t, 10*time.Second, "mark", func() bool { return marks() > 0 })
	body := trickleFrame(t, c, g, 48<<20)
	var got []byte
	poll(t, 30*time.Second, "reply", func() bool {
		for _, m := range cl.Drain(nil) {
			got = m.Payload
		}
		return got != nil
	})
	if !bytes.Equal(got, body) {
		t.Fatalf("reply of %d bytes differs from the %d sent", len(got), len(body))
	}
}

// A large frame arriving in pieces is held in one buffer that grows by
// doubling up to the frame's size, and that buffer is the body delivered:
// at no time do its buffers hold more than half as much again as the
// frame, nor more than four times what arrived, and the frame is not
// copied once whole.
func TestLargeFrameHeldOnce(t *testing.T) {
	var st controlCounters
	cfg := newGuardConfig(64<<20, time.Second, 0, 0, 0, 0, 0, &st)
	c1, c2 := net.Pipe()
	defer c1.Close()
	defer c2.Close()
	g := newGuardConn(c1, cfg, nil, true)
	g.readyIn.Store(true)
	const size = 6<<20 + 5
	var got [][]byte
	g.sink = func(_ *guardConn, frames [][]byte) bool {
		got = append(got, frames...)
		return true
	}
	msg := make([]byte, 9+size+2+3)
	msg[0] = flagLong
	binary.BigEndian.PutUint64(msg[1:9], size)
	for i := range size {
		msg[9+i] = byte(i * 7)
	}
	copy(msg[9+size:], []byte{0, 3, 'a', 'b', 'c'}) // a small message after it
	most, sent := 0, 0
	for p := msg; len(p) > 0; {
		n := min(len(p), 16<<10)
		before := cap(g.in)
		if err := g.feed(p[:n]); err != nil {
			t.Fatal(err)
		}
		p, sent = p[n:], sent+n
		if cap(g.in) != before { // both buffers live while it copies
			most = max(most, before+cap(g.in))
		}
		if cap(g.in) > 4*sent+readChunk {
			t.Fatalf("after %d bytes the guard holds a buffer of %d", sent, cap(g.in))
		}
	}
	if len(got) != 2 || len(got[0]) != size || string(got[1]) != "abc" {
		t.Fatalf("delivered %d frames", len(got))
	}
	if !bytes.Equal(got[0], msg[9:9+size]) {
		t.Fatal("the large frame's bytes differ")
	}
	if cap(got[0]) != size {
		t.Errorf("the body's buffer holds %d bytes for a frame of %d", cap(got[0]), size)
	}
	if most > (9+size)*3/2 {
		t.Errorf("the guard held %d bytes at once for a frame of %d", most, size)
	}
}
