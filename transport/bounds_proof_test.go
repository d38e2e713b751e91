package transport

import (
	"bytes"
	"io"
	"net"
	"testing"
	"time"

	"github.com/ecxfer/ecxfer/xfer"
)

// proveConn READs a grant of no blocks, as a contact does, on a raw
// consumer's connection c, takes the answer and confirms it: c has shown
// notif's grant, whose notification is queued.
func proveConn(t *testing.T, c net.Conn, id uint64, notif []byte) {
	t.Helper()
	if _, err := c.Write(appendRead(nil, id, notif, 0, nil, false)); err != nil {
		t.Fatal(err)
	}
	if st := rawAnswer(t, c, id); st != dataOK {
		t.Fatalf("the READ of a live grant: status %d", st)
	}
	if _, err := c.Write(appendDone(nil, id)); err != nil {
		t.Fatal(err)
	}
}

// provenConns is how many of p's connections hold a live proof.
func provenConns(p *TCPData) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for s := range p.served {
		if p.proven(s) {
			n++
		}
	}
	return n
}

// One peer with one grant READs it once on each of MaxConns connections,
// then its grant ends: their proofs end with the grant's time left, and a
// well-behaved consumer that connects later takes the place of one of
// them, while a consumer that kept reading keeps its connection.
func TestOneGrantProvesEveryConnection(t *testing.T) {
	const maxConns, lease = 4, time.Minute
	pr := newRegion(t, 8, 4096)
	p := newTCP(t, pr, TCPConfig{Listen: "127.0.0.1:0", MaxConns: maxConns, MaxConnsPerHost: maxConns}) // one host may hold them all
	g := &testGate{grants: map[uint64]testGrant{}}
	g.att = p.attach(leaseGate{g, lease})
	read := neighbour(t, p, pr, g)
	read(1)
	one := g.grant() // a grant of no blocks, as a contact's
	var hostile []net.Conn
	for i := range maxConns - 1 {
		c := rawConsumer(t, p)
		proveConn(t, c, uint64(i+1), one)
		hostile = append(hostile, c)
	}
	until(t, "every connection proven", func() bool { return provenConns(p) == maxConns })
	g.end(one) // the grant is over; its connections stay
	p.clockAhead.Add(int64(lease + answerGrace))
	if n := provenConns(p); n != 0 {
		t.Fatalf("%d connections proven past their grants' time", n)
	}
	read(2) // a later grant proves the neighbour again
	if n := provenConns(p); n != 1 {
		t.Fatalf("%d connections proven, only the neighbour's should be", n)
	}
	// A well-behaved consumer, with a live grant of its own.
	cr := newRegion(t, 8, 4096)
	c := newTCP(t, cr, TCPConfig{Conns: 1})
	peer, err := c.AddRemotePeer(p.AgentMetadata(), nil)
	if err != nil {
		t.Fatal(err)
	}
	h, err := c.PostRead([]int{1}, peer.Agent, []int{1}, g.grant(1))
	if err != nil {
		t.Fatal(err)
	}
	if got := waitEnd(t, c, h); got != xfer.Complete {
		t.Fatalf("the newcomer's READ: %v; %d connections of one ended grant kept, %d shed",
			got, servedCount(p), p.Stats().ConnsShed)
	}
	if shed := p.Stats().ConnsShed; shed != 1 {
		t.Fatalf("%d connections shed, want 1", shed)
	}
	expectClosed(t, hostile[0], 5*time.Second) // the oldest of those whose proof ended
	read(3)                                    // the neighbour kept its connection
}

// One grant proves a few connections, not all: presented on MaxConns
// connections, it leaves room for a newcomer with a grant of its own.
func TestOneGrantProvesFewConnections(t *testing.T) {
	const maxConns = 2 * maxProofConns
	pr := newRegion(t, 8, 4096)
	p, g := gatedProducer(t, pr, TCPConfig{MaxConns: maxConns, MaxConnsPerHost: maxConns}) // one host may hold them all
	one := g.grant()
	for i := range maxConns {
		proveConn(t, rawConsumer(t, p), uint64(i+1), one)
	}
	until(t, "every connection served", func() bool { return servedCount(p) == maxConns })
	if n := provenConns(p); n != maxProofConns {
		t.Fatalf("one grant proves %d connections, want %d", n, maxProofConns)
	}
	read := neighbour(t, p, pr, g)
	read(1)
	if shed := p.Stats().ConnsShed; shed != 1 {
		t.Fatalf("%d connections shed, want 1", shed)
	}
}

