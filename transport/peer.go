package transport

import (
	"context"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ecxfer/ecxfer/internal/wirext"
)

// peer is a producer this agent reads from: a few connections (links),
// each with a writer goroutine taking READs from the peer's queue and a
// reader goroutine taking the answers in order. Several connections let
// the producer's writes and our reads of different READs run on different
// cores.
type peer struct {
	d      *TCPData
	name   string
	addr   string
	blocks int
	refs   int // registrations, under d.mu
	links  []*link
	queue  chan *readOp // READs for the links' writers to send
	firstq chan *readOp // READs that must go on the first link (see viaFirst)
	notes  chan []byte  // notify frames for the links' writers
	noting atomic.Int32 // notifications put in notes and not yet written (or lost)
	stop   chan struct{}
	dials  context.Context // ends with stop: a dial in progress is cut short
	cancel context.CancelFunc
	once   sync.Once
	// hmu orders hand-offs before the stop: a READ goes to a goroutine's
	// channel only under it, while p is not stopped, and shutdown closes
	// stop under it, so every READ handed off is in a channel before its
	// goroutine's last look at it, and none is stranded there.
	hmu sync.Mutex
	// inflight counts READs posted and not ended: at most MaxQueued, so
	// that a producer that stops answering cannot make them pile up.
	inflight atomic.Int64

	sh   *sharedPeer // the producer's region, mapped (same host), or nil
	push *stage      // pushes kept for READs, or nil (the producer does not push to us)
	// readers counts the goroutines that may read the mapped region; it
	// is unmapped once they are gone.
	readers sync.WaitGroup

	// Tests: sentHook runs as a READ's state moved to sent, its frame not
	// yet written (under its link's mu); pushHook runs as a push is about
	// to be matched with the READ asked for it, or kept.
	sentHook atomic.Pointer[func(*readOp)]
	pushHook atomic.Pointer[func()]
}

// The ways a READ can go (route).
const (
	viaSocket  = iota // a READ frame, answered with the bytes
	viaFirst          // the same, on the link pushes come on: its push may land it
	viaAwait          // the same, once the next Step found no push for it (see await)
	viaPush           // landed from a push kept for it, now (the caller copies)
	viaPushing        // landed from a push still arriving, by the link's reader
	viaBoard          // copied from the producer's region under a published grant, now
	viaCopier         // the same, by the peer's copy goroutine
)

func newPeer(d *TCPData, m agentMeta, key string) *peer {
	p := &peer{d: d, name: key, addr: m.Addr, blocks: m.Blocks,
		queue: make(chan *readOp, 2*d.cfg.MaxQueued), firstq: make(chan *readOp, 2*d.cfg.MaxQueued),
		notes: make(chan []byte, 256), stop: make(chan struct{})}
	p.dials, p.cancel = context.WithCancel(context.Background())
	if m.Shm != "" && !d.cfg.NoSharedMemory {
		sh, err := d.mapShared(m)
		if err != nil {
			// Another host, another user, or no /proc: TCP it is.
			d.log.Debug("ec data: producer's region not mapped, reading over TCP", "peer", key, "err", err)
		} else {
			p.sh = sh
			p.startShared()
		}
	}
	if m.Push && p.sh == nil && d.cfg.PushBuffer > 0 {
		p.push = newStage(d.cfg.PushBuffer)
		d.pushPeers.Add(1)
	}
	for i := range d.cfg.Conns {
		l := &link{p: p, first: i == 0}
		p.links = append(p.links, l)
		d.wg.Add(1)
		go l.writer()
	}
	return p
}

// route decides how op lands; called with d.mu, so that p is not shut
// down meanwhile.
func (p *peer) route(op *readOp) int {
	if p.push != nil && grantOf(op.notif) != 0 {
		st, ready, resend := p.push.claim(op)
		op.resend = resend
		if st != nil {
			if ready {
				op.staged = st
				return viaPush
			}
			return viaPushing
		}
		if op.n*p.d.region.BlockSize() <= maxPushSize {
			// Its push may be on its way behind the ack: sent where pushes
			// come, the push lands it when it comes, and the producer
			// answers that it pushed. While Steps read that link, and
			// pushes came for the READs that waited for them, the READ
			// waits for the next Step instead (await); not in a burst,
			// whose grants a Go producer does not push.
			if lc := p.links[0].hotConn(); lc != nil && !p.push.missed.Load() && p.inflight.Load() <= pushedInFlight {
				return viaAwait
			}
			return viaFirst
		}
	}
	if p.sh != nil {
		if way := p.sh.route(op); way != viaSocket {
			p.readers.Add(1) // until the copy is done
			return way
		}
	}
	return viaSocket
}

