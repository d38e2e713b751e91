package transport

import (
	"bytes"
	"fmt"
	"net"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/ecxfer/ecxfer/xfer"
)

// boardPair is a producer over a Shared region, its grant board claimed,
// and a consumer that registered it. Blocks of the producer hold their id
// in every byte.
func boardPair(t *testing.T, blocks, bs int) (c, p *TCPData, agent string, authorized *atomic.Int64) {
	t.Helper()
	pr, cr := newSharedRegion(t, blocks, bs), newRegion(t, blocks, bs)
	for b := range blocks {
		for i := range pr.Block(b) {
			pr.Block(b)[i] = byte(b)
		}
	}
	p = newTCP(t, pr, TCPConfig{Listen: "127.0.0.1:0"})
	authorized = new(atomic.Int64)
	p.SetAuthorizer(func(string, []byte, []int) (func(), bool) {
		authorized.Add(1)
		return func() {}, true
	})
	if !p.ClaimGrantBoard() {
		t.Fatal("the board of a Shared region without a gate of the caller's was not claimed")
	}
	c = newTCP(t, cr, TCPConfig{Name: "cons"})
	peer, err := c.AddRemotePeer(p.AgentMetadata(), nil)
	if err != nil {
		t.Fatal(err)
	}
	return c, p, peer.Agent, authorized
}

// waitNotifs drains p until it has n notifications, or fails after 5 s.
func waitNotifs(t *testing.T, p *TCPData, n int) []xfer.Notif {
	t.Helper()
	var got []xfer.Notif
	deadline := time.Now().Add(5 * time.Second)
	for len(got) < n {
		got, _ = p.DrainNotifs(got)
		if time.Now().After(deadline) {
			t.Fatalf("%d notifications of %d", len(got), n)
		}
		time.Sleep(time.Millisecond)
	}
	return got
}

// One session claims the board at a time; a gate of the caller's turns it
// off, and so does a region that is not Shared.
func TestGrantBoardClaim(t *testing.T) {
	p := newTCP(t, newSharedRegion(t, 4, 4096), TCPConfig{Listen: "127.0.0.1:0"})
	if !p.ClaimGrantBoard() || p.ClaimGrantBoard() {
		t.Fatal("the board was not claimed exactly once")
	}
	p.PublishGrant(7)
	p.ReleaseGrantBoard()
	if p.grantTab[7%uint64(len(p.grantTab))].Load() != 0 {
		t.Fatal("a released board still shows a grant")
	}
	if !p.ClaimGrantBoard() {
		t.Fatal("a released board cannot be claimed again")
	}
	gated := newTCP(t, newSharedRegion(t, 4, 4096), TCPConfig{Listen: "127.0.0.1:0", Authorize: allowAll})
	plain := newTCP(t, newRegion(t, 4, 4096), TCPConfig{Listen: "127.0.0.1:0"})
	if gated.ClaimGrantBoard() || plain.ClaimGrantBoard() {
		t.Fatal("a board with a gate of the caller's, or over a region not Shared")
	}
}

// A READ under a published grant is copied without asking the producer
// (its gate is never called) and notified; one whose grant is not
// published goes through the gate.
func TestGrantBoardCopies(t *testing.T) {
	c, p, agent, authorized := boardPair(t, 8, 4096)
	p.PublishGrant(5)
	h, err := c.PostRead([]int{0, 1}, agent, []int{6, 7}, []byte("s:m#5"))
	if err != nil {
		t.Fatal(err)
	}
	if got := waitEnd(t, c, h); got != xfer.Complete {
		t.Fatalf("READ under a published grant: %v", got)
	}
	if c.cr(0) != 6 || c.cr(1) != 7 || c.fastCopies.Load() != 1 || authorized.Load() != 0 {
		t.Fatalf("blocks %d %d, fast copies %d, gate called %d times", c.cr(0), c.cr(1), c.fastCopies.Load(), authorized.Load())
	}
	n := waitNotifs(t, p, 1)
	if string(n[0].Msg) != "s:m#5" || n[0].Agent != "cons" {
		t.Fatalf("notification %q from %q", n[0].Msg, n[0].Agent)
	}
	// Not published (another id in its slot, or none): asked per READ.
	for _, notif := range []string{"s:m#6", "s:m", fmt.Sprintf("s:m#%d", 5+len(p.grantTab))} {
		h, err := c.PostRead([]int{2}, agent, []int{3}, []byte(notif))
		if err != nil {
			t.Fatal(err)
		}
		if got := waitEnd(t, c, h); got != xfer.Complete || c.cr(2) != 3 {
			t.Fatalf("READ %q: %v", notif, got)
		}
	}
	if c.fastCopies.Load() != 1 || authorized.Load() != 3 {
		t.Fatalf("fast copies %d, gate called %d times", c.fastCopies.Load(), authorized.Load())
	}
}

