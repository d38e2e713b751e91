package transport

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"testing"
	"time"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/ecxfer/ecxfer/internal/plane"
	"github.com/ecxfer/ecxfer/xfer"
)

// linkOf returns the connection of c's first link to agent, or nil.
func linkOf(c *TCPData, agent string) *linkConn {
	c.mu.Lock()
	p := c.peers[agent]
	c.mu.Unlock()
	if p == nil {
		return nil
	}
	l := p.links[0]
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.lc
}

// stepUntilEnd steps c, as a Pool's loop does, until h ends.
func stepUntilEnd(t testing.TB, c *TCPData, h xfer.Handle) xfer.Progress {
	t.Helper()
	var pr xfer.Progress
	stepping(t, "the READ's end", func() bool {
		tcpPlane{c}.Step()
		pr, _ = c.Check(h)
		return pr != xfer.InProgress
	})
	saysWhy(t, c, h, pr)
	return pr
}

// stepping is until for a loop whose cond steps a plane: at a millisecond
// a step, so that the idleDrains steps that cool a link that brings
// nothing outlast a producer slowed by a loaded machine.
func stepping(t testing.TB, what string, cond func() bool) {
	t.Helper()
	untilEvery(t, time.Millisecond, what, cond)
}

// patient keeps c's hot connections hot on a machine that pauses the
// test's goroutine for longer than coolAfter (a loaded CI runner under
// -race): only a wait, a frame, an error or idleDrains cool them.
func patient(c *TCPData) { c.links.patience.Store(int64(time.Minute)) }

// hotLink steps c until Steps read its link to agent, fetching block b
// under a fresh grant whenever they do not: the link's goroutine hands its
// connection over between frames, while its owner steps. c is patient.
func hotLink(t testing.TB, c *TCPData, agent string, g *testGate, b int) *linkConn {
	t.Helper()
	patient(c)
	var lc *linkConn
	until(t, "a hot link", func() bool {
		if lc = linkOf(c, agent); lc == nil || !lc.hot.Load() {
			h, err := c.PostRead([]int{b}, agent, []int{b}, g.grant(b))
			if err != nil {
				t.Fatal(err)
			}
			stepUntilEnd(t, c, h)
			c.Release(h)
		}
		tcpPlane{c}.Step()
		lc = linkOf(c, agent)
		return lc != nil && lc.hot.Load()
	})
	return lc
}

// While the consumer steps, its Steps take the pushes and the READ
// answers off its connection and land them, its goroutine parked: a push
// kept, a READ landed from it, a READ answered with its bytes, and their
// notifications at the producer.
func TestStepsLandPushesAndAnswers(t *testing.T) {
	c, p, cb, pb, g, agent := pushPair(t)
	lc := hotLink(t, c, agent, g, 14)
	taken := c.links.taken.Load()

	pushed := g.grant(5, 6)
	released := make(chan struct{})
	until(t, "pushed", func() bool { // see TestPushesOnlyToProvenConnections
		return g.att.Push(1, pushed, []int{5, 6}, func() { close(released) })
	})
	<-released
	st := c.peers[agent].push
	stepping(t, "the push kept by a Step", func() bool {
		tcpPlane{c}.Step()
		st.mu.Lock()
		defer st.mu.Unlock()
		return st.kept[string(pushed)] != nil && st.kept[string(pushed)].ready
	})
	h, _ := c.PostRead([]int{2, 3}, agent, []int{5, 6}, pushed)
	if pr, _ := c.Check(h); pr != xfer.Complete || !bytes.Equal(cb(2), pb(5)) || !bytes.Equal(cb(3), pb(6)) {
		t.Fatalf("the READ of a kept push: %v", pr)
	}

	asked := g.grant(7, 9)
	h2, _ := c.PostRead([]int{8, 10}, agent, []int{7, 9}, asked)
	if stepUntilEnd(t, c, h2) != xfer.Complete || !bytes.Equal(cb(8), pb(7)) || !bytes.Equal(cb(10), pb(9)) {
		t.Fatal("the READ answered")
	}
	if got := c.links.taken.Load() - taken; got != 2 {
		t.Fatalf("frames taken by Steps: %d, want the push and the answer", got)
	}
	if !lc.hot.Load() || lc != linkOf(c, agent) {
		t.Fatal("the link went cold, or was replaced")
	}
	var n []xfer.Notif
	until(t, "both notifications", func() bool {
		n, _ = p.DrainNotifs(n)
		return len(n) >= 2 && bytes.Equal(n[len(n)-1].Msg, asked)
	})
	if !bytes.Equal(n[len(n)-2].Msg, pushed) {
		t.Fatalf("notifications %q", n)
	}
	until(t, "every hold is given back", func() bool { return g.held.Load() == 0 })
}

