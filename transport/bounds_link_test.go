package transport

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/ecxfer/ecxfer/xfer"
)

// stalledAddr is a producer address whose dials hang: its accept queue is
// full, so the kernel drops the SYNs. It skips when this kernel answers
// them anyway.
func stalledAddr(t *testing.T) string {
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
		t.Skip("this kernel accepts beyond the queue: no dial stalls")
	}
	return addr
}

// READs released while their producer's dial hangs give their places back
// at once: MaxQueued more READs posted after them are taken, round after
// round, not failed for want of room in the writers' queue (or, to a
// producer that pushes, the first connection's). Each READ's place is
// given back once: when everything ended, none is counted.
func TestReleasedReadsFreeTheirPlaces(t *testing.T) {
	for _, push := range []bool{false, true} {
		t.Run(fmt.Sprintf("push %v", push), func(t *testing.T) { releasedReadsFreeTheirPlaces(t, push) })
	}
}

func releasedReadsFreeTheirPlaces(t *testing.T, push bool) {
	const max = 8
	addr := stalledAddr(t)
	c := newTCP(t, newRegion(t, 8, 64), TCPConfig{MaxQueued: max, DialTimeout: time.Minute})
	m := metaOf(t, agentMetaBytes(t, "stalled", addr, 64, 8, metaVersion))
	m.Push = push
	peer, err := c.AddRemotePeer(agentMetaBytesOf(t, m), nil)
	if err != nil {
		t.Fatal(err)
	}
	notif := []byte("a:b")
	if push { // a grant's: it goes on the first connection, where pushes come
		notif = []byte("s:m#1.0102030405060708090a0b0c0d0e0f10")
	}
	c.mu.Lock()
	p := c.peers[peer.Agent]
	c.mu.Unlock()
	for round := range 5 {
		var hs []xfer.Handle
		for i := range max {
			h, err := c.PostRead([]int{0}, peer.Agent, []int{1}, notif)
			if err != nil {
				t.Fatalf("round %d, READ %d: %v", round, i, err)
			}
			if got, _ := c.Check(h); got != xfer.InProgress {
				t.Fatalf("round %d, READ %d: %v at once, with %d of %d places taken", round, i, got, p.inflight.Load(), max)
			}
			hs = append(hs, h)
		}
		if _, err := c.PostRead([]int{0}, peer.Agent, []int{1}, notif); err == nil {
			t.Fatalf("round %d: a READ past MaxQueued was taken", round)
		}
		for _, h := range hs {
			c.Release(h)
		}
		if n := p.inflight.Load(); n != 0 {
			t.Fatalf("round %d: %d places taken after every READ was released", round, n)
		}
	}
	// The last round's READs are left to the shutdown, which fails them.
	for range max / 2 {
		if _, err := c.PostRead([]int{0}, peer.Agent, []int{1}, notif); err != nil {
			t.Fatal(err)
		}
	}
	c.Close()
	if n := p.inflight.Load(); n != 0 {
		t.Fatalf("%d places counted after Close", n)
	}
}

// servedOne returns the one connection p serves.
func servedOne(t *testing.T, p *TCPData) *servedConn {
	t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.served) != 1 {
		t.Fatalf("%d connections served", len(p.served))
	}
	for s := range p.served {
		return s
	}
	return nil
}

// kept is how many pushes c keeps from agent.
func kept(c *TCPData, agent string) int {
	c.mu.Lock()
	st := c.peers[agent].push
	c.mu.Unlock()
	st.mu.Lock()
	defer st.mu.Unlock()
	return len(st.kept)
}

