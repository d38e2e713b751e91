package transport

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"runtime"
	"testing"
	"time"

	"github.com/ecxfer/ecxfer/xfer"
)

// The rule of the server's reply budget, on random operations: the total
// is the sum of what each connection holds and never over its bound after
// a reply is queued; a reply is refused only when its connection has some
// waiting and would go past its own bound (never when it must be taken);
// and the connections cut to make room are, each at its cut, ones holding
// the most.
func TestReplyBudgetRule(t *testing.T) {
	for seed := range uint64(200) {
		r := rand.New(rand.NewPCG(seed, 1))
		per := 1 + r.IntN(1000)
		b := newReplyBudget(per, per*(1+r.IntN(8)))
		conns := make([]*guardConn, 1+r.IntN(12))
		live := map[*guardConn]bool{}
		for i := range conns {
			conns[i] = &guardConn{}
			b.register(conns[i])
			live[conns[i]] = true
		}
		model := map[*guardConn]int{}
		for op := range 400 {
			g := conns[r.IntN(len(conns))]
			switch k := r.IntN(10); {
			case k < 6:
				n := 1 + r.IntN(2*per)
				must := r.IntN(4) == 0
				ok, cut := b.queue(g, n, must)
				switch {
				case !live[g]:
					if ok {
						t.Fatalf("seed %d op %d: a dropped connection's reply was counted", seed, op)
					}
					continue
				case !ok && (must || model[g] == 0 || model[g]+n <= per):
					t.Fatalf("seed %d op %d: refused %d bytes (must %v) holding %d of %d", seed, op, n, must, model[g], per)
				case ok && !must && model[g] > 0 && model[g]+n > per:
					t.Fatalf("seed %d op %d: took %d bytes past %d holding %d", seed, op, n, per, model[g])
				}
				if ok {
					model[g] += n
				}
				for _, c := range cut {
					for _, h := range model {
						if h > model[c] {
							t.Fatalf("seed %d op %d: cut a connection holding %d while one held %d", seed, op, model[c], h)
						}
					}
					delete(model, c)
					live[c] = false
				}
			case k < 9:
				if n := model[g]; n > 0 {
					w := 1 + r.IntN(n)
					b.written(g, w)
					model[g] -= w
				}
			default:
				b.drop(g)
				delete(model, g)
				live[g] = false
			}
			sum := 0
			for _, h := range model {
				sum += h
			}
			total, own := b.bytes(g)
			if total != sum || own != model[g] {
				t.Fatalf("seed %d op %d: counted %d (own %d), model %d (own %d)", seed, op, total, own, sum, model[g])
			}
			if total > b.max {
				t.Fatalf("seed %d op %d: %d bytes held past the bound %d", seed, op, total, b.max)
			}
		}
	}
}

// stalled connects consumers that complete the handshake, each under its
// identity, send one request and never read; it returns them once the
// server routes replies to each.
func stalled(t *testing.T, s *Server, ids ...string) []net.Conn {
	t.Helper()
	var cs []net.Conn
	for _, id := range ids {
		c := rawHandshakeAs(t, s.Addr().String(), id)
		if tc, ok := c.(*net.TCPConn); ok {
			tc.SetReadBuffer(4 << 10)
		}
		cs = append(cs, c)
	}
	for end := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		s.connMu.Lock()
		n := 0
		for _, id := range ids {
			if s.conns[id] != nil {
				n++
			}
		}
		s.connMu.Unlock()
		if n == len(ids) {
			// Small send buffers: replies queue after a few KiB, not MiBs.
			s.connMu.Lock()
			for _, id := range ids {
				if q, ok := s.conns[id].Conn.(*quietConn); ok {
					q.tc.SetWriteBuffer(8 << 10)
				}
			}
			s.connMu.Unlock()
			return cs
		}
		if time.Now().After(end) {
			t.Fatalf("%d of %d consumers routed to", n, len(ids))
		}
	}
}

