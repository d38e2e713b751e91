package transport

import (
	"bytes"
	"testing"
	"time"

	"github.com/ecxfer/ecxfer/xfer"
)

// A same-host READ is copied on the caller's goroutine unless it follows
// the previous one at once (a burst: a step that took many acks, whose
// copies the copy goroutine does while the step goes on). "At once" is
// counted from when the previous READ left the caller, its copy done: a
// loop whose fetches each end in a few tens of microseconds posts lone
// READs, each copied before PostRead returns, and none waits for the copy
// goroutine.
func TestLoneReadsAreCopiedOnTheCaller(t *testing.T) {
	if !checkAfterCopy {
		t.Skip("same-host copies are amd64's")
	}
	const bs, blocks = 4096, 8
	pr, cr := newSharedRegion(t, 64, bs), newRegion(t, 64, bs)
	for b := range 64 {
		for i := range pr.Block(b) {
			pr.Block(b)[i] = byte(b*13 + i)
		}
	}
	c := newTCP(t, cr, TCPConfig{})
	p, g := gatedProducer(t, pr, TCPConfig{})
	peer, err := c.AddRemotePeer(p.AgentMetadata(), nil)
	if err != nil {
		t.Fatal(err)
	}
	warm(t, c, peer.Agent, g)
	c.mu.Lock()
	sh := c.peers[peer.Agent].sh
	c.mu.Unlock()
	if sh == nil || !sh.verified.Load() {
		t.Fatal("the producer's region is not in use")
	}
	ids := func(first int) []int {
		s := make([]int, blocks)
		for i := range s {
			s[i] = first + i
		}
		return s
	}
	post := func(local, remote int) xfer.Handle {
		h, err := c.PostRead(ids(local), peer.Agent, ids(remote), g.grant(ids(remote)...))
		if err != nil {
			t.Fatal(err)
		}
		return h
	}
	// Lone READs: each posted 20 µs after the previous PostRead returned,
	// as a loop whose fetches take that long posts them.
	const gap = 20 * time.Microsecond
	offloaded := sh.offloaded.Load()
	returned := monoNow()
	for i := range 20 {
		for monoNow()-returned < int64(gap) {
		}
		local, remote := 8*(i%4), 8*(i%7)
		h := post(local, remote)
		if got, err := c.Check(h); err != nil || got != xfer.Complete {
			t.Fatalf("READ %d: %v, %v right after PostRead: not copied on the caller", i, got, err)
		}
		if !bytes.Equal(cr.Span(local, blocks), pr.Span(remote, blocks)) {
			t.Fatalf("READ %d: bytes", i)
		}
		c.Release(h)
		returned = monoNow()
	}
	if n := sh.offloaded.Load() - offloaded; n != 0 {
		t.Fatalf("%d lone READs went to the copy goroutine", n)
	}
	// A burst: READs posted back to back. The copy goroutine takes some,
	// and every one lands.
	var hs []xfer.Handle
	for i := range 6 {
		hs = append(hs, post(8*i, 8*(6-i)))
	}
	for i, h := range hs {
		if got := waitEnd(t, c, h); got != xfer.Complete {
			t.Fatalf("burst READ %d: %v", i, got)
		}
		if !bytes.Equal(cr.Span(8*i, blocks), pr.Span(8*(6-i), blocks)) {
			t.Fatalf("burst READ %d: bytes", i)
		}
	}
	if sh.offloaded.Load() == offloaded {
		t.Fatal("no READ of a burst went to the copy goroutine")
	}
}

// Closing a consumer's data plane writes the notifications of READs that
// landed before it first: one waiting for a connection that another write
// holds goes out once that write ends, instead of being dropped with the
// connection (which left the producer's grant pinned until its lease).
func TestCloseWritesQueuedNotifications(t *testing.T) {
	if !checkAfterCopy {
		t.Skip("same-host copies are amd64's")
	}
	pr, cr := newSharedRegion(t, 8, 4096), newRegion(t, 8, 4096)
	copy(pr.Block(5), "landed")
	c, err := NewTCPData(TCPConfig{Logger: quiet}, cr)
	if err != nil {
		t.Fatal(err)
	}
	p, g := gatedProducer(t, pr, TCPConfig{})
	peer, err := c.AddRemotePeer(p.AgentMetadata(), nil)
	if err != nil {
		t.Fatal(err)
	}
	warm(t, c, peer.Agent, g)
	waitNotifs(t, p, 3) // warm's
	c.mu.Lock()
	links := c.peers[peer.Agent].links
	c.mu.Unlock()
	// Every connection busy with a write: the notification waits in the
	// queue, or in a writer waiting for a connection.
	for _, l := range links {
		l.wmu.Lock()
	}
	notif := g.grant(5)
	h, err := c.PostRead([]int{1}, peer.Agent, []int{5}, notif)
	if err != nil {
		t.Fatal(err)
	}
	if got := waitEnd(t, c, h); got != xfer.Complete {
		t.Fatalf("READ: %v", got)
	}
	closed := make(chan struct{})
	go func() { c.Close(); close(closed) }()
	time.Sleep(20 * time.Millisecond) // Close under way, the writes still held
	for _, l := range links {
		l.wmu.Unlock()
	}
	<-closed
	got := waitNotifs(t, p, 1)
	if string(got[0].Msg) != string(notif) {
		t.Fatalf("notification %q, want %q", got[0].Msg, notif)
	}
	if !bytes.HasPrefix(cr.Block(1), []byte("landed")) {
		t.Fatal("bytes")
	}
}
