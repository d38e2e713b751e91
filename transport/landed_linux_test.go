package transport

import (
	"bytes"
	"fmt"
	"testing"
	"time"

	"github.com/ecxfer/ecxfer/cache"
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
	const bs, blocks = 4096, 8
	pr, cr := newSharedRegion(t, 64, bs), newRegion(t, 64, bs)
	for b := range 64 {
		for i := range pr.Block(b) {
			pr.Block(b)[i] = byte(b*13 + i)
		}
	}
	c := newTCP(t, cr, TCPConfig{})
	_, g, agent, pe := sameHost(t, c, pr)
	sh := pe.sh
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
		h, err := c.PostRead(ids(local), agent, ids(remote), g.grant(ids(remote)...))
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
	// A burst: READs posted back to back, their grants made ahead (under
	// the race detector, making one between two posts outlasts
	// fastBurst). The copy goroutine takes some, and every one lands.
	// Under the race detector a PostRead preempted on a loaded machine
	// may still outlast it: there one burst in burstTries will do.
	tries := 1
	if raceEnabled {
		tries = burstTries
	}
	for try := 0; sh.offloaded.Load() == offloaded; try++ {
		if try == tries {
			t.Fatalf("no READ of %d bursts went to the copy goroutine", tries)
		}
		var notifs [][]byte
		for i := range 6 {
			notifs = append(notifs, g.grant(ids(8*(6-i))...))
		}
		var hs []xfer.Handle
		for i := range 6 {
			h, err := c.PostRead(ids(8*i), agent, ids(8*(6-i)), notifs[i])
			if err != nil {
				t.Fatal(err)
			}
			hs = append(hs, h)
		}
		for i, h := range hs {
			if got := waitEnd(t, c, h); got != xfer.Complete {
				t.Fatalf("burst READ %d: %v", i, got)
			}
			if !bytes.Equal(cr.Span(8*i, blocks), pr.Span(8*(6-i), blocks)) {
				t.Fatalf("burst READ %d: bytes", i)
			}
			c.Release(h)
		}
	}
}

// burstTries is how many bursts TestLoneReadsAreCopiedOnTheCaller posts
// under the race detector before it gives up on one taken for a burst.
const burstTries = 200

// Closing a consumer's data plane writes the notifications of READs that
// landed before it first: one waiting for a connection that another write
// holds goes out once that write ends, instead of being dropped with the
// connection (which left the producer's grant pinned until its lease).
func TestCloseWritesQueuedNotifications(t *testing.T) {
	c, p, _, notif, release, landed := heldNotification(t)
	closed := make(chan struct{})
	go func() { c.Close(); close(closed) }()
	time.Sleep(20 * time.Millisecond) // Close under way, the writes still held
	release()
	<-closed
	if got := waitNotifs(t, p, 1); string(got[0].Msg) != string(notif) {
		t.Fatalf("notification %q, want %q", got[0].Msg, notif)
	}
	if !landed() {
		t.Fatal("bytes")
	}
}

// A burst is a step's READs, whichever producers they go to: READs
// alternating between two same-host producers, posted back to back, are
// mostly the copy goroutine's, not each copied on the caller because the
// other producer's copy came between.
func TestBurstsSpanProducers(t *testing.T) {
	const bs, blocks, step, rounds = 8 << 10, 16, 32, 10
	c := newTCP(t, newRegion(t, step*blocks, bs), TCPConfig{})
	type producer struct {
		agent string
		g     *testGate
		sh    *sharedPeer
	}
	var ps []producer
	for range 2 {
		_, g, agent, pe := sameHost(t, c, newSharedRegion(t, 8*blocks, bs))
		ps = append(ps, producer{agent, g, pe.sh})
	}
	ids := func(first int) []int {
		s := make([]int, blocks)
		for i := range s {
			s[i] = first + i
		}
		return s
	}
	offloaded := func() (n uint64) {
		for _, p := range ps {
			n += p.sh.offloaded.Load()
		}
		return n
	}
	notifs := make([][]byte, step)
	onCaller := 0
	for range rounds {
		for i := range notifs { // the grants first: the step only posts
			notifs[i] = ps[i%2].g.grant(ids(blocks * (i % 8))...)
		}
		before := offloaded()
		var hs []xfer.Handle
		for i := range step {
			h, err := c.PostRead(ids(blocks*i), ps[i%2].agent, ids(blocks*(i%8)), notifs[i])
			if err != nil {
				t.Fatal(err)
			}
			hs = append(hs, h)
		}
		onCaller += step - int(offloaded()-before)
		for _, h := range hs {
			if got := waitEnd(t, c, h); got != xfer.Complete {
				t.Fatalf("READ: %v", got)
			}
			c.Release(h)
		}
	}
	if onCaller > rounds*step/2 {
		t.Fatalf("%d of %d READs of bursts copied on the caller", onCaller, rounds*step)
	}
}

