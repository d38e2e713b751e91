package transport

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/ecxfer/ecxfer/cache"
	"github.com/ecxfer/ecxfer/internal/plane"
)

// Close while READs are being posted and released on other goroutines
// returns, every time: a READ routed to one of the peer's goroutines just
// as the peer shuts down is failed, never left in a channel its goroutine
// no longer reads (which kept the READ, and the producer's mapping, until
// Close waited forever for them).
func TestCloseRacingPostRead(t *testing.T) {
	const bs = 64 << 10
	pr := newSharedRegion(t, 16, bs)
	p, g := gatedProducer(t, pr, TCPConfig{})
	ids := []int{0, 1, 2, 3, 4, 5, 6, 7} // 512 KiB: the copy goroutine's
	notif := g.grant(ids...)
	for trial := range 100 {
		cr, err := cache.NewRegion(cache.RegionConfig{Blocks: 16, BlockSize: bs, NoLock: true})
		if err != nil {
			t.Fatal(err)
		}
		c, err := NewTCPData(TCPConfig{Logger: quiet}, cr)
		if err != nil {
			t.Fatal(err)
		}
		peer, err := c.AddRemotePeer(p.AgentMetadata(), nil)
		if err != nil {
			t.Fatal(err)
		}
		warm(t, c, peer.Agent, g)
		stop := make(chan struct{})
		var posted atomic.Int64
		var wg sync.WaitGroup
		for range 3 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					select {
					case <-stop:
						return
					default:
					}
					if h, err := c.PostRead(ids, peer.Agent, ids, notif); err == nil {
						posted.Add(1)
						c.Release(h)
					}
				}
			}()
		}
		poll(t, 10*time.Second, "READs under way", func() bool { return posted.Load() >= 8 })
		done := make(chan struct{})
		go func() { c.Close(); close(done) }()
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			t.Fatalf("trial %d: Close did not return", trial)
		}
		close(stop)
		wg.Wait()
		cr.Close()
	}
}

// welcomingProducer is a producer's data port that welcomes every
// consumer and hands its connection to the test, which plays the rest;
// push says whether its metadata offers pushes.
func welcomingProducer(t *testing.T, bs, blocks int, push bool) (meta []byte, conns chan net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	m := metaOf(t, agentMetaBytes(t, "welcoming", ln.Addr().String(), bs, blocks, metaVersion))
	m.Push = push
	conns = make(chan net.Conn, 4)
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			t.Cleanup(func() { conn.Close() })
			readHello(conn)
			conn.Write(appendWelcome(nil, nil))
			conns <- conn
		}
	}()
	return agentMetaBytesOf(t, m), conns
}

// readHello reads a consumer's hello on conn and returns the room it
// offers for pushes.
func readHello(conn net.Conn) (room int) {
	var hdr [headLen + 2]byte
	io.ReadFull(conn, hdr[:])
	rest := make([]byte, int(binary.BigEndian.Uint16(hdr[headLen:]))+4+challengeLen)
	io.ReadFull(conn, rest)
	return int(binary.BigEndian.Uint32(rest[len(rest)-4-challengeLen:]))
}

