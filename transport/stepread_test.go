package transport

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ecxfer/ecxfer/xfer"
)

// heat drains until g is hot, sending a message with send whenever it is
// not: g's goroutine heats it after delivering, while its owner steps.
func heat(t testing.TB, g *guardConn, send, drain func()) {
	t.Helper()
	poll(t, 10*time.Second, "hot connection", func() bool {
		if !g.hot.Load() {
			send()
		}
		drain()
		return g.hot.Load()
	})
}

// seq encodes a message's number.
func seq(i int) []byte { return binary.BigEndian.AppendUint64(nil, uint64(i)) }

// Requests and replies arrive whole and in order, none lost, while both
// owners read some of them in Drain and some through their connections'
// goroutines, switching between the two as they alternate stepping with
// waiting: every rule that hands a connection from one reader to the
// other keeps its messages in order.
func TestStepReadsKeepOrder(t *testing.T) {
	s := newServer(t, ServerConfig{})
	c := newClient(t, ClientConfig{})
	ep := s.Endpoint()
	const n, window = 20000, 64
	stop := make(chan struct{})
	defer close(stop)
	served := make(chan error, 1)
	go func() {
		next := 0
		var msgs []xfer.Message
		waited := time.Now()
		for {
			select {
			case <-stop:
				served <- nil
				return
			default:
			}
			// Now and then a while idle: Wait cools what is hot. By the
			// clock, not by the count of Drains, which a fast machine runs
			// so often that nothing would stay hot between waits.
			if time.Since(waited) > 2*time.Millisecond {
				ctx, cancel := context.WithTimeout(context.Background(), time.Millisecond)
				s.Wait(ctx)
				cancel()
				waited = time.Now()
			}
			msgs = s.Drain(msgs[:0])
			for _, m := range msgs {
				if got := int(binary.BigEndian.Uint64(m.Payload)); got != next {
					served <- fmt.Errorf("request %d came after %d", got, next-1)
					return
				}
				next++
				if err := s.Reply(m.Identity, m.Payload); err != nil {
					served <- err
					return
				}
			}
		}
	}()
	sent, got := 0, 0
	// Both readers were used on both sides, or the test proved little:
	// it goes on past n until they were.
	both := func() bool {
		st, ct := int(s.steps.taken.Load()), int(c.steps.taken.Load())
		return st > 0 && st < sent && ct > 0 && ct < got
	}
	var in []xfer.Inbound
	waited := time.Now()
	deadline := time.Now().Add(60 * time.Second)
	for got < n || !both() {
		for ; sent-got < window; sent++ {
			if err := c.Send(ep, seq(sent)); err != nil {
				t.Fatal(err)
			}
		}
		if time.Since(waited) > 3*time.Millisecond {
			ctx, cancel := context.WithTimeout(context.Background(), time.Millisecond)
			c.Wait(ctx)
			cancel()
			waited = time.Now()
		}
		in = c.Drain(in[:0])
		for _, m := range in {
			if v := int(binary.BigEndian.Uint64(m.Payload)); v != got {
				t.Fatalf("reply %d came after %d", v, got-1)
			}
			got++
		}
		select {
		case err := <-served:
			t.Fatal(err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d replies of %d sent; read in Drain: %d requests, %d replies: want some, not all", got, sent, s.steps.taken.Load(), c.steps.taken.Load())
		}
	}
	t.Logf("read in Drain: %d of %d requests, %d of %d replies", s.steps.taken.Load(), sent, c.steps.taken.Load(), got)
}

// A hot connection's goroutine reads for Wait: a request that comes while
// the server waits wakes it, though the last Drains read the socket.
func TestWaitCoolsHotConnections(t *testing.T) {
	s := newServer(t, ServerConfig{})
	c := newClient(t, ClientConfig{NoSameHost: true}) // its one connection is the one watched
	ep := s.Endpoint()
	clientConn(t, c, ep)
	c.Send(ep, []byte("hello"))
	var sg *guardConn
	poll(t, 10*time.Second, "server connection", func() bool {
		s.connMu.Lock()
		defer s.connMu.Unlock()
		for _, x := range s.conns {
			sg = x
		}
		return sg != nil
	})
	heat(t, sg, func() { c.Send(ep, []byte("warm")) }, func() { s.Drain(nil) })
	woke := make(chan bool, 1)
	go func() { woke <- s.Wait(context.Background()) }()
	poll(t, 10*time.Second, "Wait to cool the connection", func() bool { return !sg.hot.Load() })
	c.Send(ep, []byte("during the wait"))
	select {
	case ok := <-woke:
		if !ok {
			t.Fatal("Wait returned false")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a request during Wait did not wake it")
	}
	var got []xfer.Message
	poll(t, 10*time.Second, "request", func() bool {
		got = s.Drain(got)
		return len(got) > 0 && string(got[len(got)-1].Payload) == "during the wait"
	})
}

// An owner that stops stepping without waiting does not leave a hot
// connection unread: it is handed back to its goroutine, which answers
// PINGs and queues messages again.
func TestHotConnectionCooledWhenStepsStop(t *testing.T) {
	s := newServer(t, ServerConfig{PingInterval: time.Hour})
	raw := rawHandshakeAs(t, s.Addr().String(), "quiet-owner")
	sg := serverConn(t, s, "quiet-owner")
	heat(t, sg, func() { raw.Write(envelope("warm")) }, func() { s.Drain(nil) })
	s.Drain(nil) // a "warm" its goroutine queued as it heated the connection
	raw.Write(envelope("after the steps"))
	poll(t, 10*time.Second, "the request queued by the connection's goroutine", func() bool { return len(s.in) > 0 })
	if sg.hot.Load() {
		t.Fatal("the connection is still hot")
	}
	got := s.Drain(nil)
	if len(got) != 1 || string(got[0].Payload) != "after the steps" {
		t.Fatalf("drained %q", got)
	}
}

// rawHandshakeAs is rawHandshake presenting an identity.
func rawHandshakeAs(t testing.TB, addr, identity string) net.Conn {
	t.Helper()
	network := "tcp"
	if strings.HasPrefix(addr, "/") || strings.HasPrefix(addr, "@") {
		network = "unix"
	}
	c, err := net.Dial(network, addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if err := zmtpHello(c, readyWithIdentity(identity)); err != nil {
		t.Fatalf("handshake: %v", err)
	}
	return c
}

// What a peer sends on a hot connection gets what it gets on a cold one:
// a PING its PONG, a frame over the cap or with bad flags the connection
// closed and counted, and a close the server forgetting the connection.
func TestHotConnectionGuarded(t *testing.T) {
	for _, tc := range []struct {
		name string
		send []byte
	}{
		{"over the cap", binary.BigEndian.AppendUint64([]byte{flagMore, 0, flagLong}, 1<<40)},
		{"bad flags", []byte{0x80, 0}},
		{"command inside a message", append([]byte{flagMore, 0}, floodPing...)},
		{"second READY", readyCommand()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newServer(t, ServerConfig{MaxFrame: 1 << 20, PingInterval: time.Hour})
			s.steps.patience.Store(int64(time.Minute)) // only what is sent cools it
			raw := rawHandshakeAs(t, s.Addr().String(), "hostile")
			sg := serverConn(t, s, "hostile")
			heat(t, sg, func() { raw.Write(envelope("warm")) }, func() { s.Drain(nil) })
			// A PING is answered while the connection is hot.
			raw.Write(floodPing)
			pong := make(chan error, 1)
			go func() {
				raw.SetReadDeadline(time.Now().Add(10 * time.Second))
				b := make([]byte, floodPong)
				_, err := io.ReadFull(raw, b)
				if err == nil && string(b[3:7]) != "PONG" {
					err = fmt.Errorf("got %q", b)
				}
				pong <- err
			}()
			var err error
			poll(t, 10*time.Second, "PONG", func() bool {
				s.Drain(nil)
				select {
				case err = <-pong:
					return true
				default:
					return false
				}
			})
			if err != nil {
				t.Fatalf("PONG: %v", err)
			}
			if !sg.hot.Load() {
				t.Fatal("the connection cooled: the PING was not read in Drain")
			}
			dropped := s.Stats().Dropped
			raw.Write(tc.send)
			done := make(chan struct{})
			go func() {
				defer close(done)
				expectClosed(t, raw, 10*time.Second)
			}()
			poll(t, 10*time.Second, "connection closed", func() bool {
				s.Drain(nil)
				select {
				case <-done:
					return true
				default:
					return false
				}
			})
			if s.Stats().Dropped == dropped {
				t.Fatal("the drop was not counted")
			}
			poll(t, 10*time.Second, "connection forgotten", func() bool {
				return errors.Is(s.Reply([]byte("hostile"), []byte("x")), xfer.ErrPeerDown)
			})
		})
	}
}

// A producer that closes a hot connection is reported dead, as from a cold
// one.
func TestHotConnectionClosedByPeer(t *testing.T) {
	cl, c, g := fakeProducer(t, ClientConfig{PingInterval: time.Hour})
	heat(t, g, func() { c.Write(envelope("warm")) }, func() { cl.Drain(nil) })
	c.Close()
	var dead []xfer.Death
	poll(t, 10*time.Second, "death", func() bool {
		cl.Drain(nil)
		dead = cl.Dead(dead)
		return len(dead) > 0
	})
}

// helloConsumer connects to a producer's data plane as a consumer named
// name, reads its welcome, and returns the producer's side of it too.
func helloConsumer(t testing.TB, p *TCPData, name string) (net.Conn, *servedConn) {
	t.Helper()
	known := map[*servedConn]bool{}
	p.mu.Lock()
	for s := range p.served {
		known[s] = true
	}
	p.mu.Unlock()
	conn, err := net.Dial("tcp", p.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	conn.Write(appendHello(nil, name, 0, nil))
	conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.ReadFull(conn, make([]byte, headLen+proofLen)); err != nil {
		t.Fatalf("welcome: %v", err)
	}
	conn.SetReadDeadline(time.Time{})
	var s *servedConn
	until(t, "the served connection", func() bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		for x := range p.served {
			if !known[x] {
				s = x
			}
		}
		return s != nil
	})
	return conn, s
}

// A producer's loop that drains notifications every step reads the
// connections that bring them itself, and gets every notification, in
// order, also across waits that hand the connection back to its
// goroutine.
func TestProducerDrainsNotificationsInOrder(t *testing.T) {
	p, g := gatedProducer(t, newRegion(t, 8, 4096), TCPConfig{})
	conn, s := helloConsumer(t, p, "notifier")
	proof := g.grant()
	proveConn(t, conn, 1, proof) // a stranger's would be dropped
	waitNotifsOf(t, p, "the proof's notification", func(n xfer.Notif) bool { return bytes.Equal(n.Msg, proof) })
	const n = 20000
	sent := make(chan error, 1)
	stop := make(chan struct{})
	stopWriter := sync.OnceFunc(func() { close(stop) })
	defer stopWriter()
	var taken atomic.Int64
	// The writer goes on past n until stopped: the loop below runs until
	// the connection was read in DrainNotifs, however long that takes.
	go func() {
		var b []byte
		for i := 0; ; i++ {
			b = appendNotify(b, fmt.Appendf(nil, "%d", i))
			if len(b) > 4<<10 || i == n-1 || i%7 == 0 {
				if _, err := conn.Write(b); err != nil {
					sent <- err
					return
				}
				b = b[:0]
				// From the second half on in step with the loop: the
				// connection is idle between writes, when its goroutine may
				// heat it.
				for i >= n/2 && taken.Load() <= int64(i) {
					select {
					case <-stop:
						sent <- nil
						return
					default:
					}
					runtime.Gosched()
				}
			}
		}
	}()
	got, hot := 0, 0
	var notifs []xfer.Notif
	waited := time.Now()
	deadline := time.Now().Add(60 * time.Second)
	for got < n || hot == 0 {
		// Now and then a wait, which cools the connection. By the clock,
		// not by the count of DrainNotifs, which a fast machine runs so
		// often that the connection would hardly stay hot between waits.
		if time.Since(waited) > 2*time.Millisecond {
			done := tcpPlane{p}.Waiting() // as the producer's wait does
			if s.hot.Load() {
				t.Fatal("a wait left the connection hot")
			}
			done()
			waited = time.Now()
		}
		if s.hot.Load() {
			hot++
		}
		notifs, _ = p.DrainNotifs(notifs[:0])
		for _, m := range notifs {
			if string(m.Msg) != fmt.Sprint(got) || m.Agent != "notifier" {
				t.Fatalf("notification %q from %q, want %d", m.Msg, m.Agent, got)
			}
			got++
		}
		taken.Store(int64(got))
		if time.Now().After(deadline) {
			t.Fatalf("%d notifications of at least %d; the connection read in DrainNotifs in %d steps, want some", got, n, hot)
		}
	}
	stopWriter()
	if err := <-sent; err != nil {
		t.Fatal(err)
	}
}

// On a hot served connection, whatever is not a notification (here a
// frame with a bad magic) goes to its goroutine, which closes the
// connection as it always does; and Close wakes a goroutine that waits to
// be cooled.
func TestHotServedConnection(t *testing.T) {
	p, g := gatedProducer(t, newRegion(t, 8, 4096), TCPConfig{})
	conn, s := helloConsumer(t, p, "notifier")
	proveConn(t, conn, 1, g.grant()) // a stranger's would be dropped
	heatServed := func() {
		t.Helper()
		until(t, "a hot connection", func() bool {
			if !s.hot.Load() {
				conn.Write(appendNotify(nil, []byte("warm")))
			}
			p.DrainNotifs(nil)
			return s.hot.Load()
		})
	}
	heatServed()
	q := s.c.(*quietConn)
	until(t, "the connection out of Go's poller", func() bool {
		p.DrainNotifs(nil)
		return q.detached.Load()
	})
	conn.Write(appendNotify(nil, []byte("while detached")))
	until(t, "the notification read by DrainNotifs", func() bool {
		got, _ := p.DrainNotifs(nil)
		return len(got) > 0 && string(got[len(got)-1].Msg) == "while detached"
	})
	conn.Write([]byte("XXXX\x06\x00\x00"))
	closed := make(chan struct{})
	go func() {
		defer close(closed)
		conn.SetReadDeadline(time.Now().Add(10 * time.Second))
		io.Copy(io.Discard, conn)
	}()
	until(t, "the connection closed", func() bool {
		p.DrainNotifs(nil)
		select {
		case <-closed:
			return true
		default:
			return false
		}
	})
	conn, s = helloConsumer(t, p, "second")
	proveConn(t, conn, 1, g.grant())
	heatServed()
	done := make(chan struct{})
	go func() { p.Close(); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("Close waited for a hot connection's goroutine")
	}
}
