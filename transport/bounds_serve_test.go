package transport

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/ecxfer/ecxfer/cache"
	"github.com/ecxfer/ecxfer/internal/plane"
	"github.com/ecxfer/ecxfer/internal/wirext"
	"github.com/ecxfer/ecxfer/wire"
	"github.com/ecxfer/ecxfer/xfer"
)

// The bounds on what a served connection makes a producer hold: each is
// driven to its end by a scripted peer, while a well-behaved consumer of
// the same producer keeps getting its READs, with the right bytes.

// neighbour is a well-behaved consumer of p, over one connection; read
// READs block b under a fresh grant of g, checks the bytes that landed and
// returns the grant's notification.
func neighbour(t *testing.T, p *TCPData, pr *cache.Region, g *testGate) (read func(b int) []byte) {
	t.Helper()
	cr := newRegion(t, pr.Blocks(), pr.BlockSize())
	c := newTCP(t, cr, TCPConfig{Conns: 1})
	peer, err := c.AddRemotePeer(p.AgentMetadata(), nil)
	if err != nil {
		t.Fatal(err)
	}
	round := byte(0)
	return func(b int) []byte {
		t.Helper()
		round++
		want := pr.Block(b)
		for i := range want {
			want[i] = byte(i) + round
		}
		notif := g.grant(b)
		h, err := c.PostRead([]int{b}, peer.Agent, []int{b}, notif)
		if err != nil {
			t.Fatal(err)
		}
		if got := waitEnd(t, c, h); got != xfer.Complete {
			t.Fatalf("the neighbour's READ of block %d: %v", b, got)
		}
		c.Release(h)
		if !bytes.Equal(cr.Block(b), want) {
			t.Fatalf("the neighbour's READ of block %d landed other bytes", b)
		}
		return notif
	}
}

// servedCount is how many connections p serves.
func servedCount(p *TCPData) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.served)
}

// At MaxConns, strangers that sent a hello and nothing else make room for
// each other; a consumer that presented a grant keeps its connection, and
// when every connection has, a newcomer from the host holding them all
// (one under its cap) is turned away.
func TestConnCapShedsStrangersNotGrantees(t *testing.T) {
	const maxConns = 8
	pr := newRegion(t, 8, 4096)
	p, g := gatedProducer(t, pr, TCPConfig{MaxConns: maxConns, MaxConnsPerHost: maxConns + 1})
	read := neighbour(t, p, pr, g)
	read(1) // its connection is proven
	p.mu.Lock()
	var proven *servedConn
	for s := range p.served {
		proven = s
	}
	p.mu.Unlock()
	var strangers []net.Conn
	for range 6 * maxConns {
		strangers = append(strangers, rawConsumer(t, p))
		if n := servedCount(p); n > maxConns {
			t.Fatalf("%d connections served, the bound is %d", n, maxConns)
		}
	}
	p.mu.Lock()
	_, kept := p.served[proven]
	p.mu.Unlock()
	if !kept {
		t.Fatal("the consumer that proved a grant was cut for strangers")
	}
	if shed := p.Stats().ConnsShed; shed < 5*maxConns {
		t.Fatalf("%d connections shed", shed)
	}
	// The oldest strangers went; the newest is served.
	expectClosed(t, strangers[0], 5*time.Second)
	read(2)
	// Every connection proven: the newcomer is the one turned away.
	for _, s := range strangers[len(strangers)-(maxConns-1):] {
		s.Write(appendRead(nil, 1, g.grant(3), 1, spans(nil, []int{3}), false))
	}
	until(t, "every connection proven", func() bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		for s := range p.served {
			if !p.proven(s) {
				return false
			}
		}
		return len(p.served) == maxConns
	})
	shed := p.Stats().ConnsShed
	late, err := net.Dial("tcp", p.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer late.Close()
	late.Write(appendHello(nil, "late", 0, nil))
	expectClosed(t, late, 5*time.Second)
	if p.Stats().ConnsShed != shed+1 {
		t.Fatal("the newcomer was not counted")
	}
	read(4)
}

