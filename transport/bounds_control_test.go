package transport

import (
	"io"
	"net"
	"reflect"
	"runtime"
	"sync"
	"testing"
	"time"
	"unsafe"
)

// zmq4Conns returns how many connections the server's zmq4 socket holds:
// one it never forgets keeps its buffers until the server closes.
func zmq4Conns(s *Server) int {
	sck := reflect.ValueOf(s.sock).Elem().Field(0).Elem() // *routerSocket's *socket
	mu := (*sync.RWMutex)(unsafe.Pointer(sck.FieldByName("mu").UnsafeAddr()))
	mu.RLock()
	defer mu.RUnlock()
	return sck.FieldByName("conns").Len()
}

// registered returns how many connections the server routes replies to.
func registered(s *Server) int {
	s.connMu.Lock()
	defer s.connMu.Unlock()
	return len(s.conns)
}

// dialFrom connects to addr from the local address ip (any 127/8 address
// is this host's on Linux), sends our greeting and reads the server's.
func dialFrom(t testing.TB, ip, addr string) net.Conn {
	t.Helper()
	return dialGreet(t, net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}}, "tcp", addr)
}

// dialGreet connects with d, sends our greeting and reads the server's.
func dialGreet(t testing.TB, d net.Dialer, network, addr string) net.Conn {
	t.Helper()
	c, err := d.Dial(network, addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(5 * time.Second))
	c.Write(zmtpGreeting)
	if _, err := io.ReadFull(c, make([]byte, greetingLen)); err != nil {
		t.Fatalf("greeting: %v", err)
	}
	return c
}

// ready ends the handshake dialFrom began, with identity id, and waits
// until the server routes replies to it.
func ready(t testing.TB, s *Server, c net.Conn, id string) {
	t.Helper()
	c.Write(readyWithIdentity(id))
	var hdr [2]byte
	if _, err := io.ReadFull(c, hdr[:]); err != nil {
		t.Fatalf("READY: %v", err)
	}
	if _, err := io.ReadFull(c, make([]byte, hdr[1])); err != nil {
		t.Fatalf("READY body: %v", err)
	}
	c.SetDeadline(time.Time{})
	serverConn(t, s, id)
}

// request sends one request on c and waits until Drain hands it out.
func request(t testing.TB, s *Server, c net.Conn, id string) {
	t.Helper()
	c.Write(envelope(id))
	until(t, "request from "+id, func() bool {
		for _, m := range s.Drain(nil) {
			if string(m.Identity) == id {
				return true
			}
		}
		return false
	})
}

// The control-plane server bounds the connections whose handshake is
// done, not only those in progress (MaxPending): one peer opening as many
// as it likes, each answering the heartbeat, holds MaxConns of them, and
// each one shed is forgotten by zmq4 and its goroutines end.
func TestControlConnsBounded(t *testing.T) {
	const maxConns, conns = 16, 200
	s := newServer(t, ServerConfig{MaxPending: 4, MaxConns: maxConns})
	gr0 := runtime.NumGoroutine()
	var cs []net.Conn
	for range conns {
		cs = append(cs, rawHandshake(t, s.Addr().String()))
	}
	defer func() {
		for _, c := range cs {
			c.Close()
		}
	}()
	until(t, "every connection past the cap shed", func() bool { return s.Stats().Shed == conns-maxConns })
	until(t, "zmq4 forgets the shed connections", func() bool { return zmq4Conns(s) == maxConns })
	if n := registered(s); n != maxConns {
		t.Fatalf("%d connections registered, want %d", n, maxConns)
	}
	// zmq4's reader, our heartbeat and writer: three per connection kept.
	until(t, "the shed connections' goroutines end", func() bool {
		return runtime.NumGoroutine()-gr0 <= 3*maxConns+4
	})
	for _, c := range cs[:conns-maxConns] { // the oldest went first
		expectClosed(t, c, 5*time.Second)
	}
}

// At the cap the connection gone longest without a request is shed, not
// one that carries requests; and a newcomer is refused only when every
// connection sent a request since it connected.
func TestControlShedsIdlestConn(t *testing.T) {
	s := newServer(t, ServerConfig{MaxConns: 3})
	addr := s.Addr().String()
	a, b, c := dialFrom(t, "127.0.0.1", addr), dialFrom(t, "127.0.0.1", addr), dialFrom(t, "127.0.0.1", addr)
	ready(t, s, a, "a")
	ready(t, s, b, "b")
	ready(t, s, c, "c")
	request(t, s, a, "a") // b, then c, have been idle longest
	d := dialFrom(t, "127.0.0.1", addr)
	ready(t, s, d, "d")
	expectClosed(t, b, 5*time.Second)
	until(t, "b forgotten", func() bool { return zmq4Conns(s) == 3 && registered(s) == 3 })

	// e connects; then a, c and d all send requests before e's handshake
	// ends: e is the idlest, and is refused.
	e := dialFrom(t, "127.0.0.1", addr)
	request(t, s, a, "a")
	request(t, s, c, "c")
	request(t, s, d, "d")
	e.Write(readyWithIdentity("e"))
	expectClosed(t, e, 5*time.Second)
	if st := s.Stats(); st.Shed != 2 {
		t.Fatalf("shed %d, want 2", st.Shed)
	}
	for _, id := range []string{"a", "c", "d"} {
		if err := s.Reply([]byte(id), []byte("still here")); err != nil {
			t.Fatalf("reply to %s: %v", id, err)
		}
	}
	if n := zmq4Conns(s); n != 3 {
		t.Fatalf("zmq4 holds %d connections, want 3", n)
	}
}

// One host holds at most MaxConnsPerHost connections: its newcomer sheds
// that host's idlest, and another host's connection, idle longer still,
// stays.
func TestControlConnsPerHost(t *testing.T) {
	s := newServer(t, ServerConfig{MaxConnsPerHost: 2})
	addr := s.Addr().String()
	other := dialFrom(t, "127.0.0.2", addr)
	ready(t, s, other, "other")
	a, b := dialFrom(t, "127.0.0.1", addr), dialFrom(t, "127.0.0.1", addr)
	ready(t, s, a, "a")
	ready(t, s, b, "b")
	request(t, s, a, "a")
	c := dialFrom(t, "127.0.0.1", addr)
	ready(t, s, c, "c")
	expectClosed(t, b, 5*time.Second)
	until(t, "b forgotten", func() bool { return zmq4Conns(s) == 3 && registered(s) == 3 })
	if st := s.Stats(); st.Shed != 1 {
		t.Fatalf("shed %d, want 1", st.Shed)
	}
	for _, id := range []string{"other", "a", "c"} {
		if err := s.Reply([]byte(id), []byte("still here")); err != nil {
			t.Fatalf("reply to %s: %v", id, err)
		}
	}
}

// A connection the guard closes for what its peer sent after the
// handshake is forgotten by zmq4 too, not kept until the server closes.
func TestGuardFailedConnForgotten(t *testing.T) {
	s := newServer(t, ServerConfig{})
	c := dialFrom(t, "127.0.0.1", s.Addr().String())
	ready(t, s, c, "bad")
	request(t, s, c, "bad")
	c.Write([]byte{0x80, 0}) // bad frame flags
	expectClosed(t, c, 5*time.Second)
	until(t, "zmq4 forgets the failed connection", func() bool { return zmq4Conns(s) == 0 })
}
