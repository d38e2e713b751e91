package transport

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/ecxfer/ecxfer/xfer"
)

// echo answers every request with "re:" + payload until stop is closed.
func echo(t testing.TB, s *Server, stop chan struct{}) chan struct{} {
	return serve(s, stop, func(p []byte) []byte { return append([]byte("re:"), p...) })
}

// serve answers every request with reply(payload) until stop is closed; the
// returned channel closes when it has stopped.
func serve(s *Server, stop chan struct{}, reply func([]byte) []byte) chan struct{} {
	done := make(chan struct{})
	go func() {
		defer close(done)
		var msgs []xfer.Message
		for {
			select {
			case <-stop:
				return
			default:
			}
			msgs = s.Drain(msgs[:0])
			for _, m := range msgs {
				s.Reply(m.Identity, reply(m.Payload))
			}
			if len(msgs) == 0 {
				time.Sleep(50 * time.Microsecond)
			}
		}
	}()
	return done
}

func newServer(t testing.TB, cfg ServerConfig) *Server {
	t.Helper()
	cfg.Logger = quiet
	s, err := Listen("tcp://127.0.0.1:0", cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func newClient(t testing.TB, cfg ClientConfig) *Client {
	t.Helper()
	cfg.Logger = quiet
	c := NewClient(cfg)
	t.Cleanup(func() { c.Close() })
	return c
}

// waitInbound drains c until n payloads came or the limit passes.
func waitInbound(t testing.TB, c *Client, n int, limit time.Duration) []xfer.Inbound {
	t.Helper()
	var got []xfer.Inbound
	for end := time.Now().Add(limit); len(got) < n; time.Sleep(100 * time.Microsecond) {
		got = c.Drain(got)
		if time.Now().After(end) {
			t.Fatalf("%d of %d replies after %v", len(got), n, limit)
		}
	}
	return got
}

func waitDead(t testing.TB, c *Client, limit time.Duration) (string, time.Duration) {
	t.Helper()
	start := time.Now()
	for end := start.Add(limit); time.Now().Before(end); time.Sleep(time.Millisecond) {
		if d := c.Dead(nil); len(d) > 0 {
			return d[0].Addr, time.Since(start)
		}
	}
	t.Fatalf("no peer reported dead within %v", limit)
	return "", 0
}

func TestControlRoundTrip(t *testing.T) {
	s := newServer(t, ServerConfig{})
	stop := make(chan struct{})
	defer func() { close(stop) }()
	echo(t, s, stop)
	c := newClient(t, ClientConfig{})
	for i := range 100 {
		if err := c.Send(s.Endpoint(), fmt.Appendf(nil, "m%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	got := waitInbound(t, c, 100, 10*time.Second)
	for i, m := range got {
		if m.Addr != s.Endpoint() || string(m.Payload) != fmt.Sprintf("re:m%d", i) {
			t.Fatalf("reply %d: %+v", i, m)
		}
	}
	// A reply is counted once written: the last may arrive first.
	poll(t, 10*time.Second, "the 100th reply counted", func() bool { return s.Stats().Sent == 100 })
	if st := s.Stats(); st.Received != 100 || st.Sent != 100 || st.Malformed != 0 {
		t.Fatalf("server stats %+v", st)
	}
}

func TestClientAllowList(t *testing.T) {
	c := newClient(t, ClientConfig{Allow: func(hp string) bool { return hp == "127.0.0.1:1" }})
	if err := c.Send("tcp://10.1.2.3:5555", []byte("x")); !errors.Is(err, xfer.ErrNotAllowed) {
		t.Fatalf("disallowed address: %v", err)
	}
	if err := c.Send("not an address", []byte("x")); err == nil {
		t.Fatal("bad address accepted")
	}
}

// Nothing listens: the connect fails and the peer is reported dead; the
// next send builds a new DEALER.
func TestClientUnreachable(t *testing.T) {
	c := newClient(t, ClientConfig{ConnectTimeout: 500 * time.Millisecond})
	addr := "tcp://127.0.0.1:1"
	if err := c.Send(addr, []byte("x")); err != nil {
		t.Fatal(err)
	}
	if a, _ := waitDead(t, c, 5*time.Second); a != addr {
		t.Fatalf("dead %q", a)
	}
	if err := c.Send(addr, []byte("x")); err != nil {
		t.Fatalf("send after the report: %v", err)
	}
	waitDead(t, c, 5*time.Second)
}

func TestServerRestart(t *testing.T) {
	s := newServer(t, ServerConfig{})
	stop := make(chan struct{})
	echo(t, s, stop)
	c := newClient(t, ClientConfig{})
	ep := s.Endpoint()
	c.Send(ep, []byte("a"))
	waitInbound(t, c, 1, 5*time.Second)
	close(stop)
	s.Close()
	if a, d := waitDead(t, c, 5*time.Second); a != ep || d > time.Second {
		t.Fatalf("dead %q after %v", a, d)
	}
	s2, err := Listen(ep, ServerConfig{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	stop2 := make(chan struct{})
	defer close(stop2)
	echo(t, s2, stop2)
	if err := c.Send(ep, []byte("b")); err != nil {
		t.Fatal(err)
	}
	if got := waitInbound(t, c, 1, 5*time.Second); !bytes.Equal(got[0].Payload, []byte("re:b")) {
		t.Fatalf("%q", got[0].Payload)
	}
}

// A producer address where something accepts but never answers: the
// handshake times out and the producer is reported dead.
func TestClientSilentServer(t *testing.T) {
	ln := silentListener(t)
	c := newClient(t, ClientConfig{HandshakeTimeout: 300 * time.Millisecond})
	ep := "tcp://" + ln.Addr().String()
	c.Send(ep, []byte("x"))
	if a, d := waitDead(t, c, 5*time.Second); a != ep || d > 2*time.Second {
		t.Fatalf("dead %q after %v", a, d)
	}
}

// OnRequest runs where each request arrives: requests it answers are never
// seen by Wait, which wakes only for those it leaves queued (and for Wake).
func TestServerOnRequest(t *testing.T) {
	s := newServer(t, ServerConfig{})
	var mu sync.Mutex
	answer := true
	var msgs []xfer.Message
	s.onRequestHook(func() {
		mu.Lock()
		defer mu.Unlock()
		if !answer {
			return
		}
		msgs = s.Drain(msgs[:0])
		for _, m := range msgs {
			s.Reply(m.Identity, append([]byte("re:"), m.Payload...))
		}
	})
	c := newClient(t, ClientConfig{})
	for i := range 50 {
		if err := c.Send(s.Endpoint(), fmt.Appendf(nil, "m%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	got := waitInbound(t, c, 50, 10*time.Second)
	for i, m := range got {
		if string(m.Payload) != fmt.Sprintf("re:m%d", i) {
			t.Fatalf("reply %d: %q", i, m.Payload)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	if s.Wait(ctx) {
		t.Fatal("Wait woke for requests answered where they arrived")
	}
	cancel()

	mu.Lock()
	answer = false
	mu.Unlock()
	c.Send(s.Endpoint(), []byte("left"))
	if !s.Wait(context.Background()) {
		t.Fatal("Wait did not wake for a request left queued")
	}
	if m := s.Drain(nil); len(m) != 1 || string(m[0].Payload) != "left" {
		t.Fatalf("queued: %v", m)
	}
	s.wake()
	if !s.Wait(context.Background()) {
		t.Fatal("Wake did not wake Wait")
	}
	s.onRequestHook(nil)
	c.Send(s.Endpoint(), []byte("plain"))
	if !s.Wait(context.Background()) || len(s.Drain(nil)) != 1 {
		t.Fatal("without the hook the request was not queued for Wait")
	}
}

// largeReply is reply i of the large-reply tests: 32 KiB + 1 to about
// 1 MiB, its bytes a function of i.
func largeReply(i int) []byte {
	b := make([]byte, 32<<10+1+i*(16<<10))
	for j := range b {
		b[j] = byte(i*7 + j*13)
	}
	return b
}

func serveLarge(t *testing.T, cfg ServerConfig) *Server {
	s := newServer(t, cfg)
	stop := make(chan struct{})
	done := serve(s, stop, func(p []byte) []byte {
		var i int
		fmt.Sscan(string(p), &i)
		return largeReply(i)
	})
	t.Cleanup(func() { close(stop); <-done })
	return s
}

// Large replies, more than the socket buffers hold, arrive whole and in
// order through zmq4 on the far side.
func TestLargeRepliesIntact(t *testing.T) {
	s := serveLarge(t, ServerConfig{})
	c := newClient(t, ClientConfig{})
	const n = 64 // 34 MiB in all
	for i := range n {
		if err := c.Send(s.Endpoint(), fmt.Append(nil, i)); err != nil {
			t.Fatal(err)
		}
	}
	got := waitInbound(t, c, n, 30*time.Second)
	for i, m := range got {
		if want := largeReply(i); !bytes.Equal(m.Payload, want) {
			t.Fatalf("reply %d: %d bytes, want %d, or they differ", i, len(m.Payload), len(want))
		}
	}
}

// The same to a reader that lets them back up: writes are taken in part
// or not at all, the rest waits in the queue, and still every byte
// arrives in order.
func TestLargeRepliesToASlowReader(t *testing.T) {
	s := serveLarge(t, ServerConfig{WriteTimeout: 20 * time.Second, MaxQueuedBytes: 64 << 20})
	c := rawHandshake(t, s.Addr().String())
	defer c.Close()
	c.(*net.TCPConn).SetReadBuffer(64 << 10) // no autotuning: the replies back up
	const n = 48
	for i := range n {
		p := fmt.Append(nil, i)
		c.Write(append([]byte{flagMore, 0, 0, byte(len(p))}, p...))
	}
	for end := time.Now().Add(10 * time.Second); s.Stats().Sent < n; time.Sleep(time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("the server answered %d of %d", s.Stats().Sent, n)
		}
	}
	c.SetReadDeadline(time.Now().Add(20 * time.Second))
	for i := range n {
		var hdr [11]byte
		if _, err := io.ReadFull(c, hdr[:]); err != nil {
			t.Fatalf("reply %d: %v", i, err)
		}
		if hdr[0] != flagMore || hdr[1] != 0 || hdr[2] != flagLong {
			t.Fatalf("reply %d: frame headers % x", i, hdr[:3])
		}
		body := make([]byte, binary.BigEndian.Uint64(hdr[3:]))
		if _, err := io.ReadFull(c, body); err != nil {
			t.Fatalf("reply %d: %v", i, err)
		}
		if !bytes.Equal(body, largeReply(i)) {
			t.Fatalf("reply %d: %d bytes, want %d, or they differ", i, len(body), len(largeReply(i)))
		}
	}
}

// Connect returns once the handshake is done, and the first Send goes out
// on that connection; its failures are Send's.
func TestClientConnect(t *testing.T) {
	s := newServer(t, ServerConfig{NoSameHost: true}) // its connection would count as accepted too
	stop := make(chan struct{})
	defer func() { close(stop) }()
	echo(t, s, stop)
	c := newClient(t, ClientConfig{})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.Connect(ctx, s.Endpoint()); err != nil {
		t.Fatal(err)
	}
	c.mu.Lock()
	d := c.peers[s.Endpoint()]
	c.mu.Unlock()
	d.qmu.Lock()
	up := d.g != nil
	d.qmu.Unlock()
	if !up {
		t.Fatal("Connect returned before the handshake was done")
	}
	if err := c.Connect(ctx, s.Endpoint()); err != nil {
		t.Fatalf("again: %v", err)
	}
	if err := c.Send(s.Endpoint(), []byte("a")); err != nil {
		t.Fatal(err)
	}
	if got := waitInbound(t, c, 1, 10*time.Second); string(got[0].Payload) != "re:a" {
		t.Fatalf("reply %q", got[0].Payload)
	}
	c.mu.Lock()
	same := c.peers[s.Endpoint()] == d
	c.mu.Unlock()
	if !same || s.Stats().Accepted != 1 {
		t.Fatalf("Send made a connection of its own (same dealer %v, %d accepted)", same, s.Stats().Accepted)
	}

	// Nothing listens: xfer.ErrPeerDown, and Dead reports it as for Send.
	c2 := newClient(t, ClientConfig{ConnectTimeout: 500 * time.Millisecond})
	if err := c2.Connect(ctx, "tcp://127.0.0.1:1"); !errors.Is(err, xfer.ErrPeerDown) {
		t.Fatalf("unreachable: %v", err)
	}
	if a, _ := waitDead(t, c2, 5*time.Second); a != "tcp://127.0.0.1:1" {
		t.Fatalf("dead %q", a)
	}
	if err := c2.Connect(ctx, "not an address"); err == nil {
		t.Fatal("bad address accepted")
	}
	c3 := newClient(t, ClientConfig{Allow: func(string) bool { return false }})
	if err := c3.Connect(ctx, s.Endpoint()); !errors.Is(err, xfer.ErrNotAllowed) {
		t.Fatalf("disallowed: %v", err)
	}
	c3.Close()
	if err := c3.Connect(ctx, s.Endpoint()); !errors.Is(err, xfer.ErrClosed) {
		t.Fatalf("closed client: %v", err)
	}
}

// A handshake that never finishes: Connect ends with ctx, and a Close
// meanwhile ends it with xfer.ErrClosed.
func TestClientConnectWaits(t *testing.T) {
	ln := silentListener(t)
	ep := "tcp://" + ln.Addr().String()
	c := newClient(t, ClientConfig{HandshakeTimeout: time.Minute})
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := c.Connect(ctx, ep); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("ctx ended: %v", err)
	}
	done := make(chan error, 1)
	go func() { done <- c.Connect(context.Background(), ep) }()
	select {
	case err := <-done:
		t.Fatalf("Connect returned %v with the handshake unanswered", err)
	case <-time.After(20 * time.Millisecond):
	}
	c.Close() // before or after that Connect took the dealer: xfer.ErrClosed
	select {
	case err := <-done:
		if !errors.Is(err, xfer.ErrClosed) {
			t.Fatalf("closed while connecting: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Connect still waits after Close")
	}
	if d := c.Dead(nil); len(d) != 0 {
		t.Fatalf("a close reported as deaths: %v", d)
	}
}

// A reply that came on a connection whose death Dead reported, or that
// Remove dropped, is never handed out: the Pool would take it for a reply
// on the connection that replaced it.
func TestClientDropsRepliesOfAReplacedConnection(t *testing.T) {
	c := NewClient(ClientConfig{Logger: quiet})
	defer c.Close()
	old := &dealer{c: c, addr: "tcp://127.0.0.1:1"}
	cur := &dealer{c: c, addr: old.addr}
	c.mu.Lock()
	c.peers[old.addr] = cur
	c.mu.Unlock()
	queue := func(d *dealer, p string) {
		c.mu.Lock()
		c.queue = append(c.queue, inbound{xfer.Inbound{Addr: old.addr, Payload: []byte(p)}, d})
		c.mu.Unlock()
	}
	queue(old, "late")
	queue(cur, "now")
	got := c.Drain(nil)
	if len(got) != 1 || string(got[0].Payload) != "now" || c.Stats().Dropped != 1 {
		t.Fatalf("drained %+v, stats %+v", got, c.Stats())
	}
	// Held by Wait, then the connection goes: dropped as well.
	queue(cur, "held")
	if !c.waitOr(context.Background(), nil, nil) {
		t.Fatal("Wait")
	}
	c.mu.Lock()
	delete(c.peers, old.addr)
	c.mu.Unlock()
	if got := c.Drain(nil); len(got) != 0 {
		t.Fatalf("a removed connection's reply handed out: %+v", got)
	}
}