func (d *TCPData) cr(b int) byte { return d.region.Block(b)[0] }

// A grant retired while its blocks are copied fails the READ, and nothing
// is notified: the producer may have handed the blocks to another entry.
func TestGrantBoardRetiredMidCopy(t *testing.T) {
	c, p, agent, authorized := boardPair(t, 8, 4096)
	p.PublishGrant(9)
	c.beforeCopy = func() { p.RetireGrant(9) }
	h, err := c.PostRead([]int{0}, agent, []int{1}, []byte("s:m#9"))
	if err != nil {
		t.Fatal(err)
	}
	if got := waitEnd(t, c, h); got != xfer.Failed {
		t.Fatalf("READ whose grant was retired mid-copy: %v", got)
	}
	c.beforeCopy = nil
	// Retired before: asked per READ.
	h, _ = c.PostRead([]int{0}, agent, []int{1}, []byte("s:m#9"))
	if got := waitEnd(t, c, h); got != xfer.Complete || authorized.Load() != 1 {
		t.Fatalf("READ after the grant retired: %v, gate called %d times", got, authorized.Load())
	}
	time.Sleep(50 * time.Millisecond)
	if n := waitNotifs(t, p, 1); len(n) != 1 {
		t.Fatalf("notifications %v: only the per-READ one was due", n)
	}
}

// READs posted in a burst, and a large one, are copied by the precopier;
// every byte lands, and every notification comes.
func TestGrantBoardBurst(t *testing.T) {
	const bs = 4096
	big := precopyMin / bs
	c, p, agent, authorized := boardPair(t, 2*big+16, bs)
	var hs []xfer.Handle
	for i := range 16 {
		g := uint64(100 + i)
		p.PublishGrant(g)
		h, err := c.PostRead([]int{i}, agent, []int{big + i}, fmt.Appendf(nil, "s:m%d#%d", i, g))
		if err != nil {
			t.Fatal(err)
		}
		hs = append(hs, h)
	}
	local, remote := make([]int, big), make([]int, big)
	for i := range big {
		local[i], remote[i] = 16+i, big+16+i
	}
	p.PublishGrant(200)
	h, err := c.PostRead(local, agent, remote, []byte("s:big#200"))
	if err != nil {
		t.Fatal(err)
	}
	hs = append(hs, h)
	for _, h := range hs {
		if got := waitEnd(t, c, h); got != xfer.Complete {
			t.Fatalf("READ %d: %v", h, got)
		}
	}
	for i := range 16 + big {
		want := byte(big + i)
		if i >= 16 {
			want = byte(big + 16 + (i - 16))
		}
		if !bytes.Equal(c.region.Block(i), bytes.Repeat([]byte{want}, bs)) {
			t.Fatalf("block %d", i)
		}
	}
	if c.fastCopies.Load() != 17 || authorized.Load() != 0 {
		t.Fatalf("fast copies %d, gate called %d times", c.fastCopies.Load(), authorized.Load())
	}
	waitNotifs(t, p, 17)
}