// Release of a READ that a push is landing before the READ's frame went
// out stops the push's lander, as it stops an answer's: a producer that
// trickles the push (a byte a second, within IOTimeout) does not hold
// Release, which must not wait on the network.
func TestReleaseStopsAPushLandingAnUnsentRead(t *testing.T) {
	const bs = 4096
	meta, conns := welcomingProducer(t, bs, 8, true)
	cr := newRegion(t, 8, bs)
	c := newTCP(t, cr, TCPConfig{Conns: 1, IOTimeout: time.Minute})
	peer, err := c.AddRemotePeer(meta, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := (tcpPlane{c}).Contact(context.Background(), peer.Agent, plane.Contact{}); err != nil {
		t.Fatal(err)
	}
	conn := <-conns
	c.mu.Lock()
	l := c.peers[peer.Agent].links[0]
	c.mu.Unlock()
	l.wmu.Lock() // a write in progress: the READ stays queued
	notif := []byte("00000000-0000-4000-8000-000000000001:h#7.0102030405060708090a0b0c0d0e0f10")
	h, err := c.PostRead([]int{0, 1}, peer.Agent, []int{2, 3}, notif)
	if err != nil {
		t.Fatal(err)
	}
	// Half of its push comes, and stops.
	conn.Write(appendPushHead(nil, notif, 2*bs, []int{2, 3}))
	conn.Write(make([]byte, bs))
	until(t, "the push's lander claimed the READ", func() bool {
		c.mu.Lock()
		op := c.handles[h]
		c.mu.Unlock()
		return op.state.Load() == opWriting
	})
	l.wmu.Unlock()
	released := make(chan struct{})
	go func() { c.Release(h); close(released) }()
	select {
	case <-released:
	case <-time.After(30 * time.Second): // IOTimeout is a minute
		conn.Close()
		<-released
		t.Fatal("Release waited for the producer")
	}
}

// A producer's pushes that nobody claims are kept up to a count as well as
// a size, the oldest going first, each in constant time: many small
// unclaimed pushes cannot make a push's keeping (under the stage's lock,
// which PostRead takes too) scan them all.
func TestStageKeepsBoundedPushes(t *testing.T) {
	const bs = 256
	s := newStage(8 << 20) // room for 32,768 such pushes
	for i := range 3 * maxKept {
		st := s.keep(fmt.Sprintf("n%d", i), []int{i}, bs)
		if st == nil {
			t.Fatalf("push %d not kept", i)
		}
		s.arrived(st, true)
	}
	if len(s.kept) != maxKept || s.bytes != maxKept*bs {
		t.Fatalf("kept %d pushes, %d bytes; want %d, %d", len(s.kept), s.bytes, maxKept, maxKept*bs)
	}
	n, want := 0, 2*maxKept // the newest are kept, in order
	for st := s.head; st != nil; st = st.next {
		if st.notif != fmt.Sprintf("n%d", want) {
			t.Fatalf("kept %q at %d, want n%d", st.notif, n, want)
		}
		n, want = n+1, want+1
	}
	if n != maxKept {
		t.Fatalf("the list holds %d", n)
	}
	// A large push makes room from the head.
	st := s.keep("big", []int{0}, 1<<20)
	if st == nil || len(s.kept) > maxKept || s.bytes > 8<<20 || s.kept["big"] != st {
		t.Fatalf("the large push: %v, kept %d, %d bytes", st != nil, len(s.kept), s.bytes)
	}
}

// A contact whose READ the producer never answers waits at pauses that
// grow, not on a fast ticker: over a second it looks at the READ a few
// dozen times, not twenty thousand.
func TestContactWithASilentProducerParks(t *testing.T) {
	meta, _ := welcomingProducer(t, 4096, 8, false) // it never answers
	c := newTCP(t, newRegion(t, 8, 4096), TCPConfig{})
	rp, err := c.AddRemotePeer(meta, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	err = tcpPlane{c}.Contact(ctx, rp.Agent, plane.Contact{Notif: []byte("s:#1.0102030405060708090a0b0c0d0e0f10")})
	if err == nil {
		t.Fatal("the contact ended")
	}
	if n := c.contactChecks.Load(); n > 100 {
		t.Fatalf("the contact READ was looked at %d times in a second", n)
	}
}

// Close cuts short a dial in progress to a producer that does not answer
// (its accept queue full: SYNs dropped), instead of waiting for
// DialTimeout: a READ's, and a contact's, whose Contact then returns.
func TestCloseCutsADialShort(t *testing.T) {
	for _, contact := range []bool{false, true} {
		t.Run(fmt.Sprintf("contact %v", contact), func(t *testing.T) { closeCutsADialShort(t, contact) })
	}
}

// silentAddr returns the address of a listener that accepts nothing and
// whose accept queue is full, so that a dial to it hangs (SYNs dropped);
// it skips where the kernel accepts beyond the queue.
func silentAddr(t *testing.T) string {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Close(fd) })
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	syscall.Listen(fd, 0)
	sa, _ := syscall.Getsockname(fd)
	addr := fmt.Sprintf("127.0.0.1:%d", sa.(*syscall.SockaddrInet4).Port)
	for range 4 { // fill the accept queue
		if c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond); err == nil {
			t.Cleanup(func() { c.Close() })
		}
	}
	if c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond); err == nil {
		c.Close()
		t.Skip("this kernel accepts beyond the queue: no dial hangs")
	}
	return addr
}