// start sends op on its way (route's), on the caller's goroutine.
func (p *peer) start(op *readOp, way int) {
	switch way {
	case viaPush:
		st := op.staged
		op.staged = nil
		p.landStaged(op, st)
	case viaPushing: // the reader that takes the push lands it
	case viaBoard:
		claimed, live := p.boardCopy(op)
		p.readers.Done()
		if claimed {
			if live {
				p.sendNotes([][]byte{op.notif})
			}
			op.land(grantLive(live))
		}
	case viaCopier:
		if !p.handOff(p.sh.copies, op) {
			p.sh.queued.Add(-1)
			p.readers.Done()
			op.fail(errStopped)
		}
	case viaAwait:
		if lc := p.links[0].hotConn(); lc == nil || !lc.await(op) {
			p.sendFirst(op)
		}
	case viaFirst:
		p.sendFirst(op)
	default:
		if !p.tryPost(op) && !p.handOff(p.queue, op) {
			op.fail(errStopped)
		}
	}
}

// pushedInFlight is the most READs in flight to a producer for which a
// Go producer pushes grants (session's maxPushLive: its consumer
// session's live grants).
const pushedInFlight = 2

// sendFirst sends op's READ on the link pushes come on.
func (p *peer) sendFirst(op *readOp) {
	if !p.links[0].tryPost(op) && !p.handOff(p.firstq, op) {
		op.fail(errStopped)
	}
}

// handOff puts op in ch, a channel of one of p's goroutines, unless p is
// shut down (see hmu). A READ released (or landed by a push) while it
// waits in ch keeps its place there until a writer takes it, which a dial
// that hangs delays for DialTimeout: so ch holds 2*MaxQueued, and when it
// is full, the READs that ended are dropped from it. At most MaxQueued in
// it are still to be sent (inflight), so that frees MaxQueued places at
// least: a full ch costs each READ posted O(1), and one posted within
// MaxQueued always finds a place. Only the writers' queues are: the copy
// goroutine accounts for each READ it takes (and route keeps its channel
// from filling).
func (p *peer) handOff(ch chan *readOp, op *readOp) bool {
	p.hmu.Lock()
	defer p.hmu.Unlock()
	if p.stopped() {
		return false
	}
	if len(ch) == cap(ch) && (ch == p.queue || ch == p.firstq) {
		dropEnded(ch)
	}
	select {
	case ch <- op:
		return true
	default:
		return false
	}
}

// dropEnded takes the READs that are no longer queued out of ch, keeping
// the others in order. Called under hmu: no one else puts a READ in ch
// meanwhile, so those put back find room (a writer may take some of them
// first, which changes nothing).
func dropEnded(ch chan *readOp) {
	var keep []*readOp
	for range len(ch) {
		select {
		case op := <-ch:
			if op.state.Load() == opQueued {
				keep = append(keep, op)
			}
		default:
		}
	}
	for _, op := range keep {
		ch <- op
	}
}

// ended gives op's place in the in-flight bound back (once: every READ
// reaches one final state) and, unless it was released, wakes the loop.
func (p *peer) ended(_ *readOp, signal bool) {
	p.inflight.Add(-1)
	if signal {
		p.d.signal()
	}
}

// shutdown stops the peer's goroutines and fails its READs. Called with d.mu.
func (p *peer) shutdown(err error) {
	p.once.Do(func() {
		p.hmu.Lock()
		close(p.stop)
		p.hmu.Unlock()
		p.cancel()
		for _, l := range p.links {
			l.mu.Lock()
			l.breakLocked(err)
			l.mu.Unlock()
		}
		if p.push != nil {
			p.push.shutdown()
			p.d.pushPeers.Add(-1)
		}
		if p.sh != nil {
			// No reader starts after the loop above (connect checks stop
			// under l.mu, copies start under d.mu); the mapping goes once
			// the last one left.
			p.d.wg.Add(1)
			go func() {
				defer p.d.wg.Done()
				p.readers.Wait()
				p.sh.unmap()
			}()
		}
	})
}

// stopped reports whether the peer was shut down.
func (p *peer) stopped() bool {
	select {
	case <-p.stop:
		return true
	default:
		return false
	}
}

// grantOf returns the grant id a Go consumer's notification names, or 0.
func grantOf(notif []byte) uint64 {
	if _, g, tok, ok := wirext.SplitNotifGrant(notif); ok && !tok.IsZero() {
		return g
	}
	return 0
}

