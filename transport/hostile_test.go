package transport

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"os"
	"runtime"
	"testing"
	"time"

	"github.com/ecxfer/ecxfer/xfer"
)

// readyCommand is a DEALER's READY command frame.
func readyCommand() []byte {
	var body []byte
	body = append(body, 5)
	body = append(body, "READY"...)
	body = append(body, 11)
	body = append(body, "Socket-Type"...)
	body = binary.BigEndian.AppendUint32(body, 6)
	body = append(body, "DEALER"...)
	return append([]byte{flagCommand, byte(len(body))}, body...)
}

// rawHandshake connects to addr and completes the ZMTP handshake as a
// DEALER, byte by byte, so the test can then misbehave.
func rawHandshake(t testing.TB, addr string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	c.SetDeadline(time.Now().Add(5 * time.Second))
	c.Write(zmtpGreeting)
	var g [greetingLen]byte
	if _, err := io.ReadFull(c, g[:]); err != nil {
		t.Fatalf("greeting: %v", err)
	}
	c.Write(readyCommand())
	var hdr [2]byte
	if _, err := io.ReadFull(c, hdr[:]); err != nil {
		t.Fatalf("READY: %v", err)
	}
	if _, err := io.ReadFull(c, make([]byte, hdr[1])); err != nil {
		t.Fatalf("READY body: %v", err)
	}
	c.SetDeadline(time.Time{})
	return c
}

// expectClosed waits for the server to close c.
func expectClosed(t testing.TB, c net.Conn, within time.Duration) {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(within))
	for {
		_, err := c.Read(make([]byte, 256))
		if err == nil {
			continue // PINGs and the like
		}
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			t.Fatalf("connection still open after %v", within)
		}
		return
	}
}

// served checks that a real client still gets a reply, within limit.
func served(t testing.TB, s *Server, limit time.Duration) time.Duration {
	t.Helper()
	c := newClient(t, ClientConfig{})
	start := time.Now()
	c.Send(s.Endpoint(), []byte("ping"))
	waitInbound(t, c, 1, limit)
	c.Close()
	return time.Since(start)
}

func heapInUse() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapInuse
}

func TestHostileFrameSizes(t *testing.T) {
	s := newServer(t, ServerConfig{})
	stop := make(chan struct{})
	defer close(stop)
	echo(t, s, stop)
	addr := s.Addr().String()
	before := heapInUse()
	long := func(flags byte, size uint64) []byte {
		return binary.BigEndian.AppendUint64([]byte{flags | flagLong}, size)
	}
	for _, size := range []uint64{1 << 40, 1 << 62} {
		// Before the handshake: a command frame in place of READY.
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		c.Write(zmtpGreeting)
		c.Write(long(flagCommand, size))
		expectClosed(t, c, 5*time.Second)
		c.Close()
		// After the handshake: a data frame.
		c = rawHandshake(t, addr)
		c.Write(long(0, size))
		expectClosed(t, c, 5*time.Second)
		c.Close()
		// Just over the 64 KiB cap.
		c = rawHandshake(t, addr)
		c.Write(long(0, 64<<10+1))
		expectClosed(t, c, 5*time.Second)
		c.Close()
	}
	if grew := int64(heapInUse()) - int64(before); grew > 16<<20 {
		t.Fatalf("heap grew by %d bytes", grew)
	}
	served(t, s, 5*time.Second)
}

func TestHostileGarbageGreeting(t *testing.T) {
	s := newServer(t, ServerConfig{})
	c, err := net.Dial("tcp", s.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.Write([]byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n" + string(make([]byte, 64))))
	start := time.Now()
	expectClosed(t, c, 5*time.Second)
	if d := time.Since(start); d > time.Second {
		t.Fatalf("closed only after %v", d)
	}
}

// 2,000 connections that never handshake: a real client is still served
// within 100 ms (or three times what it takes without them, on a machine
// too loaded for that).
func TestHostileSilentConnections(t *testing.T) {
	s := newServer(t, ServerConfig{})
	stop := make(chan struct{})
	defer close(stop)
	echo(t, s, stop)
	// What serving one client costs here without the flood: on a loaded
	// machine under the race detector it can itself pass 100 ms.
	var base time.Duration
	for range 3 {
		base = max(base, served(t, s, 5*time.Second))
	}
	limit := max(100*time.Millisecond, 3*base)
	want := s.Stats().Accepted + 2000
	var idle []net.Conn
	defer func() {
		for _, c := range idle {
			c.Close()
		}
	}()
	for range 2000 {
		c, err := net.Dial("tcp", s.Addr().String())
		if err != nil {
			t.Fatalf("after %d connections: %v", len(idle), err)
		}
		idle = append(idle, c)
	}
	// Wait until the listener has taken them all.
	for end := time.Now().Add(10 * time.Second); s.Stats().Accepted < want; time.Sleep(time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("listener took only %d connections", s.Stats().Accepted)
		}
	}
	d := served(t, s, 5*time.Second)
	t.Logf("served in %v behind 2,000 silent connections (%v without)", d, base)
	if d > limit {
		t.Fatalf("served after %v (limit %v; %v without the flood)", d, limit, base)
	}
}

func openFDs(t testing.TB) int {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skip("no /proc/self/fd")
	}
	return len(ents)
}

