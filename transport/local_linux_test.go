package transport

import (
	"bytes"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/ecxfer/ecxfer/xfer"
)

// networkOf returns the network of the connection the server routes
// replies for identity over: "tcp" or "unix".
func networkOf(t testing.TB, s *Server, identity []byte) string {
	t.Helper()
	s.connMu.Lock()
	defer s.connMu.Unlock()
	g := s.conns[string(identity)]
	if g == nil {
		t.Fatalf("no connection for %q", identity)
	}
	return g.RemoteAddr().Network()
}

// held is a server that answers only when told: requests wait in got.
type held struct {
	s   *Server
	got []xfer.Message
}

func (h *held) take(t testing.TB, n int) []xfer.Message {
	t.Helper()
	until(t, fmt.Sprintf("%d requests", n), func() bool {
		for _, m := range h.s.Drain(nil) {
			m.Identity = bytes.Clone(m.Identity)
			h.got = append(h.got, m)
		}
		return len(h.got) >= n
	})
	out := h.got[:n]
	h.got = h.got[n:]
	return out
}

func (h *held) answer(t testing.TB, ms []xfer.Message) {
	t.Helper()
	for _, m := range ms {
		if err := h.s.Reply(m.Identity, append([]byte("re:"), m.Payload...)); err != nil {
			t.Fatal(err)
		}
	}
}

// One request at a time to a producer on this host: the first goes over
// TCP (unless the move was ready before it was sent: the dial goes on
// while Send returns); once the same-host socket is proven, the next goes
// over it, every reply in order, and the TCP connection is closed.
func TestSameHostChannelTaken(t *testing.T) {
	h := &held{s: newServer(t, ServerConfig{})}
	c := newClient(t, ClientConfig{})
	ep := h.s.Endpoint()
	var nets []string
	for i := range 20 {
		if err := c.Send(ep, fmt.Appendf(nil, "m%d", i)); err != nil {
			t.Fatal(err)
		}
		m := h.take(t, 1)
		nets = append(nets, networkOf(t, h.s, m[0].Identity))
		h.answer(t, m)
		if r := waitInbound(t, c, 1, 10*time.Second); string(r[0].Payload) != fmt.Sprintf("re:m%d", i) {
			t.Fatalf("reply %d: %q", i, r[0].Payload)
		}
		if i == 0 {
			until(t, "the same-host socket proven", func() bool { return c.Stats().SameHost == 1 })
		}
	}
	if strings.Count(strings.Join(nets, ","), "tcp") > 1 || nets[1] != "unix" {
		t.Fatalf("requests went over %v", nets)
	}
	until(t, "the TCP connection closed", func() bool { return registered(h.s) == 1 })
	if cs, ss := c.Stats(), h.s.Stats(); cs.SameHost != 1 || cs.SameHostFailed != 0 || ss.SameHost != 1 || ss.SameHostFailed != 0 {
		t.Fatalf("client %+v, server %+v", cs, ss)
	}
	if d := c.Dead(nil); len(d) != 0 {
		t.Fatalf("the TCP connection's close reported as a death: %v", d)
	}
}

// The rule that keeps replies in order: while a request sent over TCP is
// unanswered, every request goes over TCP, the proven socket unused;
// the first one after the last TCP reply moves.
func TestSameHostChannelWaitsForTCPReplies(t *testing.T) {
	h := &held{s: newServer(t, ServerConfig{})}
	c := newClient(t, ClientConfig{})
	ep := h.s.Endpoint()
	send := func(p string) {
		t.Helper()
		if err := c.Send(ep, []byte(p)); err != nil {
			t.Fatal(err)
		}
	}
	send("a")
	first := h.take(t, 1)
	if networkOf(t, h.s, first[0].Identity) != "tcp" {
		t.Skip("the move was ready before the first request was sent: nothing to show")
	}
	until(t, "the same-host socket proven", func() bool { return c.Stats().SameHost == 1 })
	send("b")
	send("c")
	later := h.take(t, 2)
	for _, m := range later {
		if n := networkOf(t, h.s, m.Identity); n != "tcp" {
			t.Fatalf("%s went over %s with a TCP request unanswered", m.Payload, n)
		}
	}
	h.answer(t, first)
	h.answer(t, later[:1])
	waitInbound(t, c, 2, 10*time.Second)
	send("d") // "c" is unanswered still
	if m := h.take(t, 1); networkOf(t, h.s, m[0].Identity) != "tcp" {
		t.Fatal("d left TCP with c unanswered")
	} else {
		later = append(later[1:], m[0])
	}
	h.answer(t, later)
	got := waitInbound(t, c, 2, 10*time.Second)
	if string(got[0].Payload) != "re:c" || string(got[1].Payload) != "re:d" {
		t.Fatalf("replies %q %q", got[0].Payload, got[1].Payload)
	}
	send("e")
	if m := h.take(t, 1); networkOf(t, h.s, m[0].Identity) != "unix" {
		t.Fatal("e stayed on TCP with nothing unanswered")
	}
}