// sendNotes sends the notifications of READs that landed without a READ
// frame, on a link no one is writing to when there is one (in one write),
// else through the writers. One that cannot be sent is lost, as a data
// plane's notification may be: the producer's lease ends the grant.
func (p *peer) sendNotes(notes [][]byte) {
	if p.tryNotes(notes) {
		return
	}
	// Under hmu, as hand-offs: once the peer is stopped, no writer takes
	// them (see writer).
	p.hmu.Lock()
	defer p.hmu.Unlock()
	if p.stopped() {
		p.d.notesLost.Add(uint64(len(notes)))
		return
	}
	for _, n := range notes {
		p.noting.Add(1) // until a writer, or flushNotes, wrote it
		select {
		case p.notes <- n:
		default:
			p.noting.Add(-1)
			p.d.notesLost.Add(1)
		}
	}
}

// noteFlush bounds how long a peer that is closed or removed waits for
// its producer's connection to take the notifications still to be written.
const noteFlush = 500 * time.Millisecond

// retire shuts p down, once the notifications of READs that landed are
// written (or noteFlush passed): at once when none is waiting, else on a
// goroutine of the plane's, so that the caller (an engine's step) never
// waits. p is no longer reachable: no READ is posted to it meanwhile.
func (p *peer) retire(err error) {
	if p.notesDone() {
		p.shutdown(err)
		return
	}
	p.d.wg.Add(1)
	go func() {
		defer p.d.wg.Done()
		p.flushNotes(time.Now().Add(noteFlush))
		p.shutdown(err)
	}()
}

// notesDone reports, without waiting, that no notification of p's is
// waiting to be written: none with the copy goroutine, none queued or with
// a writer, no write under way.
func (p *peer) notesDone() bool {
	// The copy goroutine's first: it counts a notification in noting
	// before it stops counting the READ in queued.
	return (p.sh == nil || p.sh.queued.Load() <= 0) && p.noting.Load() <= 0 && p.writesIdle()
}

// writesIdle reports that no link has a write under way.
func (p *peer) writesIdle() bool {
	for _, l := range p.links {
		if !l.wmu.TryLock() {
			return false
		}
		l.wmu.Unlock()
	}
	return true
}

// waitUntil checks done every 50 µs until it holds (true) or until
// passes (false).
func waitUntil(until time.Time, done func() bool) bool {
	for !done() {
		if time.Now().After(until) {
			return false
		}
		time.Sleep(50 * time.Microsecond)
	}
	return true
}

// flushNotes writes the notifications of READs that landed and are not yet
// written, by until at most: it waits for the copy goroutine to send its
// own, writes those queued for the writers, and waits for the writers'
// and the writes under way (a frame's rest) to end.
func (p *peer) flushNotes(until time.Time) {
	if p.sh != nil && !waitUntil(until, func() bool { return p.sh.queued.Load() <= 0 }) {
		return
	}
	for {
		select {
		case n := <-p.notes:
			if !p.writeNote(n, until) {
				p.d.notesLost.Add(1)
			}
			p.noting.Add(-1)
			continue
		default:
		}
		break
	}
	waitUntil(until, func() bool { return p.noting.Load() <= 0 && p.writesIdle() })
}

// writeNote writes notification n on a connected link that is free by
// until, before until; false: it was not written.
func (p *peer) writeNote(n []byte, until time.Time) bool {
	for _, l := range p.links {
		l.mu.Lock()
		conn := l.conn
		l.mu.Unlock()
		if conn == nil {
			continue
		}
		if !waitUntil(until, l.wmu.TryLock) {
			return false
		}
		conn.SetWriteDeadline(until)
		bufs := net.Buffers{appendNotify(nil, n)}
		_, err := writeBufs(conn, &bufs)
		conn.SetWriteDeadline(time.Time{})
		l.wmu.Unlock()
		if err == nil {
			return true
		}
		l.breakIf(conn, err)
	}
	return false
}

// tryNotes writes notes on a connected link without waiting; false: none
// was free.
func (p *peer) tryNotes(notes [][]byte) bool {
	for _, l := range p.links {
		if !l.wmu.TryLock() {
			continue
		}
		l.mu.Lock()
		conn, nb := l.conn, l.nb
		l.mu.Unlock()
		if conn == nil || nb == nil {
			l.wmu.Unlock()
			continue
		}
		l.frame = l.frame[:0]
		for _, n := range notes {
			l.frame = appendNotify(l.frame, n)
		}
		l.sendFrameLocked(conn, nb)
		return true
	}
	return false
}

// fastBurst: a READ posted within this of the moment the previous one
// (to any producer) left the caller (copied there, handed off, or sent)
// is part of a burst (a step that took many acks: the next READ follows
// at once), which the copy goroutine copies while the step goes on; a
// lone one is copied at once. Counted from the previous post instead, a
// loop whose fetches end in a few tens of microseconds (one process, or a
// fast engine) had every other one taken for a burst's, and waiting for
// the copy goroutine to be woken.
const fastBurst = 10 * time.Microsecond