// A notify frame is taken only from a consumer that proved it maps the
// region (hello2); anyone else is cut off.
func TestNotifyNeedsHello2(t *testing.T) {
	pr := newSharedRegion(t, 4, 4096)
	p := newTCP(t, pr, TCPConfig{Listen: "127.0.0.1:0"})
	for _, hello := range [][]byte{appendHello(nil, "plain"), appendHello2(nil, "shm", pr.Header()[:tokenLen])} {
		conn, err := net.Dial("tcp", p.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		conn.Write(hello)
		conn.Write(appendNotify(nil, []byte("s:m#1")))
		conn.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
		_, err = conn.Read(make([]byte, 1))
		conn.Close()
		shared := hello[4] == frameHello2
		if shared != (errTimeout(err) != nil) {
			t.Fatalf("hello2 %v: read after a notify: %v", shared, err)
		}
	}
	n := waitNotifs(t, p, 1)
	if len(n) != 1 || n[0].Agent != "shm" {
		t.Fatalf("notifications %v", n)
	}
}

// The grant table lies in the header the metadata advertises; a consumer
// refuses metadata whose table would run past the blocks' offset.
func TestGrantTableInHeader(t *testing.T) {
	pr := newSharedRegion(t, 4, 4096)
	p := newTCP(t, pr, TCPConfig{Listen: "127.0.0.1:0"})
	tab := unsafe.Pointer(unsafe.SliceData(p.grantTab))
	if uintptr(tab) != uintptr(unsafe.Pointer(&pr.Header()[grantTabOff])) ||
		grantTabOff+8*len(p.grantTab) > len(pr.Header()) {
		t.Fatal("the grant table is not inside the header")
	}
	// One slot too many, and a count whose size overflows.
	for _, slots := range []int{len(p.grantTab) + 1, 1 << 61, -1} {
		c := newTCP(t, newRegion(t, 4, 4096), TCPConfig{})
		m := agentMeta{Version: metaVersion, Name: "x", Addr: p.Addr().String(), Incarnation: "i", BlockSize: 4096, Blocks: 4,
			Shm: pr.SharedPath(), ShmOff: len(pr.Header()), Grants: slots}
		meta, _ := encodeMeta(m)
		if _, err := c.AddRemotePeer(meta, nil); err != nil {
			t.Fatal(err) // not mapped, read over TCP
		}
		c.mu.Lock()
		for _, pe := range c.peers {
			if pe.shm != nil || pe.grantTab != nil {
				t.Fatalf("%d slots: a table past the header was mapped", slots)
			}
		}
		c.mu.Unlock()
	}
}

// OnNotify's function runs where notifications arrive, at most once per
// notification (once for a burst read at once); Ready is signalled only
// when it did not take them, or none is installed.
func TestOnNotify(t *testing.T) {
	for _, take := range []bool{true, false} {
		c, p, agent, _ := boardPair(t, 8, 4096)
		var calls atomic.Int64
		p.OnNotify(func() bool { calls.Add(1); return take })
		for i := range 4 {
			g := uint64(10 + i)
			p.PublishGrant(g)
			h, err := c.PostRead([]int{i}, agent, []int{i}, fmt.Appendf(nil, "s:m%d#%d", i, g))
			if err != nil {
				t.Fatal(err)
			}
			if got := waitEnd(t, c, h); got != xfer.Complete {
				t.Fatalf("READ %d: %v", i, got)
			}
		}
		deadline := time.Now().Add(5 * time.Second)
		for {
			p.mu.Lock()
			n := len(p.notifs)
			p.mu.Unlock()
			if n == 4 && calls.Load() > 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("take %v: %d notifications, %d calls", take, n, calls.Load())
			}
			time.Sleep(time.Millisecond)
		}
		time.Sleep(20 * time.Millisecond) // a late signal would show
		signalled := false
		select {
		case <-p.Ready():
			signalled = true
		default:
		}
		if n := calls.Load(); n > 4 || signalled == take {
			t.Fatalf("take %v: %d calls for 4 notifications, signalled %v", take, n, signalled)
		}
	}
}