// A consumer that does not read holds at most MaxQueuedBytes of replies:
// past that its replies are refused (xfer.ErrQueueFull), while a
// neighbour's come at once; once it is gone, nothing is counted.
func TestReplyBytesPerConsumerBounded(t *testing.T) {
	const per = 1 << 20
	s := newServer(t, ServerConfig{MaxQueuedBytes: per, WriteTimeout: time.Minute})
	st := stalled(t, s, "staller")[0]
	big := make([]byte, 200<<10)
	refused := 0
	for i := range 400 {
		err := s.Reply([]byte("staller"), big)
		if errors.Is(err, xfer.ErrQueueFull) {
			refused++
		} else if err != nil {
			t.Fatalf("reply %d: %v", i, err)
		}
		s.connMu.Lock()
		g := s.conns["staller"]
		s.connMu.Unlock()
		if own := g.pendingOut(); own > per+64 { // 64: a PING or PONG
			t.Fatalf("reply %d: %d bytes queued for a consumer that does not read, bound %d", i, own, per)
		}
	}
	if refused == 0 {
		t.Fatal("400 replies of 200 KiB to a consumer that does not read: none refused")
	}
	c := newClient(t, ClientConfig{})
	if err := c.Send(s.Endpoint(), []byte("hi")); err != nil {
		t.Fatal(err)
	}
	var msgs []xfer.Message
	for end := time.Now().Add(5 * time.Second); len(msgs) == 0; time.Sleep(time.Millisecond) {
		if msgs = s.Drain(msgs); time.Now().After(end) {
			t.Fatal("no request from the neighbour")
		}
	}
	if err := s.Reply(msgs[0].Identity, big); err != nil {
		t.Fatalf("the neighbour's reply: %v", err)
	}
	waitInbound(t, c, 1, 5*time.Second)
	st.Close()
	for end := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		if total, _ := s.replies.bytes(nil); total == 0 {
			break
		}
		if time.Now().After(end) {
			total, _ := s.replies.bytes(nil)
			t.Fatalf("%d bytes still counted after the consumer left", total)
		}
	}
}

// Consumers that do not read hold at most 16 × MaxQueuedBytes together:
// past it the one holding the most is cut off, and a neighbour that reads
// gets every reply, even large ones queued behind its socket.
func TestReplyBytesForAllBounded(t *testing.T) {
	const per = 256 << 10
	s := newServer(t, ServerConfig{MaxQueuedBytes: per, WriteTimeout: time.Minute})
	var ids []string
	for i := range 40 {
		ids = append(ids, fmt.Sprintf("staller-%d", i))
	}
	stalled(t, s, ids...)
	c := newClient(t, ClientConfig{})
	if err := c.Send(s.Endpoint(), []byte("hi")); err != nil {
		t.Fatal(err)
	}
	var msgs []xfer.Message
	for end := time.Now().Add(5 * time.Second); len(msgs) == 0; time.Sleep(time.Millisecond) {
		if msgs = s.Drain(msgs); time.Now().After(end) {
			t.Fatal("no request from the neighbour")
		}
	}
	neighbour := msgs[0].Identity
	big := make([]byte, 64<<10)
	sent := 0
	for round := range 40 {
		for _, id := range ids {
			s.Reply([]byte(id), big)
		}
		held := 0
		s.connMu.Lock()
		for _, g := range s.conns {
			held += g.pendingOut()
		}
		s.connMu.Unlock()
		if held > 16*per+64*len(ids) {
			t.Fatalf("round %d: %d bytes queued for consumers that do not read, bound %d", round, held, 16*per)
		}
		if err := s.Reply(neighbour, big); err != nil {
			t.Fatalf("round %d: the neighbour's reply: %v", round, err)
		}
		sent++
		waitInbound(t, c, 1, 5*time.Second)
	}
	cut := 0
	s.connMu.Lock()
	for _, id := range ids {
		if s.conns[id] == nil {
			cut++
		}
	}
	s.connMu.Unlock()
	if cut == 0 {
		t.Fatalf("no consumer cut off: %d hold %d bytes of replies", len(ids), 16*per)
	}
	t.Logf("%d of %d consumers that do not read cut off; the neighbour got %d replies", cut, len(ids), sent)
}

// Requests waiting for Drain hold at most MaxQueuedBytes (a request
// counting its length + 64): past it the consumers' readers wait, none is
// dropped, and a Drain lets them on, in order.
func TestServerRequestBytesBounded(t *testing.T) {
	const per = 256 << 10
	s := newServer(t, ServerConfig{MaxQueuedBytes: per})
	flood := rawHandshakeAs(t, s.Addr().String(), "flood")
	body := make([]byte, 60<<10)
	const n = 64
	go func() {
		for i := range n {
			body[0] = byte(i)
			msg := []byte{flagMore, 0, flagLong}
			msg = binary.BigEndian.AppendUint64(msg, uint64(len(body)))
			if _, err := flood.Write(append(msg, body...)); err != nil {
				return
			}
		}
	}()
	c := newClient(t, ClientConfig{})
	if err := c.Send(s.Endpoint(), []byte("hi")); err != nil {
		t.Fatal(err)
	}
	// Until the readers stop: the flood is held back at the bound.
	var last int64 = -1
	for end := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		b := s.inBytes.Load()
		if b == last && b > 0 {
			break
		}
		last = b
		if time.Now().After(end) {
			t.Fatal("the readers never stopped")
		}
	}
	if last > per {
		t.Fatalf("%d bytes of requests waiting for Drain, bound %d", last, per)
	}
	got, neighbour := 0, false
	var msgs []xfer.Message
	for end := time.Now().Add(10 * time.Second); got < n || !neighbour; time.Sleep(time.Millisecond) {
		msgs = s.Drain(msgs[:0])
		for _, m := range msgs {
			if string(m.Identity) != "flood" {
				neighbour = true
				continue
			}
			if m.Payload[0] != byte(got) {
				t.Fatalf("request %d came as %d", got, m.Payload[0])
			}
			got++
		}
		if b := s.inBytes.Load(); b > per {
			t.Fatalf("%d bytes of requests waiting for Drain, bound %d", b, per)
		}
		if time.Now().After(end) {
			t.Fatalf("%d of %d requests, the neighbour's: %v", got, n, neighbour)
		}
	}
	if b := s.inBytes.Load(); b != 0 {
		t.Fatalf("%d bytes counted with nothing waiting", b)
	}
}