// A consumer that waits hands its link back to the goroutine, which then
// lands READs with no Step; and an answer larger than a Step takes whole
// goes to the goroutine too, which reads it straight into the blocks.
func TestLinkCooledForWaitsAndLargeAnswers(t *testing.T) {
	const bs = 64 << 10
	crr, prr := newRegion(t, 64, bs), newRegion(t, 64, bs)
	for b := range 64 {
		for i := range prr.Block(b) {
			prr.Block(b)[i] = byte(b*31 + i>>8)
		}
	}
	p, g := gatedProducer(t, prr, TCPConfig{})
	c := newTCP(t, crr, TCPConfig{Conns: 1})
	peer, err := c.AddRemotePeer(p.AgentMetadata(), nil)
	if err != nil {
		t.Fatal(err)
	}
	lc := hotLink(t, c, peer.Agent, g, 63)

	done := tcpPlane{c}.Waiting()
	if lc.hot.Load() {
		t.Fatal("hot while its owner waits")
	}
	h, _ := c.PostRead([]int{1}, peer.Agent, []int{2}, g.grant(2))
	if waitEnd(t, c, h) != xfer.Complete || !bytes.Equal(crr.Block(1), prr.Block(2)) {
		t.Fatal("a READ while the consumer waits")
	}
	done()

	hotLink(t, c, peer.Agent, g, 63)
	taken := c.links.taken.Load()
	large := make([]int, 0, 32) // 2 MiB: over what a Step takes whole
	for b := range 32 {
		large = append(large, b)
	}
	h, _ = c.PostRead(large, peer.Agent, large, g.grant(large...))
	if stepUntilEnd(t, c, h) != xfer.Complete {
		t.Fatal("the large READ")
	}
	for _, b := range large {
		if !bytes.Equal(crr.Block(b), prr.Block(b)) {
			t.Fatalf("block %d", b)
		}
	}
	if c.links.taken.Load() != taken {
		t.Fatal("a Step took a frame larger than hotFrame")
	}
	hotLink(t, c, peer.Agent, g, 63) // and it is handed over again
}

// An answer that does not come is timed out at IOTimeout while the link
// is read by Steps: not once the Steps found nothing for idleDrains in a
// row (about a second here).
func TestHotLinkAnswerDeadline(t *testing.T) {
	const timeout = 300 * time.Millisecond
	crr, prr := newRegion(t, 8, 256), newRegion(t, 8, 256)
	p, g := gatedProducer(t, prr, TCPConfig{})
	c := newTCP(t, crr, TCPConfig{Conns: 1, IOTimeout: timeout})
	peer, err := c.AddRemotePeer(p.AgentMetadata(), nil)
	if err != nil {
		t.Fatal(err)
	}
	hotLink(t, c, peer.Agent, g, 7)
	stuck := g.grant(3)
	unblock := make(chan struct{})
	defer close(unblock)
	g.before = func(n []byte) {
		if bytes.Equal(n, stuck) {
			<-unblock
		}
	}
	start := time.Now()
	h, _ := c.PostRead([]int{3}, peer.Agent, []int{3}, stuck)
	if stepUntilEnd(t, c, h) != xfer.Failed {
		t.Fatal("a READ no one answers did not fail")
	}
	// Not before the timeout; and well before stepping's 10 s limit, which
	// a READ no deadline ended would reach (the slack is for a loaded
	// machine, not a measure of speed).
	if took := time.Since(start); took < timeout || took > timeout+3*time.Second {
		t.Fatalf("failed after %v, IOTimeout %v", took, timeout)
	}
}

// Pushes and READs of random sizes, some pushed and some asked for, land
// whole and in place while the consumer alternates stepping and waiting,
// so that its link goes back and forth between Steps and its goroutine.
func TestLinkHandOverKeepsEveryFetch(t *testing.T) {
	c, _, cb, pb, g, agent := pushPair(t)
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range 400 {
		if i%37 == 36 {
			done := tcpPlane{c}.Waiting()
			done()
		}
		n := 1 + rng.IntN(4)
		remote := rng.Perm(14)[:n]
		local := rng.Perm(15)[:n]
		notif := g.grant(remote...)
		if rng.IntN(2) == 0 {
			released := make(chan struct{})
			if g.att.Push(1, notif, remote, func() { close(released) }) {
				<-released
			}
		}
		for range rng.IntN(3) {
			tcpPlane{c}.Step()
		}
		h, err := c.PostRead(local, agent, remote, notif)
		if err != nil {
			t.Fatal(err)
		}
		if stepUntilEnd(t, c, h) != xfer.Complete {
			t.Fatalf("fetch %d failed", i)
		}
		for j := range local {
			if !bytes.Equal(cb(local[j]), pb(remote[j])) {
				t.Fatalf("fetch %d: block %d", i, local[j])
			}
		}
		c.Release(h)
	}
	if c.links.taken.Load() == 0 {
		t.Fatal("no frame was taken by a Step")
	}
	until(t, "every hold is given back", func() bool { return g.held.Load() == 0 })
}