// queuedNotifBytes is what p's notification queue holds, as charged.
func queuedNotifBytes(p *TCPData) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, m := range p.notifs {
		n += len(m.Msg) + notifCost
	}
	return n
}

// notifFlood is a connection's share of the queue in tokenless
// notifications of 1000 bytes, as a vLLM consumer's, and how many.
func notifFlood() ([]byte, int) {
	msg := bytes.Repeat([]byte{'a'}, 1000)
	per := connNotifBytes / (len(msg) + notifCost)
	var b []byte
	for range per {
		b = appendNotify(b, msg)
	}
	return b, per
}

// A stranger (no grant) that floods tokenless notifications and connects
// again gets none of them queued, however often it reconnects: each is
// dropped and counted.
func TestNotifShareResetByReconnect(t *testing.T) {
	pr := newRegion(t, 8, 4096)
	p, _ := gatedProducer(t, pr, TCPConfig{IOTimeout: 200 * time.Millisecond, MaxConns: 4})
	const rounds = 12
	flood, per := notifFlood()
	for r := range rounds {
		c, err := net.Dial("tcp", p.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		c.Write(appendHello(nil, "raw", 0, nil))
		io.ReadFull(c, make([]byte, headLen+proofLen))
		c.Write(flood)
		want := uint64((r + 1) * per)
		until(t, "the flood dropped", func() bool { return p.Stats().NotifDrops >= want })
		c.Close()
	}
	if got := queuedNotifBytes(p); got != 0 {
		t.Fatalf("one stranger, reconnecting %d times, holds %d KiB of notifications (%d queued)",
			rounds, got>>10, len(p.notifs))
	}
}

// A peer with a live grant that floods its share, closes and connects
// again, holds no more than the queue's bound for all connections: past
// it the connection waits for room, and is closed when none comes; a
// neighbour's completion waits too, and is drained.
func TestNotifQueueBoundedForAll(t *testing.T) {
	pr := newRegion(t, 8, 4096)
	p, g := gatedProducer(t, pr, TCPConfig{IOTimeout: 500 * time.Millisecond})
	const bound = 2 * connNotifBytes
	p.mu.Lock()
	p.notifCap = bound
	p.mu.Unlock()
	read := neighbour(t, p, pr, g)
	grant := g.grant()
	flood, per := notifFlood()
	for r := range 2 {
		c := rawConsumer(t, p)
		proveConn(t, c, 1, grant)
		c.Write(flood)
		want := (r + 1) * per * (1000 + notifCost)
		until(t, "the flood queued", func() bool { return queuedNotifBytes(p) >= want })
		c.Close()
	}
	c := rawConsumer(t, p)
	proveConn(t, c, 1, grant)
	c.Write(flood)
	until(t, "the third flood cut", func() bool { return p.Stats().NotifCuts == 1 })
	expectClosed(t, c, 5*time.Second)
	if got := queuedNotifBytes(p); got > bound {
		t.Fatalf("%d KiB of notifications queued, the bound is %d KiB", got>>10, bound>>10)
	}
	// No room left at all: the neighbour's completion waits for a drain.
	p.mu.Lock()
	p.notifCap = p.notifBytes
	p.mu.Unlock()
	notif := read(1)
	until(t, "the neighbour's completion waiting", func() bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		for s := range p.served {
			if s.waitsAll {
				return true
			}
		}
		return false
	})
	waitNotifsOf(t, p, "the neighbour's completion", func(n xfer.Notif) bool { return bytes.Equal(n.Msg, notif) })
	if cuts := p.Stats().NotifCuts; cuts != 1 {
		t.Fatalf("%d connections cut for their notifications, want 1", cuts)
	}
}