// The consumer session's own order of closing: it removes the producer's
// peer (RemoveRemotePeer), then the data plane is closed. The removal
// returns at once, and the notification still waiting for a connection is
// written before the peer's connections close.
func TestRemovingAPeerWritesQueuedNotifications(t *testing.T) {
	c, p, agent, notif, release, _ := heldNotification(t)
	if err := c.RemoveRemotePeer(agent); err != nil { // returns, the writes still held
		t.Fatal(err)
	}
	release()
	c.Close()
	if got := waitNotifs(t, p, 1); string(got[0].Msg) != string(notif) {
		t.Fatalf("notification %q, want %q", got[0].Msg, notif)
	}
}

// heldNotification lands a same-host READ while every connection of the
// consumer to its producer is busy with a write, so that its notification
// waits in the queue, or in a writer waiting for a connection, until
// release ends those writes. It returns the consumer, the producer (its
// own warm-up notifications drained), the producer's agent name, the
// notification, release, and whether the READ's bytes landed.
func heldNotification(t *testing.T) (c, p *TCPData, agent string, notif []byte, release func(), landed func() bool) {
	t.Helper()
	pr, cr := newSharedRegion(t, 8, 4096), newRegion(t, 8, 4096)
	copy(pr.Block(5), "landed")
	c = newTCP(t, cr, TCPConfig{})
	p, g, agent, pe := sameHost(t, c, pr)
	waitNotifs(t, p, 3) // warm's
	for _, l := range pe.links {
		l.wmu.Lock()
	}
	notif = g.grant(5)
	h, err := c.PostRead([]int{1}, agent, []int{5}, notif)
	if err != nil {
		t.Fatal(err)
	}
	if got := waitEnd(t, c, h); got != xfer.Complete {
		t.Fatalf("READ: %v", got)
	}
	c.Release(h)
	release = func() {
		for _, l := range pe.links {
			l.wmu.Unlock()
		}
	}
	return c, p, agent, notif, release, func() bool { return bytes.HasPrefix(cr.Block(1), []byte("landed")) }
}

// The READs of a burst that the copy goroutine landed keep their
// notifications when the consumer closes right after seeing the first
// complete (the rest of its batch still copying).
func TestCopiedBurstsNotificationsOutliveClose(t *testing.T) {
	const bs, per = 64 << 10, 32 // 2 MiB READs: the copy goroutine's
	for range 3 {
		pr, cr := newSharedRegion(t, 4*per, bs), newRegion(t, 4*per, bs)
		c := newTCP(t, cr, TCPConfig{})
		p, g, agent, _ := sameHost(t, c, pr)
		waitNotifs(t, p, 3) // warm's
		ids := func(first int) []int {
			s := make([]int, per)
			for i := range s {
				s[i] = first + i
			}
			return s
		}
		var first xfer.Handle
		var want []byte
		for i := range 4 {
			n := g.grant(ids(per * i)...)
			h, err := c.PostRead(ids(per*i), agent, ids(per*i), n)
			if err != nil {
				t.Fatal(err)
			}
			if i == 0 {
				first, want = h, n
			}
		}
		if got := waitEnd(t, c, first); got != xfer.Complete {
			t.Fatalf("READ: %v", got)
		}
		c.Close()
		found := false
		for end := time.Now().Add(5 * time.Second); !found && time.Now().Before(end); time.Sleep(time.Millisecond) {
			got, _ := p.DrainNotifs(nil)
			for _, n := range got {
				found = found || string(n.Msg) == string(want)
			}
		}
		if !found {
			t.Fatal("the notification of a READ seen complete before Close was lost")
		}
	}
}

