package transport

import (
	"net"
	"testing"
	"time"
)

// A greeting whose as-server byte is neither 0 nor 1 is refused: zmq4
// fails on it without closing the connection, which, never started, was
// never shed and had no deadline, so that MaxConnsPerHost of them locked a
// host's consumers out for good. The 0 case is the control.
func TestBadAsServerGreetingClosed(t *testing.T) {
	for _, as := range []byte{0, 2} {
		t.Run(string('0'+as), func(t *testing.T) { badAsServer(t, as) })
	}
}

func badAsServer(t *testing.T, as byte) {
	s := newServer(t, ServerConfig{MaxConnsPerHost: 4, HandshakeTimeout: 500 * time.Millisecond, PeerTimeout: time.Second, PingInterval: 200 * time.Millisecond})
	greet := append([]byte(nil), zmtpGreeting...)
	greet[32] = as
	var bad []net.Conn
	for range 4 {
		c, err := net.Dial("tcp", s.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.Write(greet)
		c.Write(readyCommand())
		bad = append(bad, c)
	}
	time.Sleep(3 * time.Second) // past handshake and peer timeouts
	for i, c := range bad {
		c.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
		var b [256]byte
		var err error
		for err == nil {
			_, err = c.Read(b[:])
		}
		if ne, ok := err.(net.Error); ok && ne.Timeout() {
			t.Logf("bad connection %d still open after 3 s", i)
		}
	}
	// An honest consumer from the same host.
	c := newClient(t, ClientConfig{})
	stop := make(chan struct{})
	defer close(stop)
	echo(t, s, stop)
	c.Send(s.Endpoint(), []byte("x"))
	waitInbound(t, c, 1, 5*time.Second)
}
