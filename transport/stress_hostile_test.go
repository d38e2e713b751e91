package transport

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/ecxfer/ecxfer/internal/wirext"
	"github.com/ecxfer/ecxfer/wire"
	"github.com/ecxfer/ecxfer/xfer"
)

// TestStressHostile is TestStress with hostile peers beside the honest
// consumer, started at random steps: connections that send nothing, or a
// hello and then nothing; floods of notifications under made-up grants, or
// under the honest consumer's grants with wrong tokens; floods of READs of
// blocks under no grant or under another's grant with a wrong token,
// their answers read slowly or not at all; a peer holding a grant that
// takes its answer very slowly; connections opened and closed as fast as
// they go; garbage frames; connections up to and past the cap. The
// producer's bounds are small (hostileCfg), so that a seed reaches them.
//
// On top of TestStress's checks, after every step: the producer serves no
// more than MaxConns connections, no connection holds more than its share
// of the notification queue, and no notification that names a made-up
// grant or a wrong token reaches the session; every hostile READ is
// refused. At random steps and at the end an honest READ of a fresh grant
// must complete with its bytes, its notification must reach the producer
// (drained, or handed over as broken), and by then its grant must be held
// no more. At the end every hostile connection was closed by the producer
// (or by the peer), and once the consumer closed no connection keeps a
// share of the queue. Seeds as TestStress's (ECXFER_STRESS_SEEDS, ...).
func TestStressHostile(t *testing.T) {
	seeds := stressSeeds(t, "TestStressHostile$", stressHostile)
	tot := &hostileTotals
	tot.Lock()
	defer tot.Unlock()
	t.Logf("over %d seeds: %d probes, %d hostile READs refused, %d connections shed, %d notifications dropped, %d times a connection at its share, %d answers cut",
		seeds, tot.probes, tot.refused, tot.shed, tot.drops, tot.full, tot.answersCut)
	if seeds >= 8 && (tot.probes == 0 || tot.refused == 0 || tot.shed == 0 || tot.drops == 0) ||
		seeds >= 500 && (tot.full == 0 || tot.answersCut == 0) {
		t.Fatal("the seeds did not reach the bounds: the test drives nothing")
	}
}

var hostileTotals struct {
	sync.Mutex
	probes, refused, shed, drops, full, answersCut uint64
}

// The producer's bounds in this test, small enough that a seed reaches
// them within its steps.
const (
	hostileMaxConns = 16
	hostileSteps    = 120
	hostileActors   = 6 // hostile peers at once, at most
	// hostileIDs is where the made-up grant ids start: far above the
	// honest ones.
	hostileIDs = 1 << 44
	// hostileWait bounds how long a hostile connection may stay open after
	// its peer did what it came for, and how long an honest READ's
	// notification may take: far longer than the bounds need.
	hostileWait = 10 * time.Second
)

var hostileCfg = TCPConfig{
	Listen:       "127.0.0.1:0",
	IOTimeout:    time.Second,
	HelloTimeout: 100 * time.Millisecond,
	IdleTimeout:  100 * time.Millisecond,
	MaxConns:     hostileMaxConns,
}

// hostileLeft is what the producer's holds say their grant has left: an
// answer is cut a second after it.
const hostileLeft = 50 * time.Millisecond

type hostileRun struct {
	*stressRun
	wg     sync.WaitGroup
	active atomic.Int32
	slow   atomic.Bool // a slow grantee runs
	slowGr *sgrant     // its grant, ended once it is done; the main goroutine's
	mu     sync.Mutex
	addrs  map[string]bool // local addresses of the hostile connections, under mu
	// honestEnds counts the honest consumer's connections the producer
	// ended, under mu: an address it ended is a hostile peer's if one
	// dialed from it since it last ended one from there (ports are reused).
	honestEnds    int
	explainedEnds int // honestEnds when the last probe completed
	// The main goroutine's: the honest grants' tokens, the notifications
	// of honest grants drained, every served connection seen.
	tokens  map[uint64]wire.Token
	notes   map[string]int
	seen    map[*servedConn]bool
	buf     []xfer.Notif
	probes  int
	full    int // checks that found a connection at its share of the queue
	refused atomic.Uint64
}

