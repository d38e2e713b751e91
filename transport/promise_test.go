package transport

import (
	"bytes"
	"io"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/ecxfer/ecxfer/internal/cachex"
	"github.com/ecxfer/ecxfer/internal/faultproxy"
	"github.com/ecxfer/ecxfer/internal/wirext"
	"github.com/ecxfer/ecxfer/xfer"
)

// The data plane's promise, route by route: no block is written after the
// consumer is told it is free, a completed READ holds exactly the
// producer's bytes for its grant, and only the consumer a grant was made
// for can read it.

// pushPair is a consumer that takes pushes and a gated producer, the
// consumer's first connection up and proven to be consumer session 1's.
func pushPair(t *testing.T) (c, p *TCPData, cr, pr regionBytes, g *testGate, agent string) {
	t.Helper()
	const bs = 256
	crr, prr := newRegion(t, 16, bs), newRegion(t, 16, bs)
	for b := range 16 {
		for i := range prr.Block(b) {
			prr.Block(b)[i] = byte(b*37 + i)
		}
	}
	p, g = gatedProducer(t, prr, TCPConfig{})
	c = newTCP(t, crr, TCPConfig{Conns: 1})
	peer, err := c.AddRemotePeer(p.AgentMetadata(), nil)
	if err != nil {
		t.Fatal(err)
	}
	// A READ under a grant of session 1 proves the connection is its.
	h, _ := c.PostRead([]int{15}, peer.Agent, []int{15}, g.grant(15))
	if waitEnd(t, c, h) != xfer.Complete {
		t.Fatal("warm-up READ failed")
	}
	c.Release(h)
	return c, p, crr.Block, prr.Block, g, peer.Agent
}

type regionBytes = func(int) []byte