// A hello must come whole within HelloTimeout, however it trickles: a
// byte at a time, each within IOTimeout, holds the connection no longer.
func TestHelloDeadline(t *testing.T) {
	pr := newRegion(t, 8, 4096)
	p, g := gatedProducer(t, pr, TCPConfig{HelloTimeout: 200 * time.Millisecond, IOTimeout: 5 * time.Second})
	read := neighbour(t, p, pr, g)
	c, err := net.Dial("tcp", p.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	hello := appendHello(nil, string(bytes.Repeat([]byte("x"), maxNameLen)), 0, nil)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // 5 s for the whole hello
		defer wg.Done()
		tick := time.NewTicker(5 * time.Second / time.Duration(len(hello)))
		defer tick.Stop()
		for _, b := range hello {
			select {
			case <-tick.C:
			case <-stop:
				return
			}
			if _, err := c.Write([]byte{b}); err != nil {
				return
			}
		}
	}()
	defer wg.Wait()
	defer close(stop)
	c.SetReadDeadline(time.Now().Add(3 * time.Second))
	n, err := io.Copy(io.Discard, c)
	if errTimeout(err) != nil || n != 0 {
		t.Fatalf("a trickling hello kept its connection: %d bytes, %v", n, err)
	}
	read(1)
}

// A peer that floods notifications holds no more than its share of the
// queue: past it its connection waits for a drain, and is closed when none
// comes; the neighbour's completion is queued all the same.
func TestNotifFloodPaysItsOwn(t *testing.T) {
	pr := newRegion(t, 8, 4096)
	p, g := gatedProducer(t, pr, TCPConfig{IOTimeout: 500 * time.Millisecond})
	read := neighbour(t, p, pr, g)
	flood := rawConsumer(t, p)
	proveConn(t, flood, 1, g.grant()) // a stranger's would be dropped
	// Over 512 KiB of empty notifications.
	const frames = 80000
	var b []byte
	for range frames {
		b = appendNotify(b, nil)
	}
	go flood.Write(b)
	share := connNotifBytes / notifCost
	until(t, "the flood at its share", func() bool { return queuedNotifBytes(p)+notifCost > connNotifBytes })
	notif := read(1)
	until(t, "the neighbour's completion queued", func() bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		if len(p.notifs) > share+1 {
			t.Fatalf("%d notifications queued, the flood's share is %d", len(p.notifs), share)
		}
		for _, n := range p.notifs {
			if bytes.Equal(n.Msg, notif) {
				return true
			}
		}
		return false
	})
	// Nobody drains now: the flood's connection is the one closed.
	until(t, "the flooder cut", func() bool { return p.Stats().NotifCuts == 1 })
	expectClosed(t, flood, 5*time.Second)
	notif = read(2)
	waitNotifsOf(t, p, "the neighbour's next completion", func(n xfer.Notif) bool { return bytes.Equal(n.Msg, notif) })
}

// waitNotifsOf drains p until a notification matches, returning all it
// drained.
func waitNotifsOf(t *testing.T, p *TCPData, what string, match func(xfer.Notif) bool) []xfer.Notif {
	t.Helper()
	var got []xfer.Notif
	until(t, what, func() bool {
		n := len(got)
		got, _ = p.DrainNotifs(got)
		for _, m := range got[n:] {
			if match(m) {
				return true
			}
		}
		return false
	})
	return got
}

// A notification that presents a token of no live grant is dropped where
// it arrives, and counted; one of a live grant goes on.
func TestNotifOfNoGrantIsDropped(t *testing.T) {
	pr := newRegion(t, 8, 4096)
	p, g := gatedProducer(t, pr, TCPConfig{})
	read := neighbour(t, p, pr, g)
	c := rawConsumer(t, p)
	const forged = 5000
	var b []byte
	for i := range forged {
		tok := wire.Token{0: byte(i), 1: byte(i >> 8), 15: 1}
		b = appendNotify(b, wirext.AppendNotifGrant([]byte("00000000-0000-4000-8000-000000000001:h"), uint64(1<<40+i), tok))
	}
	live := g.grant(5)
	b = appendNotify(b, live)
	if _, err := c.Write(b); err != nil {
		t.Fatal(err)
	}
	got := waitNotifsOf(t, p, "the live grant's notification", func(n xfer.Notif) bool { return bytes.Equal(n.Msg, live) })
	if len(got) != 1 {
		t.Fatalf("%d notifications queued, only the live grant's should be", len(got))
	}
	if d := p.Stats().NotifDrops; d != forged {
		t.Fatalf("%d drops counted, want %d", d, forged)
	}
	notif := read(1)
	waitNotifsOf(t, p, "the neighbour's completion", func(n xfer.Notif) bool { return bytes.Equal(n.Msg, notif) })
}

// leaseGate is a testGate whose holds say the grant has left time left.
type leaseGate struct {
	*testGate
	left time.Duration
}