// 2,000 connect/close cycles (10,000 with ECXFER_LONG=1), raw and with full
// handshakes: descriptors and goroutines come back to the baseline.
func TestHostileConnectChurn(t *testing.T) {
	cycles := 2000
	if os.Getenv("ECXFER_LONG") == "1" {
		cycles = 10000
	}
	s := newServer(t, ServerConfig{})
	addr := s.Addr().String()
	fds0, gr0 := openFDs(t), runtime.NumGoroutine()
	deadline := time.Now().Add(60 * time.Second)
	for i := 0; i < cycles && time.Now().Before(deadline); i++ {
		if i%2 == 0 {
			c, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			c.Close()
		} else {
			rawHandshake(t, addr).Close()
		}
	}
	var fds, gr int
	for end := time.Now().Add(10 * time.Second); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		fds, gr = openFDs(t), runtime.NumGoroutine()
		if fds <= fds0+5 && gr <= gr0+5 {
			return
		}
	}
	t.Fatalf("after churn: %d fds (baseline %d), %d goroutines (baseline %d)", fds, fds0, gr, gr0)
}

// A consumer that sends requests but never reads delays no reply to
// others (each connection has its own writer), and loses its connection
// after the write deadline.
func TestHostileStalledConsumer(t *testing.T) {
	if testing.Short() {
		t.Skip("waits out a write deadline: 10 s")
	}
	t.Parallel() // mostly waits: beside the other waiting tests
	const deadline = 4 * time.Second
	s := newServer(t, ServerConfig{WriteTimeout: deadline})
	stop := make(chan struct{})
	// Large replies fill the stalled consumer's socket buffers quickly.
	big := make([]byte, 60<<10)
	done := serve(s, stop, func(p []byte) []byte {
		if string(p) == "stall" {
			return big
		}
		return append([]byte("re:"), p...)
	})
	staller := rawHandshake(t, s.Addr().String())
	defer staller.Close()
	msg := []byte{flagMore, 0, 0, 5}
	msg = append(msg, "stall"...)
	for range 200 {
		staller.Write(msg)
	}
	c := newClient(t, ClientConfig{})
	var worst time.Duration
	start := time.Now()
	for range 20 {
		start := time.Now()
		c.Send(s.Endpoint(), []byte("x"))
		waitInbound(t, c, 1, 5*time.Second)
		worst = max(worst, time.Since(start))
	}
	// Before, the replies queued behind the stalled writes until the
	// deadline cut the consumer off; what is left is serving its 200
	// large replies (slow under -race).
	if time.Since(start) > deadline/2 {
		t.Fatalf("replies took %v (worst %v) behind the stalled consumer", time.Since(start), worst)
	}
	expectClosed(t, staller, 3*deadline)
	close(stop)
	<-done
}

// readyWithIdentity is a DEALER's READY presenting a routing identity.
func readyWithIdentity(id string) []byte {
	body := readyCommand()[2:]
	body = append(body, 8)
	body = append(body, "Identity"...)
	body = binary.BigEndian.AppendUint32(body, uint32(len(id)))
	body = append(body, id...)
	return append([]byte{flagCommand, byte(len(body))}, body...)
}

