package transport

import (
	"bytes"
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"go.uber.org/goleak"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"
)

// A TCP reply waiting for room (the replies before it not drained) is not
// answered yet: the next send stays on TCP, and closing TCP on a move
// never drops a reply read off it.
func TestSameHostMoveWaitsForRepliesWaitingForRoom(t *testing.T) {
	h := &held{s: newServer(t, ServerConfig{})}
	c := newClient(t, ClientConfig{MaxFrame: 1000})
	ep := h.s.Endpoint()
	pad := strings.Repeat("x", 600)
	c.Send(ep, []byte("a"))
	c.Send(ep, []byte("b"))
	ab := h.take(t, 2)
	if networkOf(t, h.s, ab[0].Identity) != "tcp" {
		t.Skip("the move was ready before the first request was sent: nothing to show")
	}
	until(t, "proven", func() bool { return c.Stats().SameHost == 1 })
	// Two replies of 600 bytes: the second waits for room (MaxFrame 1000).
	for _, m := range ab {
		h.s.Reply(m.Identity, append([]byte("re:"+string(m.Payload)+":"), pad...))
	}
	until(t, "b waiting in admit", func() bool { return c.stats.throttled.Load() > 0 })
	c.Send(ep, []byte("c")) // b is read, not answered: stays on TCP
	m := h.take(t, 1)
	if n := networkOf(t, h.s, m[0].Identity); n != "tcp" {
		t.Fatalf("c went over %s with b waiting for room", n)
	}
	h.answer(t, m)
	var got []string
	for end := time.Now().Add(3 * time.Second); time.Now().Before(end) && len(got) < 3; time.Sleep(time.Millisecond) {
		for _, r := range c.Drain(nil) {
			p := r.Payload
			if i := bytes.IndexByte(p[3:], ':'); i >= 0 {
				p = p[:3+i]
			}
			got = append(got, string(p))
		}
	}
	if fmt.Sprint(got) != "[re:a re:b re:c]" {
		t.Fatalf("replies %v, want [re:a re:b re:c]; dead: %v", got, c.Dead(nil))
	}
}

// hostileProducer is a hostile (or scripted) Go-looking producer: it speaks
// ZMTP as a ROUTER on TCP, echoes requests, and answers ECXFER-LOCAL with
// offer(), its own offer by default (name of its own abstract socket).
type hostileProducer struct {
	ln    net.Listener // TCP
	uln   net.Listener // same-host socket
	offer localOffer
	// onLocal runs per accepted same-host connection.
	onLocal func(c net.Conn, p *hostileProducer)
	mu      sync.Mutex
	conns   []net.Conn
}

func newHostileProducer(t *testing.T, onLocal func(net.Conn, *hostileProducer)) *hostileProducer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	uln, err := listenLocal()
	if err != nil {
		t.Fatal(err)
	}
	p := &hostileProducer{ln: ln, uln: uln, onLocal: onLocal}
	p.offer.name = uln.Addr().String()
	rand.Read(p.offer.ticket[:])
	rand.Read(p.offer.key[:])
	go p.acceptTCP()
	go func() {
		for {
			c, err := uln.Accept()
			if err != nil {
				return
			}
			p.track(c)
			go p.onLocal(c, p)
		}
	}()
	t.Cleanup(p.close)
	return p
}

func (p *hostileProducer) ep() string { return "tcp://" + p.ln.Addr().String() }

func (p *hostileProducer) track(c net.Conn) {
	p.mu.Lock()
	p.conns = append(p.conns, c)
	p.mu.Unlock()
}

func (p *hostileProducer) close() {
	p.ln.Close()
	p.uln.Close()
	p.mu.Lock()
	for _, c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
}

func (p *hostileProducer) acceptTCP() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.track(c)
		go p.serveZMTP(c, true)
	}
}

// routerHandshake does the server side of a ZMTP handshake on c.
func routerHandshake(c net.Conn) error {
	c.Write(zmtpGreeting)
	if _, err := io.ReadFull(c, make([]byte, greetingLen)); err != nil {
		return err
	}
	ready := readyCommand()
	copy(ready[len(ready)-6:], "ROUTER")
	c.Write(ready)
	_, _, err := readFrame(c)
	return err
}

func readFrame(c net.Conn) (flags byte, body []byte, err error) {
	var hdr [9]byte
	if _, err = io.ReadFull(c, hdr[:2]); err != nil {
		return
	}
	flags = hdr[0]
	size := uint64(hdr[1])
	if flags&flagLong != 0 {
		if _, err = io.ReadFull(c, hdr[2:9]); err != nil {
			return
		}
		size = binary.BigEndian.Uint64(hdr[1:9])
	}
	body = make([]byte, size)
	_, err = io.ReadFull(c, body)
	return
}

// serveZMTP echoes ["", p] with ["", "re:"+p], answers PINGs, and the
// same-host query with p.offer (on TCP only).
func (p *hostileProducer) serveZMTP(c net.Conn, tcp bool) {
	defer c.Close()
	if routerHandshake(c) != nil {
		return
	}
	var wmu sync.Mutex
	write := func(b []byte) { wmu.Lock(); c.Write(b); wmu.Unlock() }
	var msg [][]byte
	for {
		flags, body, err := readFrame(c)
		if err != nil {
			return
		}
		if flags&flagCommand != 0 {
			name, _, _ := parseCommand(body)
			switch {
			case name == "PING":
				write(appendCommand(nil, "PONG", nil))
			case name == localCmd && tcp:
				write(p.offer.encode())
			}
			continue
		}
		msg = append(msg, body)
		if flags&flagMore != 0 {
			continue
		}
		if len(msg) == 2 {
			r := append([]byte("re:"), msg[1]...)
			write(append([]byte{flagMore, 0, 0, byte(len(r))}, r...))
		}
		msg = nil
	}
}