func (g leaseGate) Authorize(agent string, notif []byte, blocks []int) (plane.Hold, bool) {
	h, ok := g.testGate.Authorize(agent, notif, blocks)
	h.Left = g.left
	return h, ok
}

// A consumer that takes its answer slowly, yet fast enough to never stall
// it for IOTimeout, holds the grant's entry no longer than the grant's
// time left and the grace: the answer is cut and its hold released.
func TestSlowReaderCutAtGrantTime(t *testing.T) {
	const bs, blocks = 1 << 20, 48
	pr := newRegion(t, blocks, bs)
	p := newTCP(t, pr, TCPConfig{Listen: "127.0.0.1:0"}) // IOTimeout 10 s
	g := &testGate{grants: map[uint64]testGrant{}}
	g.att = p.attach(leaseGate{g, 300 * time.Millisecond})
	read := neighbour(t, p, pr, g)
	c := rawConsumer(t, p)
	c.SetDeadline(time.Time{})
	all := make([]int, blocks-2)
	for i := range all {
		all[i] = i + 2
	}
	c.Write(appendRead(nil, 1, g.grant(all...), len(all), spans(nil, all), false))
	until(t, "the answer under way", func() bool { return g.held.Load() == 1 })
	start := time.Now()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // about 1 MB/s: the socket takes bytes well within IOTimeout
		defer wg.Done()
		buf := make([]byte, 10<<10)
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-tick.C:
			case <-stop:
				return
			}
			if _, err := c.Read(buf); err != nil {
				return
			}
		}
	}()
	defer wg.Wait()
	defer close(stop)
	read(1)
	until(t, "the slow reader's hold released", func() bool { return g.held.Load() == 0 })
	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("the slow reader held the grant's entry %v", took)
	}
	if p.Stats().AnswersCut != 1 {
		t.Fatalf("%d answers cut", p.Stats().AnswersCut)
	}
	read(0)
}

// A contact with a producer that accepts the connection and never
// answers its hello fails within HelloTimeout, with an error that says so,
// instead of waiting for the caller's context.
func TestContactWelcomeDeadline(t *testing.T) {
	ln := silentListener(t)
	c := newTCP(t, newRegion(t, 8, 64), TCPConfig{HelloTimeout: 200 * time.Millisecond})
	peer, err := c.AddRemotePeer(agentMetaBytes(t, "silent", ln.Addr().String(), 64, 8, metaVersion), nil)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- tcpPlane{c}.Contact(context.Background(), peer.Agent, plane.Contact{}) }()
	select {
	case err := <-done:
		if !errors.Is(err, errNoWelcome) {
			t.Fatalf("contact: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("contact waited past its hello timeout")
	}
}

// Between two producer sessions (the last detached, the next not yet
// attached) no notification is queued: the grants it could name ended
// with the last session, and the next has none of them.
func TestNotifBetweenSessionsIsDropped(t *testing.T) {
	pr := newRegion(t, 8, 4096)
	p, g := gatedProducer(t, pr, TCPConfig{})
	c := rawConsumer(t, p)
	live := g.grant(5)
	g.att.Detach()
	drops := p.Stats().NotifDrops
	if _, err := c.Write(appendNotify(nil, live)); err != nil {
		t.Fatal(err)
	}
	poll(t, 10*time.Second, "the drop", func() bool { return p.Stats().NotifDrops > drops })
	next := attachGate(p)
	defer next.att.Detach()
	if got, _ := p.DrainNotifs(nil); len(got) != 0 {
		t.Fatalf("a notification from between the sessions reached the next: %q", got[0].Msg)
	}
}

// A link opened to send notifications alone (no READ waits on it) still
// waits for the producer's welcome no longer than the hello timeout.
func TestNotifyLinkWelcomeDeadline(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	c := newTCP(t, newRegion(t, 8, 64), TCPConfig{HelloTimeout: 200 * time.Millisecond})
	peer, err := c.AddRemotePeer(agentMetaBytes(t, "silent", ln.Addr().String(), 64, 8, metaVersion), nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Notify(peer.Agent, []byte("s:h")); err != nil {
		t.Fatal(err)
	}
	conn, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	start := time.Now()
	if _, err := io.Copy(io.Discard, conn); err != nil { // until the consumer gives up
		t.Fatalf("the consumer kept the link past 10 s: %v", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("the link waited %v for the welcome", d)
	}
}