// A second connection presenting an identity in use takes it over (as
// libzmq's ROUTER_HANDOVER): replies go to it, the first is closed. A
// reply to an identity no connection holds fails with xfer.ErrPeerDown.
func TestIdentityHandover(t *testing.T) {
	s := newServer(t, ServerConfig{})
	dial := func() net.Conn {
		c, err := net.Dial("tcp", s.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		c.SetDeadline(time.Now().Add(5 * time.Second))
		c.Write(zmtpGreeting)
		io.ReadFull(c, make([]byte, greetingLen))
		c.Write(readyWithIdentity("consumer-1"))
		var hdr [2]byte
		if _, err := io.ReadFull(c, hdr[:]); err != nil {
			t.Fatal(err)
		}
		io.ReadFull(c, make([]byte, hdr[1]))
		// One request, so that the server has surely registered it.
		c.Write([]byte{flagMore, 0, 0, 2, 'h', 'i'})
		return c
	}
	first := dial()
	defer first.Close()
	var msgs []xfer.Message
	waitMsg := func() xfer.Message {
		for end := time.Now().Add(5 * time.Second); time.Now().Before(end); time.Sleep(time.Millisecond) {
			if msgs = s.Drain(msgs[:0]); len(msgs) > 0 {
				return msgs[0]
			}
		}
		t.Fatal("no request")
		return xfer.Message{}
	}
	if m := waitMsg(); string(m.Identity) != "consumer-1" {
		t.Fatalf("identity %q", m.Identity)
	}
	second := dial()
	defer second.Close()
	m := waitMsg()
	if err := s.Reply(m.Identity, []byte("yours")); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 4+5)
	if _, err := io.ReadFull(second, got); err != nil || string(got[4:]) != "yours" {
		t.Fatalf("second got %q, %v", got, err)
	}
	expectClosed(t, first, 5*time.Second)
	second.Close()
	for end := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		err := s.Reply([]byte("consumer-1"), []byte("late"))
		if errors.Is(err, xfer.ErrPeerDown) {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("reply to a closed consumer: %v", err)
		}
	}
	if err := s.Reply([]byte("nobody"), []byte("x")); !errors.Is(err, xfer.ErrPeerDown) {
		t.Fatalf("reply to an unknown identity: %v", err)
	}
}

// A hostile producer declaring a 2^62-byte frame to our client: that
// connection closes and the producer is reported dead; the process lives.
func TestHostileServerToClient(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := acceptAsRouter(ln)
		if err != nil {
			return
		}
		defer c.Close()
		var hdr [2]byte
		io.ReadFull(c, hdr[:])
		io.ReadFull(c, make([]byte, hdr[1]))
		c.Write(binary.BigEndian.AppendUint64([]byte{flagLong}, 1<<62))
		io.Copy(io.Discard, c)
	}()
	c := newClient(t, ClientConfig{})
	ep := "tcp://" + ln.Addr().String()
	c.Send(ep, []byte("x"))
	if a, _ := waitDead(t, c, 5*time.Second); a != ep {
		t.Fatalf("dead %q", a)
	}
	if st := c.Stats(); st.Dropped == 0 {
		t.Fatalf("the guard did not count the drop: %+v", st)
	}
}

// acceptAsRouter accepts a client's connection and greets it as a ROUTER
// would, byte by byte, so the test can then misbehave: the greeting, the
// client's greeting read, READY.
func acceptAsRouter(ln net.Listener) (net.Conn, error) {
	c, err := ln.Accept()
	if err != nil {
		return nil, err
	}
	c.Write(zmtpGreeting)
	io.ReadFull(c, make([]byte, greetingLen))
	ready := readyCommand()
	copy(ready[len(ready)-6:], "ROUTER")
	c.Write(ready)
	return c, nil
}