func stressHostile(t *testing.T, seed uint64) {
	r := newStressRun(t, seed, hostileCfg, hostileLeft)
	h := &hostileRun{stressRun: r, addrs: map[string]bool{}, tokens: map[uint64]wire.Token{},
		notes: map[string]int{}, seen: map[*servedConn]bool{}}
	r.p.mu.Lock()
	r.p.connEnded = func(remote net.Addr) {
		h.mu.Lock()
		if a := remote.String(); h.addrs[a] {
			delete(h.addrs, a)
		} else {
			h.honestEnds++
		}
		h.mu.Unlock()
	}
	r.p.mu.Unlock()
	defer h.wg.Wait() // on a failure too: the peers end with their deadlines
	for step := range hostileSteps {
		h.step(step)
		r.collect(false)
		h.check()
	}
	h.end()
	r.finish()
	st := r.p.Stats()
	tot := &hostileTotals
	tot.Lock()
	tot.probes += uint64(h.probes)
	tot.refused += h.refused.Load()
	tot.shed += st.ConnsShed
	tot.drops += st.NotifDrops
	tot.full += uint64(h.full)
	tot.answersCut += st.AnswersCut
	tot.Unlock()
	t.Logf("probes %d, hostile READs refused %d, %+v", h.probes, h.refused.Load(), st)
}

// step takes one random action: a hostile peer, an honest probe, or one of
// TestStress's.
func (h *hostileRun) step(step int) {
	switch x := h.rng.IntN(100); {
	case x < 12:
		h.spawn(h.rng.IntN(8))
	case x < 16:
		h.probe()
	default:
		h.stressRun.step(step)
	}
}

// check checks the bounds, and the notifications that reached the
// producer.
func (h *hostileRun) check() {
	if h.slowGr != nil && !h.slow.Load() {
		h.gate.end(h.slowGr)
		h.slowGr = nil
	}
	h.record()
	h.p.mu.Lock()
	n := len(h.p.served)
	for s := range h.p.served {
		h.seen[s] = true
		if s.full {
			h.full++
		}
		if s.queued > connNotifBytes {
			h.p.mu.Unlock()
			h.t.Fatalf("a connection holds %d bytes of the notification queue, its share is %d", s.queued, connNotifBytes)
		}
	}
	h.p.mu.Unlock()
	if n > hostileMaxConns {
		h.t.Fatalf("%d connections served, the bound is %d", n, hostileMaxConns)
	}
	h.drain()
}

// record notes the tokens of the honest grants.
func (h *hostileRun) record() {
	h.gate.mu.Lock()
	defer h.gate.mu.Unlock()
	for id, gr := range h.gate.grants {
		h.tokens[id] = gr.token
	}
}

// drain takes the notifications that reached the producer, drained or
// handed over as broken: each names an honest grant with its token, or is
// a hostile peer's plain one (no grant: the session counts what it does
// not know).
func (h *hostileRun) drain() {
	h.buf, _ = h.p.DrainNotifs(h.buf[:0])
	h.buf = h.gate.att.Broken(h.buf)
	for _, n := range h.buf {
		_, id, tok, ok := wirext.SplitNotifGrant(n.Msg)
		if !ok {
			if !bytes.HasPrefix(n.Msg, []byte("hostile:")) {
				h.t.Fatalf("a notification no one sent: %q", n.Msg)
			}
			continue
		}
		want, known := h.tokens[id]
		switch {
		case id >= hostileIDs:
			h.t.Fatalf("a notification of made-up grant %d reached the session", id)
		case !known:
			h.t.Fatalf("a notification of grant %d, which was never made, reached the session", id)
		case tok != want:
			h.t.Fatalf("a notification of grant %d with a wrong token reached the session, from %q: %q (%s)", id, n.Agent, n.Msg, h.whoseToken(tok))
		}
		h.notes[string(n.Msg)]++
	}
	clear(h.buf)
}

// whoseToken names the honest grant whose token tok is, if any.
func (h *hostileRun) whoseToken(tok wire.Token) string {
	for id, t := range h.tokens {
		if t == tok {
			return fmt.Sprintf("grant %d's token", id)
		}
	}
	return "no honest grant's token"
}