// While Steps read the link pushes come on, a READ whose push is not in
// yet waits for the next Step rather than asking: its push, come by then,
// lands it and no READ crosses; one whose push does not come is sent at
// that Step, and from then on READs are sent at once until a push lands
// one again.
func TestReadWaitsAStepForItsPush(t *testing.T) {
	c, _, cb, pb, g, agent := pushPair(t)
	hotLink(t, c, agent, g, 14)
	asked := g.asked.Load()

	pushed := g.grant(5, 6)
	h, _ := c.PostRead([]int{2, 3}, agent, []int{5, 6}, pushed)
	released := make(chan struct{})
	until(t, "pushed", func() bool {
		return g.att.Push(1, pushed, []int{5, 6}, func() { close(released) })
	})
	<-released
	if stepUntilEnd(t, c, h) != xfer.Complete || !bytes.Equal(cb(2), pb(5)) || !bytes.Equal(cb(3), pb(6)) {
		t.Fatal("the READ its push landed")
	}
	if g.asked.Load() != asked {
		t.Fatal("a READ crossed for a pushed grant")
	}
	c.Release(h)

	unpushed := g.grant(7)
	h, _ = c.PostRead([]int{4}, agent, []int{7}, unpushed)
	if pr, _ := c.Check(h); pr != xfer.InProgress || g.asked.Load() != asked {
		t.Fatal("the READ did not wait for a Step")
	}
	if stepUntilEnd(t, c, h) != xfer.Complete || !bytes.Equal(cb(4), pb(7)) {
		t.Fatal("the READ whose push never came")
	}
	if g.asked.Load() != asked+1 || !c.peers[agent].push.missed.Load() {
		t.Fatal("not sent at the next Step, or the miss not noted")
	}
	c.Release(h)

	// After a miss, READs go at once: the producer sees this one with no
	// Step.
	h, _ = c.PostRead([]int{1}, agent, []int{9}, g.grant(9))
	until(t, "the READ at the producer", func() bool { return g.asked.Load() == asked+2 })
	if stepUntilEnd(t, c, h) != xfer.Complete || !bytes.Equal(cb(1), pb(9)) {
		t.Fatal("the READ after a miss")
	}
	until(t, "every hold is given back", func() bool { return g.held.Load() == 0 })
}

// An answer that is in the socket when a Step finds its READ past the
// deadline lands: the deadline is for answers that did not come, and a
// Step reads before it judges (a goroutine would have read it on arrival).
func TestHotLinkAnswerInTimeLands(t *testing.T) {
	const timeout = 10 * time.Second
	crr, prr := newRegion(t, 8, 256), newRegion(t, 8, 256)
	for i := range prr.Block(3) {
		prr.Block(3)[i] = byte(i + 1)
	}
	p, g := gatedProducer(t, prr, TCPConfig{})
	c := newTCP(t, crr, TCPConfig{Conns: 1, IOTimeout: timeout, PushBuffer: -1}) // READs go at once
	peer, err := c.AddRemotePeer(p.AgentMetadata(), nil)
	if err != nil {
		t.Fatal(err)
	}
	lc := hotLink(t, c, peer.Agent, g, 7)
	asked := g.asked.Load()
	h, _ := c.PostRead([]int{3}, peer.Agent, []int{3}, g.grant(3))
	// Answered: its hold ends once the bytes are out of the region. The
	// owner counts as stepping meanwhile, reading nothing.
	until(t, "the answer written", func() bool {
		c.links.drained()
		return g.asked.Load() > asked && g.held.Load() == 0
	})
	l := c.peers[peer.Agent].links[0]
	l.mu.Lock()
	l.headAt = time.Now().Add(-2 * timeout) // its deadline went by since
	l.mu.Unlock()
	if !lc.hot.Load() {
		t.Fatal("the link went cold")
	}
	if stepUntilEnd(t, c, h) != xfer.Complete || !bytes.Equal(crr.Block(3), prr.Block(3)) {
		t.Fatal("an answer that came in time failed as overdue")
	}
}