// Pushes that find their consumer's connection being written to (an
// answer, another push) wait behind that write instead of being declined,
// and go once it is done: the consumer keeps each, and its READs land
// from them with the producer's bytes, asking for none.
func TestPushesWaitBehindAWrite(t *testing.T) {
	c, p, cb, pb, g, agent := pushPair(t)
	s := servedOne(t, p)
	s.wmu.Lock() // an answer being written
	var notifs [][]byte
	var released atomic.Int32
	declined := 0
	for b := range 4 {
		n := g.grant(b)
		notifs = append(notifs, n)
		if !g.att.Push(1, n, []int{b}, func() { released.Add(1) }) {
			declined++
		}
	}
	early := released.Load()
	s.wmu.Unlock()
	if declined != 0 || early != 0 {
		t.Fatalf("with a write under way, %d of 4 pushes declined, %d written", declined, early)
	}
	until(t, "every push is out", func() bool { return released.Load() == 4 })
	until(t, "the consumer keeps every push", func() bool { return kept(c, agent) == 4 })
	asked := g.asked.Load()
	for i, n := range notifs {
		h, _ := c.PostRead([]int{8 + i}, agent, []int{i}, n)
		if waitEnd(t, c, h) != xfer.Complete || !bytes.Equal(cb(8+i), pb(i)) {
			t.Fatalf("READ %d", i)
		}
	}
	if g.asked.Load() != asked || c.Stats().Pushed != 4 || p.Stats().PushesSent != 4 {
		t.Fatalf("asked %d, landed from pushes %d, pushed %d", g.asked.Load()-asked, c.Stats().Pushed, p.Stats().PushesSent)
	}
}

// What waits on a connection is bounded: past maxPushWaiting a push is
// declined (its hold stays the caller's). When the connection closes
// before the write ahead ends, the pushes waiting are not written, and
// each one's hold ends, once.
func TestWaitingPushesBoundedAndReleased(t *testing.T) {
	_, p, _, _, g, _ := pushPair(t)
	s := servedOne(t, p)
	s.wmu.Lock()
	var released atomic.Int32
	declined := 0
	for range maxPushWaiting + 1 {
		if !g.att.Push(1, g.grant(0), []int{0}, func() { released.Add(1) }) {
			declined++
		}
	}
	s.close()
	s.wmu.Unlock()
	if declined != 1 {
		t.Fatalf("%d of %d pushes declined", declined, maxPushWaiting+1)
	}
	until(t, "every waiting push's hold ends", func() bool { return released.Load() == maxPushWaiting })
	p.Close() // waits for the drainer
	if n := released.Load(); n != maxPushWaiting || p.Stats().PushesSent != 0 {
		t.Fatalf("%d holds ended, %d pushed", n, p.Stats().PushesSent)
	}
}

// peerOf returns c's peer for agent.
func peerOf(c *TCPData, agent string) *peer {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.peers[agent]
}

// pushesTaken is how many pushes c landed or dropped.
func pushesTaken(c *TCPData) uint64 { return c.pushLanded.Load() + c.pushDrops.Load() }

// A push that comes while its READ's frame is being sent (the READ is
// sent, its frame not yet out) lands the READ: the producer, which pushed
// before it saw the READ, answers "pushed", and the READ must not then
// fail for want of bytes.
func TestPushDuringItsReadsSend(t *testing.T) {
	c, _, cb, pb, g, agent := pushPair(t)
	notif := g.grant(5, 6)
	var once sync.Once
	hook := func(op *readOp) {
		if !bytes.Equal(op.notif, notif) {
			return
		}
		once.Do(func() {
			// The push goes now, and the consumer's reader takes it while
			// this READ's frame waits to be written.
			before := pushesTaken(c)
			if !g.att.Push(1, notif, []int{5, 6}, func() {}) {
				t.Error("push declined")
				return
			}
			for end := time.Now().Add(10 * time.Second); pushesTaken(c) == before; time.Sleep(50 * time.Microsecond) {
				if time.Now().After(end) {
					t.Error("the push was not taken")
					return
				}
			}
		})
	}
	peerOf(c, agent).sentHook.Store(&hook)
	h, _ := c.PostRead([]int{2, 3}, agent, []int{5, 6}, notif)
	if got := waitEnd(t, c, h); got != xfer.Complete || !bytes.Equal(cb(2), pb(5)) || !bytes.Equal(cb(3), pb(6)) {
		t.Fatalf("the READ: %v (landed from pushes %d, pushes dropped %d)", got, c.Stats().Pushed, c.Stats().PushDrops)
	}
}