// probe reads a fresh grant over the socket (it is not on the board, and
// not pushed), which must complete with its bytes; its notification must
// then reach the producer, and by then the grant be held no more. The
// rule a failed try must keep: a READ under a live grant is never
// refused; it fails only when the producer ended one of the honest
// consumer's connections, refused at once or shed for a newcomer (every
// peer here is on the honest consumer's host, and a host's connections
// are its own to share), or closed idle. A refused try, or one that
// failed with none of them ended since the last probe, fails the test;
// so do tries failing on and on.
func (h *hostileRun) probe() {
	const tries = 32
	// Its own source: how many tries it takes draws nothing from the seed's.
	rng := rand.New(rand.NewPCG(h.rng.Uint64(), h.rng.Uint64()))
	for range tries {
		gr := h.gate.grant(rng, 1+rng.IntN(4))
		if gr == nil {
			return // every block granted: no room for a probe
		}
		h.gate.att.Retire(gr.id)
		h.tokens[gr.id] = gr.token
		if len(gr.blocks) > len(h.free) {
			h.gate.end(gr)
			return
		}
		rng.Shuffle(len(h.free), func(i, j int) { h.free[i], h.free[j] = h.free[j], h.free[i] })
		local := slices.Clone(h.free[:len(gr.blocks)])
		hd, err := h.c.PostRead(local, h.agent, gr.blocks, gr.notif)
		if err != nil {
			h.t.Fatalf("an honest READ under grant %d could not be posted: %v", gr.id, err)
		}
		h.free = h.free[len(local):]
		rd := &stressRead{h: hd, gr: gr, local: local, remote: slices.Clone(gr.blocks)}
		h.reads = append(h.reads, rd)
		p := h.waitEnd(hd)
		if p != xfer.Complete && h.wasRefused(hd) {
			h.t.Fatalf("an honest READ under live grant %d was refused", gr.id)
		}
		if p == xfer.Complete {
			for k, b := range local {
				if !holdsBlock(h.cr.Block(b), gr.id, gr.blocks[k]) {
					h.t.Fatalf("an honest READ under grant %d: local block %d does not hold remote block %d's bytes", gr.id, b, gr.blocks[k])
				}
			}
		}
		h.release(slices.Index(h.reads, rd), false)
		if p != xfer.Complete {
			h.gate.end(gr)
			h.explained(gr.id)
			continue
		}
		h.stats[0]++
		h.probes++
		for end := time.Now().Add(hostileWait); h.notes[string(gr.notif)] == 0; time.Sleep(200 * time.Microsecond) {
			if time.Now().After(end) {
				h.t.Fatalf("an honest READ under grant %d completed, and its notification never reached the producer", gr.id)
			}
			h.drain()
		}
		h.gate.mu.Lock()
		held := gr.holds
		h.gate.mu.Unlock()
		if held != 0 {
			h.t.Fatalf("grant %d still held %d times after its notification", gr.id, held)
		}
		h.gate.end(gr)
		h.mu.Lock()
		h.explainedEnds = h.honestEnds
		h.mu.Unlock()
		return
	}
	h.t.Fatalf("%d honest READs in a row failed beside the hostile peers", tries)
}

// explained checks that the producer ended one of the honest consumer's
// connections since the last probe that completed, as a READ under live
// grant id failed: the consumer may learn of an end only as it writes the
// READ, the producer counts an end before it closes the connection, and
// the consumer may see its own close first (an idle connection's, or one
// it broke to stop a READ).
func (h *hostileRun) explained(id uint64) {
	for end := time.Now().Add(hostileWait); ; time.Sleep(200 * time.Microsecond) {
		h.mu.Lock()
		ended := h.honestEnds > h.explainedEnds
		h.mu.Unlock()
		if ended {
			return
		}
		if time.Now().After(end) {
			h.t.Fatalf("an honest READ under live grant %d failed, and the producer ended none of the honest consumer's connections", id)
		}
		h.drain() // as its owner steps: Drains read connections that bring notifications
	}
}