// Either side can refuse: a client that does not ask, or a server that
// offers nothing, stays on TCP, with nothing counted as failed.
func TestSameHostChannelRefused(t *testing.T) {
	for _, tc := range []struct {
		name string
		s    ServerConfig
		c    ClientConfig
	}{{"server", ServerConfig{NoSameHost: true}, ClientConfig{}}, {"client", ServerConfig{}, ClientConfig{NoSameHost: true}}} {
		t.Run(tc.name, func(t *testing.T) {
			s := newServer(t, tc.s)
			stop := make(chan struct{})
			defer close(stop)
			echo(t, s, stop)
			c := newClient(t, tc.c)
			for i := range 5 {
				c.Send(s.Endpoint(), []byte("x"))
				waitInbound(t, c, 1, 10*time.Second)
				if i == 0 {
					time.Sleep(10 * time.Millisecond) // an offer, if any, in time for the next
				}
			}
			if cs, ss := c.Stats(), s.Stats(); cs.SameHost+cs.SameHostFailed+ss.SameHost+ss.SameHostFailed != 0 {
				t.Fatalf("client %+v, server %+v", cs, ss)
			}
		})
	}
}

// Once moved, the producer's death is the Unix-domain connection's end:
// reported as before.
func TestSameHostChannelDeath(t *testing.T) {
	s := newServer(t, ServerConfig{})
	stop := make(chan struct{})
	echo(t, s, stop)
	c := newClient(t, ClientConfig{})
	for range 3 {
		c.Send(s.Endpoint(), []byte("x"))
		waitInbound(t, c, 1, 10*time.Second)
		until(t, "proven", func() bool { return c.Stats().SameHost == 1 })
	}
	until(t, "only the same-host connection", func() bool { return registered(s) == 1 })
	close(stop)
	s.Close()
	if a, _ := waitDead(t, c, 10*time.Second); a != s.Endpoint() {
		t.Fatalf("dead %q", a)
	}
}

// The proof: only the key's holder answers, for the address the ticket's
// connection reached, once per ticket; a hello without a known ticket is
// refused.
func TestSameHostProof(t *testing.T) {
	l := &guardListener{cfg: &guardConfig{}, conns: map[*guardConn]struct{}{},
		tickets: map[[localTicketLen]byte]localTicket{}, ticketOf: map[*guardConn][localTicketLen]byte{}}
	lln, err := listenLocal()
	if err != nil {
		t.Fatal(err)
	}
	defer lln.Close()
	l.local, l.localName = lln, lln.Addr().String()
	tcpConn := &guardConn{Conn: fakeAddrConn{local: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 5555}}}
	offer := func() localOffer {
		l.mu.Lock()
		cmd := l.offerLocked(tcpConn)
		l.mu.Unlock()
		_, body, _ := parseCommand(cmd[2:])
		o, ok := parseLocalOffer(body)
		if !ok || o.name != l.localName {
			t.Fatalf("offer %q", body)
		}
		return o
	}
	// try runs one hello against redeem and returns both sides' errors.
	try := func(o localOffer, addr string) (client, server error) {
		a, b := net.Pipe()
		defer a.Close()
		defer b.Close()
		done := make(chan error, 1)
		go func() { done <- l.redeem(b); b.Close() }()
		client = proveLocal(a, o, addr, 5*time.Second)
		return client, <-done
	}
	o := offer()
	if c, s := try(o, "127.0.0.1:5555"); c != nil || s != nil {
		t.Fatalf("the right ticket and address: %v, %v", c, s)
	}
	if c, s := try(o, "127.0.0.1:5555"); c == nil || s == nil || !strings.Contains(s.Error(), "unknown ticket") {
		t.Fatalf("a ticket used twice: %v, %v", c, s)
	}
	if c, _ := try(offer(), "10.0.0.7:5555"); c == nil {
		t.Fatal("a proof for another address was taken (a relay's offer)")
	}
	o = offer()
	o.key[0] ^= 1
	if c, _ := try(o, "127.0.0.1:5555"); c == nil {
		t.Fatal("an answer without the key was taken")
	}
	o = offer()
	if n := len(l.tickets); n != 1 {
		t.Fatalf("%d tickets for one connection", n)
	}
	l.mu.Lock()
	l.removeLocked(tcpConn)
	l.mu.Unlock()
	if c, s := try(o, "127.0.0.1:5555"); c == nil || s == nil {
		t.Fatalf("a ticket outlived its connection: %v, %v", c, s)
	}
}

