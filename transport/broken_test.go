package transport

import (
	"bytes"
	"context"
	"encoding/binary"
	"io"
	"net"
	"testing"
	"time"

	"github.com/ecxfer/ecxfer/internal/plane"
	"github.com/ecxfer/ecxfer/xfer"
)

// A READ served on a connection that closes before the consumer's done
// cannot complete: the plane hands its notification to the attachment
// whose gate granted it (Broken), and wakes the producer's loop. A READ
// confirmed (its done came) is a notification as before; a READ refused
// is neither.
func TestBrokenReadsReachTheAttachment(t *testing.T) {
	pr := newRegion(t, 8, 4096)
	p, g := gatedProducer(t, pr, TCPConfig{IOTimeout: 5 * time.Second})
	done, broken := g.grant(2), g.grant(3)
	// One connection confirms its READ: a notification, as before.
	c1 := rawConsumer(t, p)
	c1.Write(appendRead(nil, 1, done, 1, spans(nil, []int{2}), false))
	if st := rawAnswer(t, c1, 1); st != dataOK {
		t.Fatalf("status %d", st)
	}
	c1.Write(appendDone(nil, 1))
	var n []xfer.Notif
	until(t, "the confirmed READ's notification", func() bool { n, _ = p.DrainNotifs(n); return len(n) > 0 })
	if len(n) != 1 || !bytes.Equal(n[0].Msg, done) {
		t.Fatalf("notifications %+v", n)
	}
	<-p.ready
	// Another is served a READ and closes before its done; a forged READ
	// on it is refused.
	c2 := rawConsumer(t, p)
	c2.Write(appendRead(nil, 2, broken, 1, spans(nil, []int{3}), false))
	if st := rawAnswer(t, c2, 2); st != dataOK {
		t.Fatalf("status %d", st)
	}
	forged := append(bytes.Clone(broken[:len(broken)-1]), broken[len(broken)-1]^1)
	c2.Write(appendRead(nil, 3, forged, 1, spans(nil, []int{3}), false))
	if st := rawAnswer(t, c2, 3); st != dataRefused {
		t.Fatalf("forged READ: status %d", st)
	}
	if got := g.att.Broken(nil); len(got) != 0 {
		t.Fatalf("handed over while its connection is open: %+v", got)
	}
	c2.Close()
	select {
	case <-p.ready:
	case <-time.After(5 * time.Second):
		t.Fatal("the producer's loop was not woken")
	}
	got := g.att.Broken(nil)
	if len(got) != 1 || got[0].Agent != "raw" || !bytes.Equal(got[0].Msg, broken) {
		t.Fatalf("broken %+v", got)
	}
	if n, _ := p.DrainNotifs(nil); len(n) != 0 {
		t.Fatalf("a broken READ notified: %+v", n)
	}
	if g.held.Load() != 0 {
		t.Fatalf("%d holds left", g.held.Load())
	}
	if got = g.att.Broken(nil); len(got) != 0 {
		t.Fatalf("handed over twice: %+v", got)
	}
}

// rawConsumer connects to p's data port as a consumer named "raw" and
// takes the welcome.
func rawConsumer(t *testing.T, p *TCPData) net.Conn {
	t.Helper()
	conn, err := net.Dial("tcp", p.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	conn.Write(appendHello(nil, "raw", 0, nil))
	if _, err := io.ReadFull(conn, make([]byte, headLen+proofLen)); err != nil {
		t.Fatal(err)
	}
	return conn
}

// rawAnswer reads the answer to READ id, discarding its bytes, and
// returns its status.
func rawAnswer(t *testing.T, conn net.Conn, id uint64) byte {
	t.Helper()
	h := make([]byte, headLen+17)
	if _, err := io.ReadFull(conn, h); err != nil {
		t.Fatal(err)
	}
	if got := binary.BigEndian.Uint64(h[headLen:]); got != id {
		t.Fatalf("answer to %d, want %d", got, id)
	}
	if _, err := io.CopyN(io.Discard, conn, int64(binary.BigEndian.Uint64(h[headLen+9:]))); err != nil {
		t.Fatal(err)
	}
	return h[headLen+8]
}

// A detached attachment is handed nothing, and keeps nothing.
func TestBrokenReadsGoWithTheAttachment(t *testing.T) {
	pr := newRegion(t, 8, 4096)
	p, g := gatedProducer(t, pr, TCPConfig{IOTimeout: 5 * time.Second})
	notif := g.grant(2)
	conn := rawConsumer(t, p)
	conn.Write(appendRead(nil, 1, notif, 1, spans(nil, []int{2}), false))
	rawAnswer(t, conn, 1)
	g.att.Detach()
	conn.Close()
	until(t, "the connection is gone", func() bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		return len(p.served) == 0
	})
	if got := g.att.Broken(nil); len(got) != 0 {
		t.Fatalf("a detached attachment was handed %+v", got)
	}
}

// A consumer's contact (plane.Contacter) with a producer brings its
// connections up and, given the notification of a contact grant (no
// blocks), READs nothing under it on the connection pushes come on: the
// producer's gate grants it, the connection takes that consumer
// session's pushes from then on, and the READ's notification reaches the
// producer, which ends the grant.
func TestContactProvesTheConnection(t *testing.T) {
	pr, cr := newRegion(t, 8, 4096), newRegion(t, 8, 4096)
	p, g := gatedProducer(t, pr, TCPConfig{IOTimeout: 5 * time.Second})
	c := newTCP(t, cr, TCPConfig{})
	peer, err := c.AddRemotePeer(p.AgentMetadata(), nil)
	if err != nil {
		t.Fatal(err)
	}
	notif := g.grantFor(7) // no blocks
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ct := plane.ContacterOf(c)
	if ct == nil {
		t.Fatal("a TCPData has no Contacter")
	}
	if err := ct.Contact(ctx, peer.Agent, plane.Contact{Notif: notif}); err != nil {
		t.Fatal(err)
	}
	if g.asked.Load() != 1 {
		t.Fatalf("the gate was asked %d times", g.asked.Load())
	}
	a := g.att.(*attachment)
	a.mu.Lock()
	bound := len(a.pushTo[7])
	a.mu.Unlock()
	if bound != 1 {
		t.Fatalf("%d connections take the consumer session's pushes", bound)
	}
	var n []xfer.Notif
	until(t, "the contact READ's notification", func() bool { n, _ = p.DrainNotifs(n); return len(n) > 0 })
	if !bytes.Equal(n[0].Msg, notif) {
		t.Fatalf("notification %q", n[0].Msg)
	}
	c.mu.Lock()
	left := len(c.handles)
	c.mu.Unlock()
	if left != 0 || g.held.Load() != 0 {
		t.Fatalf("%d handles, %d holds left", left, g.held.Load())
	}
}