// wasRefused reports whether the producer refused READ hd.
func (h *hostileRun) wasRefused(hd xfer.Handle) bool {
	h.c.mu.Lock()
	op := h.c.handles[hd]
	h.c.mu.Unlock()
	return op != nil && op.refused.Load()
}

// waitEnd waits for READ hd to end.
func (h *hostileRun) waitEnd(hd xfer.Handle) xfer.Progress {
	for end := time.Now().Add(hostileWait); ; time.Sleep(100 * time.Microsecond) {
		p, err := h.c.Check(hd)
		if err != nil {
			h.t.Fatal(err)
		}
		if p != xfer.InProgress {
			return p
		}
		if time.Now().After(end) {
			h.t.Fatalf("an honest READ did not end within %v", hostileWait)
		}
	}
}

// end probes once more while the hostile peers may still run, waits for
// them (every one sees its connection closed), checks that the producer
// serves none of theirs, then closes the consumer and checks that no
// connection keeps a share of the notification queue.
func (h *hostileRun) end() {
	h.collect(true)
	for _, gr := range h.grants {
		h.gate.end(gr)
	}
	h.grants = nil
	h.probe()
	done := make(chan struct{})
	go func() { h.wg.Wait(); close(done) }()
	// Drains further apart than a stepping owner's: no connection is read
	// by them now, and the peers' connections go idle.
	tick := time.NewTicker(25 * time.Millisecond)
	defer tick.Stop()
	for waiting := true; waiting; {
		select {
		case <-done:
			waiting = false
		case <-tick.C:
		}
		h.check()
	}
	if h.t.Failed() {
		h.t.FailNow()
	}
	h.waitServed("every hostile connection gone", func(s *servedConn) bool { return !h.hostile(s) })
	h.c.Close()
	h.waitServed("every connection gone", func(*servedConn) bool { return false })
	h.check()
	h.p.mu.Lock()
	defer h.p.mu.Unlock()
	if len(h.p.notifs) != 0 {
		h.t.Fatalf("%d notifications queued with no connection left", len(h.p.notifs))
	}
	for s := range h.seen {
		if s.queued != 0 || s.full {
			h.t.Fatalf("a closed connection keeps %d bytes of the notification queue (full %v)", s.queued, s.full)
		}
	}
}

// waitServed waits until every connection the producer serves is one keep
// takes, checking the bounds meanwhile.
func (h *hostileRun) waitServed(what string, keep func(*servedConn) bool) {
	for end := time.Now().Add(hostileWait); ; time.Sleep(time.Millisecond) {
		h.check()
		h.p.mu.Lock()
		left := 0
		for s := range h.p.served {
			if !keep(s) {
				left++
			}
		}
		h.p.mu.Unlock()
		if left == 0 {
			return
		}
		if time.Now().After(end) {
			h.t.Fatalf("timed out waiting until %s: %d left", what, left)
		}
	}
}

func (h *hostileRun) hostile(s *servedConn) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.addrs[s.c.RemoteAddr().String()]
}

// The hostile peers.
const (
	peerSilent = iota
	peerHelloStall
	peerNotifyFlood
	peerReadFlood
	peerChurn
	peerGarbage
	peerCapFlood
	peerSlowGrantee
)

var peerNames = [...]string{"silent", "hello-stall", "notify-flood", "read-flood", "churn", "garbage", "cap-flood", "slow-grantee"}

// actor is one hostile peer, on its goroutine, with its own random source
// drawn from the seed's.
type actor struct {
	h      *hostileRun
	rng    *rand.Rand
	kind   int
	honest []*sgrant // the honest grants when it started: it knows their ids, not their tokens
	gr     *sgrant   // the slow grantee's own grant
}