// fakeAddrConn is a connection that only has a local address.
type fakeAddrConn struct {
	net.Conn
	local net.Addr
}

func (f fakeAddrConn) LocalAddr() net.Addr { return f.local }

// An offer names only a socket of our own form: a hostile producer cannot
// point a consumer at another service's socket.
func TestSameHostOfferParse(t *testing.T) {
	good := localOffer{name: localPrefix + strings.Repeat("ab", localNameHex/2)}
	cmd := good.encode()
	_, body, ok := parseCommand(cmd[2:])
	if !ok {
		t.Fatal("offer command does not parse")
	}
	if o, ok := parseLocalOffer(body); !ok || o != good {
		t.Fatalf("round trip: %+v %v", o, ok)
	}
	for _, name := range []string{"@/tmp/.X11-unix/X0", localPrefix + strings.Repeat("zz", localNameHex/2), "/run/dbus/system_bus_socket"} {
		bad := good
		bad.name = name
		_, body, _ := parseCommand(bad.encode()[2:])
		if _, ok := parseLocalOffer(body); ok {
			t.Errorf("offer naming %q taken", name)
		}
	}
	if _, ok := parseLocalOffer(body[:len(body)-1]); ok {
		t.Error("a short offer taken")
	}
}

// A flood of hellos with made-up tickets on the same-host socket is
// refused and counted, and a consumer still moves to it.
func TestSameHostHostileHellos(t *testing.T) {
	s := newServer(t, ServerConfig{})
	gl := s.listener()
	if gl == nil || gl.local == nil {
		t.Fatal("no same-host socket")
	}
	for range 50 {
		c, err := net.Dial("unix", gl.localName)
		if err != nil {
			t.Fatal(err)
		}
		c.Write(append([]byte(localMagic), make([]byte, localTicketLen+localChalLen)...))
		expectClosed(t, c, 5*time.Second)
		c.Close()
	}
	until(t, "hellos refused", func() bool { return s.Stats().SameHostFailed == 50 })
	stop := make(chan struct{})
	defer close(stop)
	echo(t, s, stop)
	c := newClient(t, ClientConfig{})
	for range 3 {
		c.Send(s.Endpoint(), []byte("x"))
		waitInbound(t, c, 1, 10*time.Second)
		until(t, "proven", func() bool { return c.Stats().SameHost == 1 })
	}
}

// listener is the server's guard listener.
func (s *Server) listener() *guardListener { return s.gcfg.listener }

// Connect to a Go producer on this host returns with the move ready: the
// first request goes over the same-host socket. To a libzmq producer,
// which never offers, it returns about a handshake's time later, at most.
func TestConnectAwaitsTheMove(t *testing.T) {
	h := &held{s: newServer(t, ServerConfig{})}
	c := newClient(t, ClientConfig{})
	ep := h.s.Endpoint()
	if err := c.Connect(t.Context(), ep); err != nil {
		t.Fatal(err)
	}
	if st := c.Stats(); st.SameHost != 1 {
		t.Fatalf("Connect returned before the move was ready: %+v", st)
	}
	c.Send(ep, []byte("a"))
	if m := h.take(t, 1); networkOf(t, h.s, m[0].Identity) != "unix" {
		t.Fatal("the first request after Connect went over TCP")
	}
}