// prove answers the hello as the key's holder, then serves ZMTP.
func (p *hostileProducer) prove(c net.Conn) bool {
	var hello [len(localMagic) + localTicketLen + localChalLen]byte
	if _, err := io.ReadFull(c, hello[:]); err != nil {
		return false
	}
	_, err := c.Write(localMAC(p.offer.key[:], hello[len(localMagic)+localTicketLen:], p.ln.Addr().String()))
	return err == nil
}

// A producer (hostile, or only stalled) whose same-host socket takes the
// hello and never answers holds no Remove or Close: they end the proof.
func TestSameHostStalledProofEndsWithClose(t *testing.T) {
	held := make(chan struct{})
	p := newHostileProducer(t, func(c net.Conn, p *hostileProducer) {
		io.ReadFull(c, make([]byte, len(localMagic)+localTicketLen+localChalLen))
		close(held)
		io.Copy(io.Discard, c)
	})
	c := NewClient(ClientConfig{Logger: quiet, HandshakeTimeout: 4 * time.Second})
	c.Send(p.ep(), []byte("a"))
	waitInbound(t, c, 1, 5*time.Second)
	<-held
	start := time.Now()
	c.Remove(p.ep())
	c.Close()
	if d := time.Since(start); d > time.Second {
		t.Fatalf("Close took %v: it waited out the same-host proof (HandshakeTimeout)", d.Round(time.Millisecond))
	}
}

// Close (and Remove) at every point of the upgrade, against a real
// server: no goroutine is left after Close, no death is reported for a
// deliberate close, and a producer death racing the move is reported once.
func TestSameHostCloseAtAnyPointLeavesNothing(t *testing.T) {
	base := goroutines()
	baseOpt = goleak.IgnoreCurrent()
	for i := range 30 {
		s, err := Listen("tcp://127.0.0.1:0", ServerConfig{Logger: quiet})
		if err != nil {
			t.Fatal(err)
		}
		stop := make(chan struct{})
		served := echo(t, s, stop)
		c := NewClient(ClientConfig{Logger: quiet})
		c.Send(s.Endpoint(), []byte("a"))
		waitInbound(t, c, 1, 5*time.Second)
		time.Sleep(time.Duration(i*20) * time.Microsecond)
		switch i % 3 {
		case 0:
			c.Remove(s.Endpoint())
		case 1:
			c.Send(s.Endpoint(), []byte("b"))
		case 2: // the producer dies around the move
			close(stop)
			<-served
			go s.Close()
			c.Send(s.Endpoint(), []byte("b"))
		}
		if i%3 == 2 {
			until(t, "death", func() bool {
				d := c.Dead(nil)
				if len(d) > 1 {
					t.Errorf("%d deaths", len(d))
				}
				return len(d) == 1
			})
			time.Sleep(20 * time.Millisecond)
			if d := c.Dead(nil); len(d) != 0 {
				t.Errorf("second death %v", d)
			}
		} else if d := c.Dead(nil); len(d) != 0 {
			t.Errorf("try %d: death for a deliberate close: %v", i, d)
		}
		c.Close()
		if i%3 != 2 {
			close(stop)
			<-served
		}
		s.Close()
	}
	leftover(t, base)
}

// The rule against a dead end: a send never moves onto a same-host
// connection already closed (its end not yet told): it stays on TCP, and
// the producer is not declared dead.
func TestSameHostNeverMovesOntoAClosedConnection(t *testing.T) {
	h := &held{s: newServer(t, ServerConfig{})}
	c := newClient(t, ClientConfig{})
	ep := h.s.Endpoint()
	c.Send(ep, []byte("a"))
	a := h.take(t, 1)
	if networkOf(t, h.s, a[0].Identity) != "tcp" {
		t.Skip("the move was ready before the first request was sent: nothing to show")
	}
	h.answer(t, a)
	waitInbound(t, c, 1, 10*time.Second)
	until(t, "proven", func() bool { return c.Stats().SameHost == 1 })
	c.mu.Lock()
	d := c.peers[ep]
	c.mu.Unlock()
	closed := &guardConn{done: make(chan struct{})}
	close(closed.done)
	d.qmu.Lock()
	live := d.local
	d.local = closed
	d.qmu.Unlock()
	c.Send(ep, []byte("b"))
	m := h.take(t, 1)
	if n := networkOf(t, h.s, m[0].Identity); n != "tcp" {
		t.Fatalf("b went over %s", n)
	}
	h.answer(t, m)
	waitInbound(t, c, 1, 10*time.Second)
	if d := c.Dead(nil); len(d) != 0 {
		t.Fatalf("dead: %v", d)
	}
	d.qmu.Lock()
	d.local = live
	d.qmu.Unlock()
	c.Send(ep, []byte("c"))
	if m := h.take(t, 1); networkOf(t, h.s, m[0].Identity) != "unix" {
		t.Fatal("c stayed on TCP with a live same-host connection")
	}
}