// A producer that floods a hot link with frames makes no Step long: one
// Step handles at most hotFrames of them, and the rest wait in the socket
// for the next Steps, which take every one.
func TestHotLinkFloodBoundedPerStep(t *testing.T) {
	const bs, pushes = 64, 2000
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var flood []byte
	for i := range pushes {
		flood = append(appendPushHead(flood, fmt.Appendf(nil, "s:%08d", i), bs, []int{i % 4}), make([]byte, bs)...)
	}
	start := make(chan struct{})
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		var hdr [headLen + 2]byte
		io.ReadFull(c, hdr[:])
		io.ReadFull(c, make([]byte, int(binary.BigEndian.Uint16(hdr[headLen:]))+4+challengeLen))
		c.Write(appendWelcome(nil, nil))
		<-start
		c.Write(flood)
		io.Copy(io.Discard, c)
	}()
	c := newTCP(t, newRegion(t, 4, bs), TCPConfig{Conns: 1})
	patient(c) // a flood that stalls in part on a slow machine cools nothing
	meta, _ := msgpack.Marshal(&agentMeta{Version: metaVersion, Name: "flood", Addr: ln.Addr().String(), Incarnation: "x", BlockSize: bs, Blocks: 4, Push: true})
	peer, err := c.AddRemotePeer(meta, nil)
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		tcpPlane{c}.Step()
	}
	if err := (tcpPlane{c}).Contact(context.Background(), peer.Agent, plane.Contact{}); err != nil {
		t.Fatal(err)
	}
	until(t, "a hot link", func() bool { tcpPlane{c}.Step(); return linkOf(c, peer.Agent).hot.Load() })
	close(start)
	taken := c.links.taken.Load()
	until(t, "every push taken", func() bool {
		before := c.links.taken.Load()
		tcpPlane{c}.Step()
		if n := c.links.taken.Load() - before; n > hotFrames {
			t.Fatalf("one Step took %d frames", n)
		}
		if !linkOf(c, peer.Agent).hot.Load() {
			t.Fatal("the link went cold")
		}
		return c.links.taken.Load()-taken == pushes
	})
}

// A READ that waits for the next Step ends with the plane: Close fails it
// before it returns, as it does the READs queued for its writers.
func TestCloseEndsAWaitingRead(t *testing.T) {
	c, _, _, _, g, agent := pushPair(t)
	lc := hotLink(t, c, agent, g, 14)
	h, err := c.PostRead([]int{4}, agent, []int{7}, g.grant(7))
	if err != nil {
		t.Fatal(err)
	}
	lc.smu.Lock()
	waiting := len(lc.waiting)
	lc.smu.Unlock()
	if waiting != 1 {
		t.Fatal("the READ does not wait for a Step")
	}
	c.mu.Lock()
	op := c.handles[h]
	c.mu.Unlock()
	c.Close()
	if op.state.Load() != opFailed {
		t.Fatalf("Close returned with the READ in state %d", op.state.Load())
	}
}

// A producer that floods a hot link with pushes and never answers the
// READ at its head does not keep that READ alive: it fails at IOTimeout,
// as it would with the link's goroutine reading (whole frames left for
// the next Step do not hide the deadline).
func TestHotLinkFloodDoesNotHideTheDeadline(t *testing.T) {
	const bs = 64
	const timeout = 300 * time.Millisecond
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var chunk []byte
	for i := range 256 {
		chunk = append(appendPushHead(chunk, fmt.Appendf(nil, "s:%08d", i), bs, []int{i % 4}), make([]byte, bs)...)
	}
	start, stop := make(chan struct{}), make(chan struct{})
	defer close(stop)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		var hdr [headLen + 2]byte
		io.ReadFull(c, hdr[:])
		io.ReadFull(c, make([]byte, int(binary.BigEndian.Uint16(hdr[headLen:]))+4+challengeLen))
		c.Write(appendWelcome(nil, nil))
		go io.Copy(io.Discard, c)
		<-start
		for {
			select {
			case <-stop:
				return
			default:
			}
			c.SetWriteDeadline(time.Now().Add(time.Second))
			if _, err := c.Write(chunk); err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
				return
			}
		}
	}()
	c := newTCP(t, newRegion(t, 4, bs), TCPConfig{Conns: 1, IOTimeout: timeout})
	meta, _ := msgpack.Marshal(&agentMeta{Version: metaVersion, Name: "flood", Addr: ln.Addr().String(), Incarnation: "x", BlockSize: bs, Blocks: 4, Push: true})
	peer, err := c.AddRemotePeer(meta, nil)
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		tcpPlane{c}.Step()
	}
	if err := (tcpPlane{c}).Contact(context.Background(), peer.Agent, plane.Contact{}); err != nil {
		t.Fatal(err)
	}
	until(t, "a hot link", func() bool { tcpPlane{c}.Step(); return linkOf(c, peer.Agent).hot.Load() })
	h, err := c.PostRead([]int{1}, peer.Agent, []int{1}, []byte("plain")) // no grant: asked at once
	if err != nil {
		t.Fatal(err)
	}
	close(start)
	t0 := time.Now()
	if stepUntilEnd(t, c, h) != xfer.Failed {
		t.Fatal("a READ no one answered completed")
	}
	if took := time.Since(t0); took > timeout+time.Second {
		t.Fatalf("failed after %v, IOTimeout %v", took, timeout)
	}
}