// spawn starts a hostile peer of kind.
func (h *hostileRun) spawn(kind int) {
	// Drawn whether it starts or not (that depends on the peers still
	// running): the seed's next choices stay the same.
	a := &actor{h: h, kind: kind, rng: rand.New(rand.NewPCG(h.rng.Uint64(), h.rng.Uint64())), honest: slices.Clone(h.grants)}
	if h.active.Load() >= hostileActors {
		return
	}
	if kind == peerSlowGrantee {
		if h.slow.Load() {
			return // one at a time: its connection is proven, and never shed
		}
		// A grant made for it, of many blocks.
		if a.gr = h.gate.grant(a.rng, 32); a.gr == nil {
			return
		}
		h.gate.att.Retire(a.gr.id)
		h.tokens[a.gr.id] = a.gr.token
		h.slowGr = a.gr
		h.slow.Store(true)
	}
	if kind == peerNotifyFlood && a.rng.IntN(4) == 0 {
		// A grant of its own, to prove its connection with (a READ of
		// nothing), and then flood past its share.
		if a.gr = h.gate.grant(a.rng, 1); a.gr != nil {
			h.gate.att.Retire(a.gr.id)
			h.tokens[a.gr.id] = a.gr.token
		}
	}
	h.active.Add(1)
	h.wg.Add(1)
	go func() {
		defer h.wg.Done()
		defer h.active.Add(-1)
		if kind == peerSlowGrantee {
			defer h.slow.Store(false)
		}
		a.run()
	}()
}

// dial connects to the producer, its local address noted as hostile.
func (a *actor) dial() net.Conn { return a.dialWith(net.Dialer{Timeout: hostileWait}) }

func (a *actor) dialWith(dl net.Dialer) net.Conn {
	c, err := dl.Dial("tcp", a.h.p.Addr().String())
	if err != nil {
		a.h.t.Errorf("%s: %v", peerNames[a.kind], err)
		return nil
	}
	a.h.mu.Lock()
	a.h.addrs[c.LocalAddr().String()] = true
	a.h.mu.Unlock()
	// Nothing it does may outlast this: the wait for the close included.
	c.SetDeadline(time.Now().Add(3 * hostileWait))
	return c
}

// hello sends a hello and takes the welcome; false: the producer closed
// the connection first (shed at the cap).
func (a *actor) hello(c net.Conn) bool {
	c.Write(appendHello(nil, fmt.Sprintf("hostile-%d", a.rng.IntN(1000)), uint32(a.rng.IntN(2)<<20), nil))
	_, err := io.ReadFull(c, make([]byte, headLen+proofLen))
	return err == nil
}

// awaitClose reads until the producer closes c, which it must within
// hostileWait; then closes c.
func (a *actor) awaitClose(c net.Conn) {
	defer c.Close()
	c.SetReadDeadline(time.Now().Add(hostileWait))
	buf := make([]byte, 4096)
	for {
		_, err := c.Read(buf)
		if err == nil {
			continue
		}
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			a.h.t.Errorf("%s: the producer kept the connection open %v after the peer stopped", peerNames[a.kind], hostileWait)
		}
		return
	}
}

func (a *actor) run() {
	switch a.kind {
	case peerSilent:
		if c := a.dial(); c != nil {
			a.awaitClose(c)
		}
	case peerHelloStall:
		if c := a.dial(); c != nil {
			a.hello(c)
			a.awaitClose(c)
		}
	case peerNotifyFlood:
		a.notifyFlood()
	case peerReadFlood:
		a.readFlood()
	case peerChurn:
		a.churn()
	case peerGarbage:
		a.garbage()
	case peerCapFlood:
		a.capFlood()
	case peerSlowGrantee:
		a.slowGrantee()
	}
}

// forged is a notification under a grant the peer has no token of: a
// made-up one, or an honest grant's id with a wrong token; or, now and
// then, a plain one (no grant), which goes to the session.
func (a *actor) forged(plain bool) []byte {
	key := []byte("00000000-0000-4000-8000-000000000001:h")
	if plain {
		return fmt.Appendf(nil, "hostile:%d", a.rng.Uint64())
	}
	var tok wire.Token
	for i := range tok {
		tok[i] = byte(a.rng.Uint32() | 1)
	}
	if len(a.honest) > 0 && a.rng.IntN(2) == 0 {
		gr := a.honest[a.rng.IntN(len(a.honest))]
		if tok == gr.token {
			tok[0] ^= 2
		}
		return wirext.AppendNotifGrant(key, gr.id, tok)
	}
	return wirext.AppendNotifGrant(key, hostileIDs+a.rng.Uint64N(1<<40), tok)
}