// READY metadata that would make zmq4 index past its end (it panics on
// these) closes the connection, before and after our own handshake.
func TestHostileReadyMetadata(t *testing.T) {
	s := newServer(t, ServerConfig{})
	stop := make(chan struct{})
	defer close(stop)
	echo(t, s, stop)
	for _, md := range [][]byte{
		{0x01},                          // a name length and nothing else
		{0x0b, 'S', 'o', 'c', 'k'},      // a name cut short
		[]byte("\x01X\x00\x00"),         // a value length cut short
		[]byte("\x01X\xff\xff\xff\xff"), // a value longer than the rest
	} {
		body := append([]byte("\x05READY"), md...)
		c, err := net.Dial("tcp", s.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		c.Write(zmtpGreeting)
		c.Write(append([]byte{flagCommand, byte(len(body))}, body...))
		expectClosed(t, c, 5*time.Second)
		c.Close()
	}
	served(t, s, 5*time.Second)
	if !validMetadata(readyCommand()[8:]) {
		t.Fatal("a DEALER's READY refused")
	}
}

// A write deadline left by the writer (replies that had to wait for a
// slow reader) must not fail a later reply written at once: the
// connection survives an idle period longer than the write timeout.
func TestReplyAfterWriterDeadline(t *testing.T) {
	const timeout = 200 * time.Millisecond
	s := newServer(t, ServerConfig{WriteTimeout: timeout})
	stop := make(chan struct{})
	big := make([]byte, 60<<10)
	done := serve(s, stop, func(p []byte) []byte {
		if string(p) == "big" {
			return big
		}
		return append([]byte("re:"), p...)
	})
	defer func() { close(stop); <-done }()
	c := rawHandshake(t, s.Addr().String())
	defer c.Close()
	c.(*net.TCPConn).SetReadBuffer(64 << 10) // no autotuning: the replies back up
	req := func(p string) {
		c.Write(append([]byte{flagMore, 0, 0, byte(len(p))}, p...))
	}
	// Enough large replies that some wait for the writer; read them all
	// (within the write timeout) as they come.
	const n = 256 // 15 MiB: more than the socket buffers hold
	for range n {
		req("big")
	}
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	for i := range n {
		var hdr [2 + 9]byte
		if _, err := io.ReadFull(c, hdr[:2]); err != nil {
			t.Fatalf("reply %d: %v", i, err)
		}
		if _, err := io.ReadFull(c, hdr[2:11]); err != nil {
			t.Fatalf("reply %d: %v", i, err)
		}
		if _, err := io.ReadFull(c, make([]byte, binary.BigEndian.Uint64(hdr[3:11]))); err != nil {
			t.Fatalf("reply %d: %v", i, err)
		}
	}
	time.Sleep(2 * timeout) // idle past the writer's last deadline: the condition itself
	req("x")
	got := make([]byte, 2+2+len("re:x"))
	if _, err := io.ReadFull(c, got); err != nil || string(got[4:]) != "re:x" {
		t.Fatalf("reply after idle: %q, %v", got, err)
	}
}

// readyProps is a READY of the given properties, name and value in turn.
func readyProps(kv ...string) []byte {
	body := append([]byte{5}, "READY"...)
	for i := 0; i+1 < len(kv); i += 2 {
		body = append(body, byte(len(kv[i])))
		body = append(body, kv[i]...)
		body = binary.BigEndian.AppendUint32(body, uint32(len(kv[i+1])))
		body = append(body, kv[i+1]...)
	}
	return append([]byte{flagCommand, byte(len(body))}, body...)
}

// zmq4 panics on a peer's socket type it does not know, or on none, and
// reads the type only under the name as it title-cases it: a READY whose
// Socket-Type zmq4 would not see, or would not know, closes the
// connection, on either side, and the process lives on.
func TestPeerSocketTypeChecked(t *testing.T) {
	bad := map[string][]byte{
		"none":           readyProps("Identity", "x"),
		"unknown type":   readyProps("Socket-Type", "NULL"),
		"lower case":     readyProps("Socket-Type", "dealer"),
		"upper name":     readyProps("SOCKET-TYPE", "DEALER"),
		"name with nul":  readyProps("Socket\x00Type", "DEALER"),
		"long s":         readyProps("ſocket-Type", "DEALER"),
		"a second, bad":  readyProps("Socket-Type", "DEALER", "socket-type", "PUB"),
		"empty":          readyProps("Socket-Type", ""),
		"incompatible":   readyProps("Socket-Type", "PUB"),
		"producer's REP": readyProps("Socket-Type", "REP"),
	}
	s := newServer(t, ServerConfig{})
	for name, ready := range bad {
		t.Run("server/"+name, func(t *testing.T) {
			c, err := net.Dial("tcp", s.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(5 * time.Second))
			c.Write(zmtpGreeting)
			io.ReadFull(c, make([]byte, greetingLen))
			c.Write(ready)
			expectClosed(t, c, 5*time.Second)
		})
	}
	// The same READYs from a producer (REP stands for REQ there).
	bad["consumer's REQ"] = readyProps("Socket-Type", "REQ")
	delete(bad, "producer's REP")
	for name, ready := range bad {
		t.Run("client/"+name, func(t *testing.T) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			go func() {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				defer c.Close()
				c.SetDeadline(time.Now().Add(5 * time.Second))
				c.Write(zmtpGreeting)
				io.ReadFull(c, make([]byte, greetingLen))
				c.Write(ready)
				io.Copy(io.Discard, c)
			}()
			cl := newClient(t, ClientConfig{HandshakeTimeout: 2 * time.Second})
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if err := cl.Connect(ctx, "tcp://"+ln.Addr().String()); err == nil {
				t.Fatal("connected to a producer whose socket type zmq4 cannot take")
			}
		})
	}
	// And an honest consumer is still served.
	stop := make(chan struct{})
	defer close(stop)
	echo(t, s, stop)
	c := newClient(t, ClientConfig{})
	c.Send(s.Endpoint(), []byte("x"))
	waitInbound(t, c, 1, 5*time.Second)
}