// Close waits noteFlush at most for connections that do not take the
// notifications: busy with writes that last, they are given up on.
func TestCloseFlushIsBounded(t *testing.T) {
	pr, cr := newRegion(t, 8, 4096), newRegion(t, 8, 4096)
	p := newTCP(t, pr, TCPConfig{Listen: "127.0.0.1:0", Authorize: allowAll})
	c := newTCP(t, cr, TCPConfig{})
	peer, err := c.AddRemotePeer(p.AgentMetadata(), nil)
	if err != nil {
		t.Fatal(err)
	}
	h, _ := c.PostRead([]int{0}, peer.Agent, []int{0}, []byte("s:h"))
	waitEnd(t, c, h)
	c.mu.Lock()
	pe := c.peers[peer.Agent]
	c.mu.Unlock()
	if len(pe.links) < 2 || !pe.links[0].up() {
		t.Fatal("want two links, the first up")
	}
	// The writers held before they write (dialing), so that a notification
	// stays queued for Close, and every connection busy with a write that
	// lasts.
	for _, l := range pe.links {
		l.dial.Lock()
		l.wmu.Lock()
	}
	for i := range len(pe.links) + 1 { // as sendNotes queues them; a writer takes one each
		pe.noting.Add(1)
		pe.notes <- fmt.Appendf(nil, "s:note%d", i)
	}
	t0 := time.Now()
	closed := make(chan struct{})
	go func() { c.Close(); close(closed) }()
	var flushed time.Duration // until the peer is shut down, its flush over
	for end := time.Now().Add(3 * time.Second); time.Now().Before(end) && flushed == 0; time.Sleep(time.Millisecond) {
		if pe.stopped() {
			flushed = time.Since(t0)
		}
	}
	for _, l := range pe.links {
		l.wmu.Unlock()
		l.dial.Unlock()
	}
	<-closed
	if flushed == 0 || flushed > noteFlush+400*time.Millisecond {
		t.Fatalf("Close flushed for %v (0: over 3 s), bound %v", flushed, noteFlush)
	}
}

// A notification that comes after its peer stopped (a copy that outlasted
// the removal's flush) is counted lost, not left in a queue that no writer
// reads.
func TestNotificationsAfterTheStopAreCountedLost(t *testing.T) {
	const bs = 64 << 10
	pr, cr := newSharedRegion(t, 8, bs), newRegion(t, 8, bs)
	c := newTCP(t, cr, TCPConfig{})
	_, g, agent, pe := sameHost(t, c, pr)
	started, resume := make(chan struct{}), make(chan struct{})
	c.beforeCopy = func() { close(started); <-resume }
	ids := []int{0, 1, 2, 3}
	h, err := c.PostRead(ids, agent, ids, g.grant(ids...))
	if err != nil {
		t.Fatal(err)
	}
	<-started // the copy goroutine's (a 256 KiB READ), held
	if err := c.RemoveRemotePeer(agent); err != nil {
		t.Fatal(err)
	}
	for !pe.stopped() { // the removal's flush gave up waiting for the copy
		time.Sleep(time.Millisecond)
	}
	lost := c.Stats().NotesLost
	close(resume)
	waitEnd(t, c, h)
	for end := time.Now().Add(5 * time.Second); c.Stats().NotesLost == lost; time.Sleep(time.Millisecond) {
		if time.Now().After(end) {
			t.Fatal("the notification was not counted lost")
		}
	}
	if n := pe.noting.Load(); n != 0 || len(pe.notes) != 0 {
		t.Fatalf("%d notifications counted pending, %d queued, on a stopped peer", n, len(pe.notes))
	}
}

// sameHost connects c to a gated producer over the shared region pr, its
// region proven (warm), and returns the producer, its gate, its agent name
// and c's peer for it. Same-host copies are amd64's: elsewhere it skips.
func sameHost(t *testing.T, c *TCPData, pr *cache.Region) (*TCPData, *testGate, string, *peer) {
	t.Helper()
	if !checkAfterCopy {
		t.Skip("same-host copies are amd64's")
	}
	p, g := gatedProducer(t, pr, TCPConfig{})
	info, err := c.AddRemotePeer(p.AgentMetadata(), nil)
	if err != nil {
		t.Fatal(err)
	}
	warm(t, c, info.Agent, g)
	c.mu.Lock()
	pe := c.peers[info.Agent]
	c.mu.Unlock()
	if pe.sh == nil {
		t.Fatal("the producer's region is not mapped")
	}
	return p, g, info.Agent, pe
}
