package transport

import (
	"bytes"
	"math/rand/v2"
	"testing"
	"time"

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
	until(t, "the READ's end", func() bool {
		tcpPlane{c}.Step()
		pr, _ = c.Check(h)
		return pr != xfer.InProgress
	})
	return pr
}

// hotLink steps c until Steps read its link to agent, fetching block b
// under a fresh grant whenever they do not: the link's goroutine hands its
// connection over between frames, while its owner steps.
func hotLink(t testing.TB, c *TCPData, agent string, g *testGate, b int) *linkConn {
	t.Helper()
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
	taken := c.steps.taken.Load()

	pushed := g.grant(5, 6)
	released := make(chan struct{})
	until(t, "pushed", func() bool { // see TestPushesOnlyToProvenConnections
		return g.att.Push(1, pushed, []int{5, 6}, func() { close(released) })
	})
	<-released
	st := c.peers[agent].push
	until(t, "the push kept by a Step", func() bool {
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
	if got := c.steps.taken.Load() - taken; got != 2 {
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

	lc = hotLink(t, c, peer.Agent, g, 63)
	taken := c.steps.taken.Load()
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
	if c.steps.taken.Load() != taken {
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
	if took := time.Since(start); took < timeout || took > timeout+500*time.Millisecond {
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
	if c.steps.taken.Load() == 0 {
		t.Fatal("no frame was taken by a Step")
	}
	until(t, "every hold is given back", func() bool { return g.held.Load() == 0 })
}