// A connection that names a consumer's agent in its hello, and offers to
// keep pushes, receives none of that consumer's grants: pushes go only to
// a connection that presented a token of the consumer session's grants,
// and the impostor's READs under the grant's id without its token are
// refused.
func TestPushesOnlyToProvenConnections(t *testing.T) {
	c, p, cb, pb, g, agent := pushPair(t)
	impostor, err := net.Dial("tcp", p.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer impostor.Close()
	impostor.Write(appendHello(nil, c.name, 8<<20, nil))
	// Read the impostor's connection until it shows the answer to its
	// READ, which comes after anything pushed to it before.
	got := make(chan []byte)
	go func() {
		b, _ := io.ReadAll(impostor)
		got <- b
	}()
	notif := g.grant(3, 4)
	released := make(chan struct{})
	// The answer to pushPair's READ may still hold the connection's
	// write lock (a push then waits for it, or is declined while others
	// wait): try until it is taken.
	until(t, "pushed to the consumer", func() bool {
		return g.att.Push(1, notif, []int{3, 4}, func() { close(released) })
	})
	<-released
	// The impostor tries the grant's id without its token, and a guess.
	_, id, _, _ := wirext.SplitNotifGrant(notif)
	impostor.Write(appendRead(nil, 1, []byte("00000000-0000-4000-8000-000000000001:h#"+strconv.FormatUint(id, 10)), 2, spans(nil, []int{3, 4}), false))
	impostor.Write(appendRead(nil, 2, append(bytes.Clone(notif[:len(notif)-1]), 'x'), 2, spans(nil, []int{3, 4}), false))
	until(t, "the impostor's READs are refused", func() bool { return g.asked.Load() >= 3 })
	time.Sleep(20 * time.Millisecond) // its answers are written
	impostor.Close()
	b := <-got
	if bytes.Contains(b, notif) || bytes.Contains(b, pb(3)) {
		t.Fatal("the impostor received the consumer's push")
	}
	// The real consumer's READ lands from the push, asking nothing.
	asked := g.asked.Load()
	h, _ := c.PostRead([]int{0, 1}, agent, []int{3, 4}, notif)
	if waitEnd(t, c, h) != xfer.Complete || !bytes.Equal(cb(0), pb(3)) || !bytes.Equal(cb(1), pb(4)) {
		t.Fatal("the consumer's READ")
	}
	if g.asked.Load() != asked || c.Stats().Pushed != 1 {
		t.Fatalf("the READ was asked for (pushed %d)", c.Stats().Pushed)
	}
}

// While a READ's bytes are being copied out of a same-host producer's
// region, nothing but its copier moves it: its connection breaking, its
// peer being removed, or the data plane closing leave it in progress, and
// Release waits for the copy. Canaries written into its blocks the moment
// Release returns are intact at the end.
func TestCopyOwnsItsRead(t *testing.T) {
	const bs = 64 << 10
	n := 4 * parallelCopyMin / bs // large: the peer's copy goroutine, with helpers
	pr, cr := newSharedRegion(t, n, bs), newRegion(t, n, bs)
	for i := range pr.Bytes() {
		pr.Bytes()[i] = 0x11
	}
	p, g := gatedProducer(t, pr, TCPConfig{})
	c := newTCP(t, cr, TCPConfig{})
	peer, _ := c.AddRemotePeer(p.AgentMetadata(), nil)
	warm(t, c, peer.Agent, g)
	ids := make([]int, n)
	for i := range ids {
		ids[i] = i
	}
	started, resume := make(chan struct{}), make(chan struct{})
	c.beforeCopy = func() { close(started); <-resume }
	h, err := c.PostRead(ids, peer.Agent, ids, g.grant(ids...))
	if err != nil {
		t.Fatal(err)
	}
	<-started
	c.mu.Lock()
	pe := c.peers[peer.Agent]
	c.mu.Unlock()
	for _, l := range pe.links {
		l.mu.Lock()
		l.breakLocked(errReleased)
		l.mu.Unlock()
	}
	c.RemoveRemotePeer(peer.Agent)
	if st, _ := c.Check(h); st != xfer.InProgress {
		t.Fatalf("a READ being copied moved to %v by another", st)
	}
	released := make(chan struct{})
	go func() {
		c.Release(h)
		for i := range cr.Bytes() {
			cr.Bytes()[i] = 0xa5
		}
		close(released)
	}()
	select {
	case <-released:
		t.Fatal("Release returned while the copy ran")
	case <-time.After(20 * time.Millisecond):
	}
	close(resume)
	<-released
	c.Close()
	for i, v := range cr.Bytes() {
		if v != 0xa5 {
			t.Fatalf("byte %d written after Release returned", i)
		}
	}
}

// A producer session replaced on the same data plane starts clean: the
// board shows none of the old session's grants, and a READ under one of
// them (a consumer that was slow to post it) is refused, however it comes.
func TestReplacedProducerStartsClean(t *testing.T) {
	pr, cr := newSharedRegion(t, 8, 4096), newRegion(t, 8, 4096)
	copy(pr.Block(2), "entry a")
	p, old := gatedProducer(t, pr, TCPConfig{})
	c := newTCP(t, cr, TCPConfig{})
	peer, _ := c.AddRemotePeer(p.AgentMetadata(), nil)
	warm(t, c, peer.Agent, old)
	stale := old.grant(2)
	old.att.Detach()
	fresh := attachGate(p)
	copy(pr.Block(2), "entry b")
	fresh.grant(2) // the new session's grant of the block: another id
	h, _ := c.PostRead([]int{1}, peer.Agent, []int{2}, stale)
	if got := waitEnd(t, c, h); got != xfer.Failed || bytes.HasPrefix(cr.Block(1), []byte("entry")) {
		t.Fatalf("a READ under the replaced session's grant: %v, %q", got, cr.Block(1)[:7])
	}
	// The old attachment acts on nothing any more.
	old.att.Publish(12345)
	if p.grantTab[12345%uint64(len(p.grantTab))].Load() != 0 {
		t.Fatal("a detached session published")
	}
}

// Two READs copy under their own grants; one grant ends under its copy:
// that READ fails, the other completes. A lost grant is that READ's, not
// every copy's in flight.
func TestEndedGrantFailsOnlyItsCopy(t *testing.T) {
	pr, cr := newSharedRegion(t, 8, 4096), newRegion(t, 8, 4096)
	copy(pr.Block(2), "two")
	copy(pr.Block(3), "three")
	p, g := gatedProducer(t, pr, TCPConfig{})
	c := newTCP(t, cr, TCPConfig{})
	peer, _ := c.AddRemotePeer(p.AgentMetadata(), nil)
	warm(t, c, peer.Agent, g)
	a, b := g.grant(2), g.grant(3)
	var once sync.Once
	c.beforeCopy = func() { once.Do(func() { g.end(a) }) }
	ha, _ := c.PostRead([]int{4}, peer.Agent, []int{2}, a)
	hb, _ := c.PostRead([]int{5}, peer.Agent, []int{3}, b)
	if waitEnd(t, c, ha) != xfer.Failed || waitEnd(t, c, hb) != xfer.Complete || !bytes.HasPrefix(cr.Block(5), []byte("three")) {
		t.Fatal("a grant ended under one copy failed another")
	}
}

// A consumer proves nothing and reveals nothing for a producer it cannot
// trust: metadata naming this host's producer's region, with another
// address (a producer elsewhere, say), gets that address a random
// challenge, never the region's token, and no copy out of the region: the
// READ goes over the socket to the address named.
func TestSameHostRevealsNothingToAnotherProducer(t *testing.T) {
	pr, cr := newSharedRegion(t, 8, 4096), newRegion(t, 8, 4096)
	copy(pr.Block(3), "the local producer's entry")
	p, g := gatedProducer(t, pr, TCPConfig{})
	notif := g.grant(3) // live on the local producer's board
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	meta := forgeAddr(t, p.AgentMetadata(), ln.Addr().String())
	c := newTCP(t, cr, TCPConfig{IOTimeout: 300 * time.Millisecond})
	peer, err := c.AddRemotePeer(meta, nil)
	if err != nil {
		t.Fatal(err)
	}
	hello := make(chan []byte, 1)
	go func() {
		conn, err := ln.Accept()
		if err != nil {
			return
		}
		defer conn.Close()
		b := make([]byte, 4096)
		n, _ := io.ReadAtLeast(conn, b, headLen+2)
		hello <- b[:n]
		conn.Write(appendWelcome(nil, bytes.Repeat([]byte{7}, proofLen))) // no proof
		io.Copy(io.Discard, conn)
	}()
	for range 2 {
		h, _ := c.PostRead([]int{0}, peer.Agent, []int{3}, notif)
		if got := waitEnd(t, c, h); got != xfer.Failed {
			t.Fatalf("READ: %v", got)
		}
		c.Release(h)
	}
	b := <-hello
	if bytes.Contains(b, cachex.Header(pr)[:tokenLen]) || bytes.Contains(b, cachex.Header(pr)[:8]) {
		t.Fatal("the token left for another producer")
	}
	if c.Stats().BoardCopies != 0 || bytes.Equal(cr.Block(0), pr.Block(3)) {
		t.Fatal("copied out of a region its producer did not prove")
	}
}

// A READ's deadline counts from when it reached the head of its
// connection, and a READ fails only when no byte of it moved for
// IOTimeout: READs pipelined on a slow but healthy link all land, and so
// does one whose bytes take longer than IOTimeout.
func TestDeadlinesCountProgress(t *testing.T) {
	if testing.Short() {
		t.Skip("moves 32 MiB through an 8 MB/s link: 5 s")
	}
	t.Parallel() // mostly waits: beside the other waiting tests
	const bs, mib = 1 << 20, 1 << 20
	pr, cr := newRegion(t, 16, bs), newRegion(t, 16, bs)
	for i := range pr.Bytes() {
		pr.Bytes()[i] = byte(i * 7)
	}
	p := newTCP(t, pr, TCPConfig{Listen: "127.0.0.1:0", Authorize: allowAll, IOTimeout: time.Second})
	proxy, err := faultproxy.New(p.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer proxy.Close()
	proxy.SetRate(8 * mib)
	c := newTCP(t, cr, TCPConfig{IOTimeout: time.Second, Conns: 1})
	peer, err := c.AddRemotePeer(forgeAddr(t, p.AgentMetadata(), proxy.Addr()), nil)
	if err != nil {
		t.Fatal(err)
	}
	// 8 READs of 2 MiB at 8 MB/s: the last one's bytes come 2 s after it
	// was sent.
	var hs []xfer.Handle
	for i := range 8 {
		h, err := c.PostRead([]int{2 * i, 2*i + 1}, peer.Agent, []int{2 * i, 2*i + 1}, []byte("s:m"))
		if err != nil {
			t.Fatal(err)
		}
		hs = append(hs, h)
	}
	for i, h := range hs {
		if got := waitEnd(t, c, h); got != xfer.Complete {
			t.Fatalf("pipelined READ %d: %v", i, got)
		}
		c.Release(h)
	}
	// One READ of 16 MiB: 2 s on the wire, twice IOTimeout.
	all := make([]int, 16)
	for i := range all {
		all[i] = i
	}
	clear(cr.Bytes())
	h, _ := c.PostRead(all, peer.Agent, all, []byte("s:m"))
	if got := waitEnd(t, c, h); got != xfer.Complete || !bytes.Equal(cr.Bytes(), pr.Bytes()) {
		t.Fatalf("a READ longer than IOTimeout on the wire: %v", got)
	}
}

// forgeAddr returns metadata with its address replaced.
func forgeAddr(t *testing.T, meta []byte, addr string) []byte {
	t.Helper()
	m := metaOf(t, meta)
	m.Addr = addr
	return agentMetaBytesOf(t, m)
}

func metaOf(t *testing.T, meta []byte) agentMeta {
	t.Helper()
	var m agentMeta
	if err := msgpack.Unmarshal(meta, &m); err != nil {
		t.Fatal(err)
	}
	return m
}

func agentMetaBytesOf(t *testing.T, m agentMeta) []byte {
	t.Helper()
	b, err := msgpack.Marshal(&m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// A producer that pushes what the consumer did not offer to keep, or more
// than it keeps, or a push naming blocks outside its region, loses the
// connection; the consumer's READs on it fail and nothing lands.
func TestHostilePushes(t *testing.T) {
	const bs = 256
	for name, frame := range map[string]func(room int) []byte{
		"over the room": func(room int) []byte { return appendPushHead(nil, []byte("n#1.x"), uint64(room+bs), []int{0}) },
		"over the max": func(int) []byte {
			return appendPushHead(nil, []byte("n"), maxPushSize+bs, make([]int, maxPushSize/bs+1))
		},
		"size mismatch": func(int) []byte { return appendPushHead(nil, []byte("n"), 2*bs, []int{0}) },
		"block range":   func(int) []byte { return append(appendPushHead(nil, []byte("n"), bs, []int{99}), make([]byte, bs)...) },
		"no notif":      func(int) []byte { return appendPushHead(nil, nil, bs, []int{0}) },
	} {
		t.Run(name, func(t *testing.T) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			cr := newRegion(t, 8, bs)
			for i := range cr.Bytes() {
				cr.Bytes()[i] = 0xa5
			}
			c := newTCP(t, cr, TCPConfig{IOTimeout: time.Second})
			m := metaOf(t, agentMetaBytes(t, "hostile", ln.Addr().String(), bs, 8, metaVersion))
			m.Push = true
			peer, err := c.AddRemotePeer(agentMetaBytesOf(t, m), nil)
			if err != nil {
				t.Fatal(err)
			}
			go func() {
				conn, err := ln.Accept()
				if err != nil {
					return
				}
				defer conn.Close()
				room := readHello(conn)
				conn.Write(appendWelcome(nil, nil))
				conn.Write(frame(room))
				io.Copy(io.Discard, conn)
			}()
			h, _ := c.PostRead([]int{1}, peer.Agent, []int{0}, []byte("s:m#1.0102030405060708090a0b0c0d0e0f10"))
			if got := waitEnd(t, c, h); got != xfer.Failed {
				t.Fatalf("READ: %v", got)
			}
			for i, v := range cr.Bytes() {
				if v != 0xa5 {
					t.Fatalf("byte %d landed", i)
				}
			}
		})
	}
}

// What a session installs goes with its attachment: a replaced session
// removing its notification hook (its Serve returning late) leaves the
// replacement's in place, which notifications then reach.
func TestNotifyHookBelongsToItsAttachment(t *testing.T) {
	pr, cr := newRegion(t, 8, 4096), newRegion(t, 8, 4096)
	p, old := gatedProducer(t, pr, TCPConfig{})
	old.att.OnNotify(func() bool { t.Error("the old session's hook ran"); return true })
	fresh := attachGate(p)
	called := make(chan struct{}, 8)
	fresh.att.OnNotify(func() bool { called <- struct{}{}; return true })
	old.att.OnNotify(nil)
	old.att.Detach()
	c := newTCP(t, cr, TCPConfig{})
	peer, _ := c.AddRemotePeer(p.AgentMetadata(), nil)
	h, _ := c.PostRead([]int{0}, peer.Agent, []int{1}, fresh.grant(1))
	if waitEnd(t, c, h) != xfer.Complete {
		t.Fatal("READ")
	}
	select {
	case <-called:
	case <-time.After(5 * time.Second):
		t.Fatal("the replacement's hook was not called")
	}
}

// A READ sent before its grant's push came is landed by the push, on the
// connection both share, and answered "pushed": the bytes cross once, and
// the notification still comes.
func TestPushLandsAReadSentBeforeIt(t *testing.T) {
	c, p, cb, pb, g, agent := pushPair(t)
	hold, go1 := make(chan struct{}), make(chan struct{})
	notif := g.grant(5, 6)
	g.before = func(n []byte) {
		if bytes.Equal(n, notif) {
			close(hold)
			<-go1
		}
	}
	h, _ := c.PostRead([]int{2, 3}, agent, []int{5, 6}, notif)
	<-hold // the READ is at the producer
	released := make(chan struct{})
	until(t, "pushed", func() bool { // see TestPushesOnlyToProvenConnections
		return g.att.Push(1, notif, []int{5, 6}, func() { close(released) })
	})
	<-released
	close(go1)
	if waitEnd(t, c, h) != xfer.Complete || !bytes.Equal(cb(2), pb(5)) || !bytes.Equal(cb(3), pb(6)) {
		t.Fatal("the READ")
	}
	if c.Stats().Pushed != 1 {
		t.Fatalf("landed by its push: %d", c.Stats().Pushed)
	}
	if n := waitNotifs(t, p, 2); !bytes.Equal(n[1].Msg, notif) {
		t.Fatalf("notifications %q", n)
	}
	until(t, "every hold is given back", func() bool { return g.held.Load() == 0 })
}