func (a *actor) notifyFlood() {
	c := a.dial()
	if c == nil {
		return
	}
	if a.hello(c) {
		// Now and then plain ones, more than its share of the queue holds.
		n, plain := 1+a.rng.IntN(2000), 8
		var b []byte
		if a.gr != nil {
			// Proven first, by a READ of nothing under its own live grant
			// (only a proven connection's plain notifications are queued),
			// then more than its share of the queue holds.
			n, plain = 10000+a.rng.IntN(10000), 1
			b = appendRead(b, 0, a.gr.notif, 0, nil, false)
		} else if a.rng.IntN(4) == 0 {
			n, plain = 10000+a.rng.IntN(10000), 1
		}
		for range n {
			b = appendNotify(b, a.forged(a.rng.IntN(plain) == 0))
			if len(b) > 32<<10 || a.rng.IntN(64) == 0 {
				if _, err := c.Write(b); err != nil {
					break
				}
				b = b[:0]
			}
		}
		c.Write(b)
	}
	a.awaitClose(c)
}

// readFlood asks for blocks it holds no grant of, reading each answer
// (now and then slowly): every one must be a refusal.
func (a *actor) readFlood() {
	c := a.dial()
	if c == nil {
		return
	}
	defer a.awaitClose(c)
	if !a.hello(c) {
		return
	}
	n := 1 + a.rng.IntN(200)
	slow := a.rng.IntN(3) == 0
	var b []byte
	for id := range uint64(n) {
		var blocks []int
		if len(a.honest) > 0 && a.rng.IntN(2) == 0 {
			blocks = a.honest[a.rng.IntN(len(a.honest))].blocks
		} else {
			for range 1 + a.rng.IntN(8) {
				blocks = append(blocks, a.rng.IntN(stressPBlocks))
			}
		}
		b = appendRead(b, id, a.forged(a.rng.IntN(8) == 0), len(blocks), spans(nil, blocks), a.rng.IntN(4) == 0)
	}
	if _, err := c.Write(b); err != nil {
		return
	}
	ans := make([]byte, headLen+17)
	for id := range uint64(n) {
		if slow {
			time.Sleep(time.Duration(a.rng.IntN(500)) * time.Microsecond)
		}
		if _, err := io.ReadFull(c, ans); err != nil {
			return // shed at the cap
		}
		got, status, size := binary.BigEndian.Uint64(ans[headLen:]), ans[headLen+8], binary.BigEndian.Uint64(ans[headLen+9:])
		if string(ans[:4]) != frameMagic || ans[4] != frameData || got != id || status != dataRefused || size != 0 {
			a.h.t.Errorf("read-flood: READ %d of no grant answered %x", id, ans)
			return
		}
		a.h.refused.Add(1)
	}
}

// churn opens and closes connections as fast as it can, some with a
// hello or part of one.
func (a *actor) churn() {
	for range 1 + a.rng.IntN(30) {
		c := a.dial()
		if c == nil {
			return
		}
		hello := appendHello(nil, "churn", 0, nil)
		switch a.rng.IntN(3) {
		case 1:
			c.Write(hello)
		case 2:
			c.Write(hello[:a.rng.IntN(len(hello))])
		}
		c.Close()
	}
}