func closeCutsADialShort(t *testing.T, contact bool) {
	addr := silentAddr(t)
	cr := newRegion(t, 8, 64)
	c, err := NewTCPData(TCPConfig{Logger: quiet, DialTimeout: time.Minute}, cr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	peer, err := c.AddRemotePeer(agentMetaBytes(t, "blackhole", addr, 64, 8, metaVersion), nil)
	if err != nil {
		t.Fatal(err)
	}
	contacted := make(chan error, 1)
	if contact {
		go func() { contacted <- (tcpPlane{c}).Contact(context.Background(), peer.Agent, plane.Contact{}) }()
	} else if _, err := c.PostRead([]int{0}, peer.Agent, []int{1}, []byte("a:b")); err != nil {
		t.Fatal(err)
	}
	c.mu.Lock()
	links := c.peers[peer.Agent].links
	c.mu.Unlock()
	dialing := func() bool { // on whichever link's writer took the READ
		for _, l := range links {
			if !l.dial.TryLock() {
				return true
			}
			l.dial.Unlock()
		}
		return false
	}
	for end := time.Now().Add(5 * time.Second); !dialing(); time.Sleep(time.Millisecond) {
		if time.Now().After(end) {
			t.Skip("no dial stayed under way: the kernel answered it")
		}
	}
	closed := make(chan struct{})
	go func() { c.Close(); close(closed) }()
	select {
	case <-closed:
	case <-time.After(30 * time.Second):
		t.Fatal("Close waited for the dial")
	}
	if contact {
		select {
		case <-contacted:
		case <-time.After(30 * time.Second):
			t.Fatal("Contact waited for the dial")
		}
	}
}

// The stage's room bounds every byte it holds: kept pushes by their
// buffers' capacity (a small push may reuse a large buffer), and the
// spare buffers it keeps for reuse. Random keeps, arrivals, claims and
// landings, with pushes of very different sizes (a producer's choice),
// never hold more than the room.
func TestStageRoomBoundsItsBuffers(t *testing.T) {
	const room = 8 << 20
	rng := rand.New(rand.NewPCG(1, 2))
	sizes := []int{4 << 10, 64 << 10, 1 << 20}
	for trial := range 50 {
		s := newStage(room)
		var claimed [][]byte
		for i := range 2000 {
			switch r := rng.IntN(10); {
			case r < 5:
				if st := s.keep(fmt.Sprintf("n%d", i), []int{i}, sizes[rng.IntN(len(sizes))]); st != nil {
					s.arrived(st, rng.IntN(8) != 0)
				}
			case r < 8: // a READ claims the oldest ready push, and lands it later
				s.mu.Lock()
				if st := s.head; st != nil && st.ready && st.op == nil {
					s.unkeepLocked(st)
					claimed = append(claimed, st.buf)
				}
				s.mu.Unlock()
			default:
				if len(claimed) > 0 {
					s.done(claimed[0])
					claimed = claimed[1:]
				}
			}
			s.mu.Lock()
			kept, spare := 0, 0
			for st := s.head; st != nil; st = st.next {
				kept += cap(st.buf)
			}
			for _, b := range s.free {
				spare += cap(b)
			}
			if kept != s.bytes || spare != s.spare || kept+spare > room {
				s.mu.Unlock()
				t.Fatalf("trial %d, op %d: kept buffers %d (counted %d), spare %d (counted %d), room %d", trial, i, kept, s.bytes, spare, s.spare, room)
			}
			s.mu.Unlock()
		}
	}
}

// Spare buffers yield before any push: a push that fits once the spares
// are dropped evicts no young push.
func TestStageSparesYieldBeforePushes(t *testing.T) {
	const mb = 1 << 20
	s := newStage(8 * mb)
	var sts []*staged
	for i := range 8 {
		st := s.keep(fmt.Sprintf("n%d", i), []int{i}, mb)
		if st == nil {
			t.Fatalf("push %d not kept", i)
		}
		s.arrived(st, true)
		sts = append(sts, st)
	}
	s.mu.Lock()
	s.unkeepLocked(sts[0]) // claimed, and landed: its buffer is a spare
	s.mu.Unlock()
	s.done(sts[0].buf)
	if s.keep("n8", []int{8}, mb) == nil {
		t.Fatal("a push that fits was not kept")
	}
	for i := 1; i < 8; i++ {
		if s.kept[fmt.Sprintf("n%d", i)] == nil {
			t.Fatalf("push n%d, young, was evicted to keep a spare buffer", i)
		}
	}
}
