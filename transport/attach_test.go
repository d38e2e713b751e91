package transport

import (
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ecxfer/ecxfer/xfer"
)

// leasedGate is a testGate whose grants have a lease (plane.Leased).
type leasedGate struct {
	*testGate
	lease time.Duration
}

func (g leasedGate) Lease() time.Duration { return g.lease }

// pushConsumer is a raw consumer connection that keeps room bytes of
// pushes, proven to be consumer session 1's by a READ of block b.
func pushConsumer(t *testing.T, p *TCPData, g *testGate, room uint32, b int) net.Conn {
	t.Helper()
	conn, err := net.Dial("tcp", p.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	conn.Write(appendHello(nil, "raw", room, nil))
	if _, err := io.ReadFull(conn, make([]byte, headLen+proofLen)); err != nil {
		t.Fatal(err)
	}
	conn.Write(appendRead(nil, 1, g.grant(b), 1, spans(nil, []int{b}), false))
	rawAnswer(t, conn, 1)
	conn.SetDeadline(time.Time{})
	return conn
}

// A consumer that takes pushes slowly, yet fast enough to never stall a
// write for IOTimeout, holds the pushed grants' entries no longer than
// their lease and the grace: the push being written is cut, its
// connection closed, and every push's hold released.
func TestSlowPushReaderCutAtLease(t *testing.T) {
	const bs, blocks = 1 << 20, 40
	pr := newRegion(t, blocks, bs)
	p := newTCP(t, pr, TCPConfig{Listen: "127.0.0.1:0"}) // IOTimeout 10 s
	g := &testGate{grants: map[uint64]testGrant{}}
	g.att = p.attach(leasedGate{g, 300 * time.Millisecond})
	c := pushConsumer(t, p, g, 1<<30, 0)
	var held atomic.Int64
	start := time.Now()
	for b := 1; b < blocks; b++ {
		held.Add(1)
		if !g.att.Push(1, g.grant(b), []int{b}, func() { held.Add(-1) }) {
			held.Add(-1)
		}
	}
	if held.Load() < blocks/2 {
		t.Fatalf("only %d pushes taken", held.Load())
	}
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
	until(t, "the slow reader's pushes released", func() bool { return held.Load() == 0 })
	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("the slow reader held the pushed entries %v", took)
	}
	if p.Stats().PushesCut == 0 {
		t.Fatalf("no push counted cut: %+v", p.Stats())
	}
}

// Each attachment keeps its own list of broken READs, bounded: a READ of
// one's grant whose connection closed before its done is handed to that
// one, even after another attached, and one past the bound is counted
// lost (its grant ends at its lease).
func TestBrokenReadsPerAttachmentBounded(t *testing.T) {
	pr := newRegion(t, 8, 4096)
	p, a := gatedProducer(t, pr, TCPConfig{IOTimeout: 5 * time.Second})
	a.att.(*attachment).maxBroken = 1
	served := func(g *testGate, b int) (net.Conn, []byte) {
		notif := g.grant(b)
		conn := rawConsumer(t, p)
		conn.Write(appendRead(nil, 1, notif, 1, spans(nil, []int{b}), false))
		rawAnswer(t, conn, 1)
		return conn, notif
	}
	ca1, na1 := served(a, 1)
	ca2, _ := served(a, 2)
	b := attachGate(p) // a stays live beside it
	cb, nb := served(b, 3)
	for _, c := range []net.Conn{ca1, ca2, cb} {
		c.Close()
	}
	// A's list is not drained until both of its READs broke: its second
	// finds the list full.
	var gotA, gotB []xfer.Notif
	until(t, "the broken READs handed over", func() bool {
		gotB = b.att.Broken(gotB)
		return len(gotB) == 1 && p.Stats().BrokenLost == 1
	})
	if gotA = a.att.Broken(gotA); len(gotA) != 1 {
		t.Fatalf("the first attachment was handed %d broken READs, want 1 (the other lost)", len(gotA))
	}
	if string(gotB[0].Msg) != string(nb) {
		t.Fatalf("the successor was handed %q, want its own %q", gotB[0].Msg, nb)
	}
	if m := string(gotA[0].Msg); m == string(nb) {
		t.Fatalf("the first attachment was handed the successor's READ %q (its own: %q)", m, na1)
	}
}
