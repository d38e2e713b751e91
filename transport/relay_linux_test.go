package transport

import (
	"bytes"
	"context"
	"testing"

	"github.com/ecxfer/ecxfer/internal/faultproxy"
	"github.com/ecxfer/ecxfer/internal/plane"
	"github.com/ecxfer/ecxfer/internal/wirext"
	"github.com/ecxfer/ecxfer/wire"
	"github.com/ecxfer/ecxfer/xfer"
)

// A relay in front of this host's producer's data port, advertised at its
// own address in metadata that is otherwise the producer's, hands the
// consumer's challenge to the producer and the producer's welcome back.
// That proof names the producer's address, not the one the consumer
// dialed: the consumer never takes the relay for the region's owner,
// copies nothing out of the region, and a grant the relay made up (a live
// grant's id, a token of its own) gets none of the producer's bytes. The
// same consumer, given the producer's own metadata, copies.
func TestSameHostProofIsNotRelayed(t *testing.T) {
	if !checkAfterCopy {
		t.Skip("same-host copies are amd64's")
	}
	pr, cr := newSharedRegion(t, 8, 4096), newRegion(t, 8, 4096)
	copy(pr.Block(3), "the local producer's entry")
	p, g := gatedProducer(t, pr, TCPConfig{})
	relay, err := faultproxy.New(p.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer relay.Close()
	c := newTCP(t, cr, TCPConfig{})
	rp := contacted(t, c, forgeAddr(t, p.AgentMetadata(), relay.Addr()))
	if rp.sh == nil {
		t.Fatal("the producer's region is not mapped: nothing to prove")
	}
	if rp.sh.verified.Load() {
		t.Fatal("a relayed welcome proved the region the relay's")
	}
	live := g.grant(3)
	h, err := c.PostRead([]int{0}, rp.name, []int{3}, madeUp(t, live))
	if err != nil {
		t.Fatal(err)
	}
	if got := waitEnd(t, c, h); got == xfer.Complete || c.Stats().BoardCopies != 0 || bytes.Equal(cr.Block(0), pr.Block(3)) {
		t.Fatalf("a grant the relay made up got the producer's bytes: %v, %d copies", got, c.Stats().BoardCopies)
	}
	c.Release(h)

	hp := contacted(t, c, p.AgentMetadata())
	if hp.sh == nil || !hp.sh.verified.Load() {
		t.Fatal("the producer's own welcome did not prove its region")
	}
	h, err = c.PostRead([]int{1}, hp.name, []int{3}, live)
	if err != nil {
		t.Fatal(err)
	}
	if got := waitEnd(t, c, h); got != xfer.Complete || c.Stats().BoardCopies != 1 || !bytes.Equal(cr.Block(1), pr.Block(3)) {
		t.Fatalf("the producer itself: %v, %d copies", got, c.Stats().BoardCopies)
	}
}

// Metadata that names the producer's address and region but another
// incarnation (an earlier run's, whose /proc path another process may
// hold now) gets a proof for the producer's own incarnation, which does
// not match: the consumer reads over TCP.
func TestSameHostProofNamesTheIncarnation(t *testing.T) {
	pr, cr := newSharedRegion(t, 8, 4096), newRegion(t, 8, 4096)
	p, _ := gatedProducer(t, pr, TCPConfig{})
	m := metaOf(t, p.AgentMetadata())
	m.Incarnation = "an earlier run"
	c := newTCP(t, cr, TCPConfig{})
	pe := contacted(t, c, agentMetaBytesOf(t, m))
	if pe.sh == nil {
		t.Fatal("the producer's region is not mapped: nothing to prove")
	}
	if pe.sh.verified.Load() {
		t.Fatal("a proof for another incarnation was taken")
	}
}

// contacted registers meta with c and waits for every connection's
// welcome, returning the peer.
func contacted(t *testing.T, c *TCPData, meta []byte) *peer {
	t.Helper()
	info, err := c.AddRemotePeer(meta, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := (tcpPlane{c}).Contact(context.Background(), info.Agent, plane.Contact{}); err != nil {
		t.Fatal(err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.peers[info.Agent]
}

// madeUp is notif's grant id under a token of the relay's own.
func madeUp(t *testing.T, notif []byte) []byte {
	t.Helper()
	prefix, id, _, ok := wirext.SplitNotifGrant(notif)
	if !ok {
		t.Fatalf("no grant in %q", notif)
	}
	var tok wire.Token
	tok[0], tok[1] = 0xee, 0x11
	return wirext.AppendNotifGrant(bytes.Clone(prefix), id, tok)
}