// A plane that is both a consumer and a producer: a producer's Serve,
// holding the plane for its whole run (Serving), keeps no link from the
// consumer's Steps and cools none; a loop's wait (Waiting), which may be
// the loop that steps either side, cools them all.
func TestServeKeepsLinksHot(t *testing.T) {
	c, _, cb, pb, g, agent := pushPair(t)
	serving := tcpPlane{c}.Serving()
	defer serving()
	lc := hotLink(t, c, agent, g, 14)
	again := tcpPlane{c}.Serving()
	if !lc.hot.Load() {
		t.Fatal("Serve cooled the consumer's link")
	}
	again()
	taken := c.links.taken.Load()
	asked := g.grant(7)
	h, _ := c.PostRead([]int{8}, agent, []int{7}, asked)
	if stepUntilEnd(t, c, h) != xfer.Complete || !bytes.Equal(cb(8), pb(7)) {
		t.Fatal("the READ")
	}
	if c.links.taken.Load() == taken {
		t.Fatal("its answer was not taken by a Step")
	}
	done := tcpPlane{c}.Waiting()
	defer done()
	if lc.hot.Load() {
		t.Fatal("hot while a loop waits")
	}
}

// A loop that steps both sides of a plane and waits cools the producer's
// served connections as well as the consumer's links: nothing the loop's
// steps would read is left hot while it sleeps (a READ would wait for the
// next step, or coolAfter).
func TestWaitCoolsServedConnections(t *testing.T) {
	p, g := gatedProducer(t, newRegion(t, 8, 4096), TCPConfig{})
	p.steps.patience.Store(int64(time.Minute)) // only the wait cools it
	conn, s := helloConsumer(t, p, "notifier")
	proveConn(t, conn, 1, g.grant())
	until(t, "a hot served connection", func() bool {
		if !s.hot.Load() {
			conn.Write(appendNotify(nil, []byte("warm")))
		}
		tcpPlane{p}.Step() // the loop's Pool.Step
		p.DrainNotifs(nil) // and its Producer.Step
		return s.hot.Load()
	})
	done := tcpPlane{p}.Waiting()
	defer done()
	if s.hot.Load() {
		t.Fatal("the loop waits and its served connection stays hot, read by no one")
	}
	id := uint64(100)
	if _, err := conn.Write(appendRead(nil, id, g.grant(), 0, nil, false)); err != nil {
		t.Fatal(err)
	}
	if st := rawAnswer(t, conn, id); st != dataOK { // by its goroutine
		t.Fatalf("status %d", st)
	}
}

// A READ's end and a notification each wake both a Pool's loop
// (ConsumerReady) and a Producer's (Ready), on channels of their own: one
// loop may step both sides, and two loops on one plane take none of each
// other's wake-ups. Serve's (ServeReady) hears notifications alone: its
// goroutine steps no consumer.
func TestEveryEventWakesBothLoops(t *testing.T) {
	c, p, cb, pb, g, agent := pushPair(t)
	for _, d := range []*TCPData{c, p} {
		for _, ch := range []chan struct{}{d.ready, d.cready, d.sready} {
			select {
			case <-ch:
			default:
			}
		}
	}
	woken := func(what string, ch chan struct{}) {
		t.Helper()
		select {
		case <-ch:
		case <-time.After(10 * time.Second):
			t.Fatalf("%s woke no %s", what, "loop")
		}
	}
	asked := g.grant(7)
	h, _ := c.PostRead([]int{8}, agent, []int{7}, asked)
	woken("the READ's end", c.cready)
	woken("the READ's end", c.ready)
	if pr, _ := c.Check(h); pr != xfer.Complete || !bytes.Equal(cb(8), pb(7)) {
		t.Fatalf("the READ: %v", pr)
	}
	woken("its notification", p.ready)
	woken("its notification", p.cready)
	woken("its notification", p.sready)
	select {
	case <-c.sready:
		t.Fatal("a READ's end woke Serve")
	default:
	}
}