// A READ posted as a push of its grant, which no READ asked for yet, is
// being taken lands from that push: it finds the push kept, or the push
// finds it asked; never neither (the push kept for no one, and the READ,
// answered "pushed", failed).
func TestReadPostedAsItsPushIsTaken(t *testing.T) {
	c, _, cb, pb, g, agent := pushPair(t)
	notif := g.grant(5, 6)
	var once sync.Once
	posted := make(chan xfer.Handle, 1)
	hook := func() {
		once.Do(func() {
			h, err := c.PostRead([]int{2, 3}, agent, []int{5, 6}, notif)
			if err != nil {
				t.Error(err)
			}
			posted <- h
		})
	}
	peerOf(c, agent).pushHook.Store(&hook)
	if !g.att.Push(1, notif, []int{5, 6}, func() {}) {
		t.Fatal("push declined")
	}
	h := <-posted
	if got := waitEnd(t, c, h); got != xfer.Complete || !bytes.Equal(cb(2), pb(5)) || !bytes.Equal(cb(3), pb(6)) {
		t.Fatalf("the READ: %v (landed from pushes %d, pushes dropped %d)", got, c.Stats().Pushed, c.Stats().PushDrops)
	}
}

// readReadFrame reads a consumer's READ frame on conn and returns its id.
func readReadFrame(t *testing.T, conn net.Conn) uint64 {
	t.Helper()
	var b [headLen + 14]byte
	if _, err := io.ReadFull(conn, b[:]); err != nil || b[4] != frameRead {
		t.Fatalf("READ frame: %v, type %d", err, b[4])
	}
	nl := int(binary.BigEndian.Uint16(b[headLen+8:]) &^ readResend)
	n := int(binary.BigEndian.Uint32(b[headLen+10:]))
	if _, err := io.ReadFull(conn, make([]byte, nl+4*n)); err != nil {
		t.Fatal(err)
	}
	return binary.BigEndian.Uint64(b[headLen:])
}

// A push that lands the READ at the head of its connection's queue starts
// the turn of the READ behind it, as the head's answer would: on a link
// that moves bytes steadily (the push trickling in, each piece well
// within IOTimeout) for longer than IOTimeout, the head's deadline does
// not pass before the producer's "pushed" answer comes, and the READ
// behind is answered, not failed.
func TestPushLandingTheHeadStartsTheNextTurn(t *testing.T) {
	const bs = 4096
	const timeout = 800 * time.Millisecond
	meta, conns := welcomingProducer(t, bs, 8, true)
	cr := newRegion(t, 8, bs)
	c := newTCP(t, cr, TCPConfig{Conns: 1, IOTimeout: timeout})
	peer, err := c.AddRemotePeer(meta, nil)
	if err != nil {
		t.Fatal(err)
	}
	notif := []byte("00000000-0000-4000-8000-000000000001:h#7.0102030405060708090a0b0c0d0e0f10")
	ha, err := c.PostRead([]int{0, 1}, peer.Agent, []int{2, 3}, notif)
	if err != nil {
		t.Fatal(err)
	}
	conn := <-conns
	ida := readReadFrame(t, conn)
	hb, err := c.PostRead([]int{4}, peer.Agent, []int{5}, []byte("s:m"))
	if err != nil {
		t.Fatal(err)
	}
	idb := readReadFrame(t, conn)
	// The head's push: a piece every quarter of IOTimeout, 3/2 of it in all.
	want := bytes.Repeat([]byte{7}, 2*bs)
	push := append(appendPushHead(nil, notif, 2*bs, []int{2, 3}), want...)
	const pieces = 6
	for i := range pieces {
		conn.Write(push[i*len(push)/pieces : (i+1)*len(push)/pieces])
		time.Sleep(timeout / 4)
	}
	conn.Write(appendDataHead(nil, ida, dataPushed, 0))
	conn.Write(append(appendDataHead(nil, idb, dataOK, bs), bytes.Repeat([]byte{9}, bs)...))
	if got := waitEnd(t, c, ha); got != xfer.Complete || !bytes.Equal(cr.Bytes()[:2*bs], want) {
		t.Fatalf("the head: %v", got)
	}
	if got := waitEnd(t, c, hb); got != xfer.Complete || !bytes.Equal(cr.Block(4), bytes.Repeat([]byte{9}, bs)) {
		t.Fatalf("the READ behind the head: %v", got)
	}
}