// drainRaw reads what c has until it has been quiet for quiet.
func drainRaw(c net.Conn, quiet time.Duration) int {
	buf := make([]byte, 64<<10)
	total := 0
	for {
		c.SetReadDeadline(time.Now().Add(quiet))
		n, err := c.Read(buf)
		total += n
		if err != nil {
			c.SetReadDeadline(time.Time{})
			return total
		}
	}
}

func heapNow() uint64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// rawConsumers connects consumers that complete the handshake and do not
// read; the server's side gets a small send buffer, so that replies queue
// in the guard (the consumer's receive buffer is left as it is: shrinking
// it stalls loopback TCP in zero-window probes).
func rawConsumers(t testing.TB, s *Server, ids ...string) []net.Conn {
	t.Helper()
	var cs []net.Conn
	for _, id := range ids {
		cs = append(cs, rawHandshakeAs(t, s.Addr().String(), id))
	}
	for end := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		s.connMu.Lock()
		n := 0
		for _, id := range ids {
			if g := s.conns[id]; g != nil {
				n++
			}
		}
		if n == len(ids) {
			for _, id := range ids {
				if q, ok := s.conns[id].Conn.(*quietConn); ok {
					q.tc.SetWriteBuffer(8 << 10)
				}
			}
			s.connMu.Unlock()
			return cs
		}
		s.connMu.Unlock()
		if time.Now().After(end) {
			t.Fatalf("%d of %d consumers routed to", n, len(ids))
		}
	}
}

// What a connection keeps beyond the bytes counted stays small: after
// bursts of replies that its consumer then read in full, nothing is
// counted and its buffers went (a connection kept 2 MiB each, uncounted:
// at 4,096 connections, 8 GiB against the bound of 256 MiB).
func TestBurstBuffersNotKept(t *testing.T) {
	s := newServer(t, ServerConfig{PeerTimeout: time.Minute, PingInterval: time.Hour, WriteTimeout: time.Minute})
	const n = 16
	var ids []string
	for i := range n {
		ids = append(ids, fmt.Sprintf("burst-%d", i))
	}
	cs := rawConsumers(t, s, ids...)
	base := heapNow()
	msg := make([]byte, 60<<10)
	for burst := range 2 {
		for _, id := range ids {
			for range 18 { // ~1 MiB: past the socket's buffers, under what the writer lets go of
				if err := s.Reply([]byte(id), msg); err != nil {
					t.Fatalf("burst %d reply to %s: %v", burst, id, err)
				}
			}
		}
		done := make(chan int)
		for _, c := range cs {
			go func() { done <- drainRaw(c, 200*time.Millisecond) }()
		}
		for range cs {
			<-done
		}
	}
	for end := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		total, _ := s.replies.bytes(nil)
		pend := 0
		s.connMu.Lock()
		for _, id := range ids {
			pend += s.conns[id].pendingOut()
		}
		s.connMu.Unlock()
		if total == 0 && pend == 0 {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("still counted %d, pending %d", total, pend)
		}
	}
	msg = nil
	kept := int64(heapNow()) - int64(base)
	if kept > n*256<<10 {
		t.Fatalf("nothing queued or counted, yet %d KiB held for %d connections (%d KiB each; at 4096 connections: %d MiB)",
			kept>>10, n, kept/n>>10, kept/n*4096>>20)
	}
}

// A reply to a connection no longer counted (cut for the bound for all,
// its close still to come) that the socket takes in part closes it: half a
// message on the wire must not leave it open, routed to and mute.
func TestPartReplyToUncountedConnCloses(t *testing.T) {
	s := newServer(t, ServerConfig{PeerTimeout: time.Minute, PingInterval: time.Hour})
	rawConsumers(t, s, "early")
	s.connMu.Lock()
	g := s.conns["early"]
	s.connMu.Unlock()
	s.replies.drop(g)                             // as a cut does
	s.Reply([]byte("early"), make([]byte, 4<<20)) // more than the socket takes
	select {
	case <-g.done:
		return // closed: the consumer reconnects
	case <-time.After(5 * time.Second):
	}
	s.connMu.Lock()
	routed := s.conns["early"] == g
	s.connMu.Unlock()
	err2 := s.Reply([]byte("early"), []byte("small"))
	t.Fatalf("a partly written reply left the connection open (routed %v) and broken: next reply: %v", routed, err2)
}