// garbage sends one malformed frame, before its hello or after: the
// producer must close the connection.
func (a *actor) garbage() {
	c := a.dial()
	if c == nil {
		return
	}
	defer a.awaitClose(c)
	u32 := func(b []byte, v uint32) []byte { return binary.BigEndian.AppendUint32(b, v) }
	if a.rng.IntN(4) == 0 {
		var b []byte
		switch a.rng.IntN(4) {
		case 0: // noise
			b = make([]byte, 1+a.rng.IntN(64))
			for i := range b {
				b[i] = byte(a.rng.Uint32())
			}
		case 1: // a name over maxNameLen
			b = binary.BigEndian.AppendUint16(appendHead(nil, frameHello), maxNameLen+1+uint16(a.rng.IntN(1000)))
		case 2: // a READ in place of the hello
			b = appendRead(nil, 1, a.forged(false), 1, [][2]int{{0, 1}}, false)
		case 3: // half a hello, then nothing: the hello deadline
			hello := appendHello(nil, "half", 0, nil)
			b = hello[:a.rng.IntN(len(hello))]
		}
		c.Write(b)
		return
	}
	if !a.hello(c) {
		return
	}
	var b []byte
	switch a.rng.IntN(8) {
	case 0: // bad magic
		b = append([]byte("ECX1"), frameRead)
	case 1: // a type a consumer never sends
		b = appendHead(nil, []byte{0, frameData, frameWelcome, 7, framePush, 255}[a.rng.IntN(6)])
	case 2: // a notification over maxNotifLen
		b = binary.BigEndian.AppendUint16(appendHead(nil, frameNotify), maxNotifLen+1+uint16(a.rng.IntN(1000)))
	case 3: // a READ's notification over maxNotifLen
		b = binary.BigEndian.AppendUint64(appendHead(nil, frameRead), 1)
		b = u32(binary.BigEndian.AppendUint16(b, maxNotifLen+1), 1)
	case 4: // more blocks than the region has
		b = binary.BigEndian.AppendUint64(appendHead(nil, frameRead), 1)
		b = u32(binary.BigEndian.AppendUint16(b, 0), uint32(stressPBlocks+1+a.rng.IntN(1<<30)))
	case 5: // a block outside the region
		b = appendRead(nil, 1, a.forged(false), 1, [][2]int{{stressPBlocks + a.rng.IntN(1<<20), 1}}, false)
	case 6: // dones of READs never asked, then bad magic
		for range 1 + a.rng.IntN(100) {
			b = appendDone(b, a.rng.Uint64())
		}
		b = append(b, "XXXXX"...)
	case 7: // a frame cut short, then nothing: the IO timeout
		full := appendRead(nil, 1, a.forged(false), 2, [][2]int{{0, 2}}, false)
		b = full[:1+a.rng.IntN(len(full)-1)]
	}
	c.Write(b)
}

// capFlood opens more connections than the cap at once, silent or with a
// hello, and holds them until the producer closes them.
func (a *actor) capFlood() {
	var conns []net.Conn
	for range hostileMaxConns + 1 + a.rng.IntN(8) {
		c := a.dial()
		if c == nil {
			break
		}
		if a.rng.IntN(2) == 0 {
			c.Write(appendHello(nil, "cap", 0, nil))
		}
		conns = append(conns, c)
	}
	for _, c := range conns {
		a.awaitClose(c)
	}
}

// slowGrantee holds a grant and reads its answer a little at a time,
// never confirming it. Mostly one answer, read slowly for a moment; now
// and then answers that outlast the socket's buffers, read too slowly to
// be done by the grant's time: the producer must cut the answer, and let
// go of the grant's blocks.
func (a *actor) slowGrantee() {
	reads, rate, span := 1, 1+a.rng.IntN(64), time.Duration(a.rng.IntN(100))*time.Millisecond
	dl := net.Dialer{Timeout: hostileWait}
	if a.rng.IntN(48) == 0 {
		// 16 MiB, more than the socket buffers hold (its own kept small,
		// set before the window is), at 100 KB/s: the answer that finds
		// them full takes more than the grant's time and the grace.
		reads, rate, span = 32, 1, 1300*time.Millisecond
		dl.Control = func(_, _ string, rc syscall.RawConn) error {
			return rc.Control(func(fd uintptr) { syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 64<<10) })
		}
	}
	c := a.dialWith(dl)
	if c == nil {
		return
	}
	defer a.awaitClose(c)
	if !a.hello(c) {
		return
	}
	gr := a.gr
	var b []byte
	for id := range uint64(reads) {
		b = appendRead(b, id, gr.notif, len(gr.blocks), spans(nil, gr.blocks), false)
	}
	if _, err := c.Write(b); err != nil {
		return
	}
	// rate KiB every 10 ms, for span at most.
	buf := make([]byte, rate<<10)
	for end := time.Now().Add(span); time.Now().Before(end); {
		time.Sleep(10 * time.Millisecond)
		if _, err := io.ReadFull(c, buf); err != nil {
			return // the answer cut, or the connection closed idle
		}
	}
}
