package transport

import (
	"encoding/binary"
	"net"
	"slices"
	"sync"
	"time"

	"github.com/ecxfer/ecxfer/wire"
	"github.com/ecxfer/ecxfer/xfer"
)

// Pushes: between Go peers that do not share memory, a producer sends a
// grant's blocks on the consumer's data connection as soon as the ack is
// out, so that they travel while the ack does, and the consumer's READ
// finds them already there: a fetch costs one round trip, not two. The
// consumer offers it (a stage frame after its hello, saying how many bytes
// it keeps); a producer that advertises "push" in its metadata may then
// push any entry up to a quarter of that, and at most maxPushSize.
//
// The bytes are the grant's: the producer holds the grant's pin while it
// copies them into the socket (xfer.Pusher). A consumer keeps a push until
// a READ with its notification ("<session>:<mm_hash>#<grant>", so a push
// of another session, entry or producer session never matches) and
// exactly its blocks claims it, then lands it
// and sends the notification, as the same-host path does; a READ posted
// while its push is still arriving waits for it. Pushes nobody claims (a
// fetch cancelled, an ack lost) are evicted oldest first when a new one
// needs the room; a push that finds no room is dropped, and its READ goes
// to the producer as any other. A READ posted before its push arrived is
// asked for as usual, and the push is then dropped: the bytes cross twice,
// and nothing waits.

// maxPushSize bounds an entry the producer pushes: beyond it the transfer
// dwarfs the round trip a push saves, and the consumer's extra copy
// (staging to blocks) costs more than it saves.
const maxPushSize = 1 << 20

// defaultPushBuffer is a consumer's staging per producer (TCPConfig.PushBuffer).
const defaultPushBuffer = 8 << 20

// servedConn is a consumer's connection a producer serves: serve's answers and
// pushes take turns on it under wmu.
type servedConn struct {
	c       net.Conn
	agent   string
	wmu     sync.Mutex
	raw     *nbWriter
	pushMax int  // the largest push the consumer takes; 0: none
	staged  bool // the consumer sent a stage frame: it may send notify frames
	frame   []byte
	bufs    [][]byte
	runs    [][2]int
	// The last grants pushed (fingerprints of the notification and of
	// the blocks), under wmu: a READ of one of them on this connection
	// comes after its push, so it is answered "pushed", without the bytes
	// again.
	recent [64][2]uint64
	next   int
}

// fnv1a folds words into an FNV-1a fingerprint.
func fnv1a[T byte | int](ws []T) uint64 {
	h := uint64(14695981039346656037)
	for _, w := range ws {
		h = (h ^ uint64(w)) * 1099511628211
	}
	return h
}

// blocksPrint fingerprints a list of block ids.
func blocksPrint(ids []int) uint64 { return fnv1a(ids) }

// notifPrint fingerprints a notification; never 0 (an empty slot).
func notifPrint(n []byte) uint64 { return fnv1a(n) | 1 }

// wasPushed reports whether the grant notif names, with exactly ids, was
// pushed on s lately, and forgets it.
func (s *servedConn) wasPushed(notif []byte, ids []int) bool {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	key := [2]uint64{notifPrint(notif), blocksPrint(ids)}
	for i := range s.recent {
		if s.recent[i] == key {
			s.recent[i] = [2]uint64{}
			return true
		}
	}
	return false
}

// writeHead writes an answer's head on s within timeout, taking turns with
// pushes (wmu). The deadline is cleared after: one left behind would fail
// a push's raw writes.
func (s *servedConn) writeHead(head []byte, timeout time.Duration) error {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	s.c.SetWriteDeadline(time.Now().Add(timeout))
	_, err := s.c.Write(head)
	s.c.SetWriteDeadline(time.Time{})
	return err
}

// Push implements xfer.Pusher: it writes the grant's blocks (and notif,
// which the consumer's READ of them must carry) on a connection of
// agent's that asked for pushes and that no one is writing to, without
// waiting; what the socket does not take at once is finished by a
// goroutine, which ends the hold (release) when the bytes are out of the
// region. false: nothing pushed, the hold is the caller's.
func (d *TCPData) Push(agent string, notif []byte, blocks []int, release func()) bool {
	size := len(blocks) * d.region.BlockSize()
	if size == 0 || size > maxPushSize || len(notif) > maxNotifLen {
		return false
	}
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return false
	}
	var s *servedConn
	for _, t := range d.pushTo[agent] {
		if size <= t.pushMax && t.wmu.TryLock() {
			s = t
			break
		}
	}
	if s == nil {
		d.mu.Unlock()
		return false
	}
	d.wg.Add(1) // under mu, not closed: Close waits for it
	d.mu.Unlock()
	s.frame = appendPushHead(s.frame[:0], notif, uint64(size), blocks)
	s.bufs = append(s.bufs[:0], s.frame)
	s.runs = spans(s.runs[:0], blocks)
	for _, r := range s.runs {
		s.bufs = append(s.bufs, d.region.Span(r[0], r[1]))
	}
	s.recent[s.next] = [2]uint64{notifPrint(notif), blocksPrint(blocks)}
	s.next = (s.next + 1) % len(s.recent)
	rest, err := s.raw.writeAll(s.bufs)
	d.pushes.Add(1)
	if err != nil || len(rest) == 0 {
		s.wmu.Unlock()
		release()
		if err != nil {
			s.c.Close() // serve sees it and ends
		}
		d.wg.Done()
		return true
	}
	rest = slices.Clone(rest) // s.bufs is the next push's
	go func() {
		defer d.wg.Done()
		s.c.SetWriteDeadline(time.Now().Add(d.cfg.IOTimeout))
		b := net.Buffers(rest)
		_, err := b.WriteTo(s.c)
		s.c.SetWriteDeadline(time.Time{})
		s.wmu.Unlock()
		release()
		if err != nil {
			s.c.Close()
		}
	}()
	return true
}

// offerPush marks s as taking pushes up to its consumer's staging/4, from
// its stage frame (0 on its other connections: they only carry the
// notifications of pushes landed); a consumer that maps our region copies
// for itself.
func (d *TCPData) offerPush(s *servedConn, staging uint32, shared bool) {
	if d.cfg.NoPush {
		return
	}
	s.staged = true
	if shared || s.pushMax > 0 || s.raw == nil {
		return
	}
	s.pushMax = min(int(staging/4), maxPushSize)
	if s.pushMax < d.region.BlockSize() {
		s.pushMax = 0
		return
	}
	d.mu.Lock()
	d.pushTo[s.agent] = append(d.pushTo[s.agent], s)
	d.mu.Unlock()
}

// unservePush forgets s, whose connection is closing.
func (d *TCPData) unservePush(s *servedConn) {
	if s.pushMax == 0 {
		return
	}
	d.mu.Lock()
	list := slices.DeleteFunc(d.pushTo[s.agent], func(t *servedConn) bool { return t == s })
	if len(list) == 0 {
		delete(d.pushTo, s.agent)
	} else {
		d.pushTo[s.agent] = list
	}
	d.mu.Unlock()
}

// ---- consumer ----

// staged is a push kept until a READ claims it.
type staged struct {
	notif string // the grant's notification, which its READ carries
	ids   []int
	buf   []byte
	ready bool    // every byte arrived
	op    *readOp // a READ that claimed it before it was ready
}

// stagePush takes a push of size bytes: to the READ sent for it already,
// if there is one (op: the caller lands it), else kept, the oldest
// unclaimed pushes going if they must. One critical section with
// claimPush's: a READ is either asked before the push is kept, or finds
// it kept. Both nil: no room (or a push of that grant is kept already);
// the bytes are to be dropped.
func (p *peer) stagePush(notif string, ids []int, size int) (*staged, *readOp) {
	p.smu.Lock()
	defer p.smu.Unlock()
	if op := p.asked[notif]; op != nil {
		delete(p.asked, notif)
		if sameRuns(ids, op.remote) {
			return nil, op
		}
	}
	if p.staged[notif] != nil {
		return nil, nil
	}
	for i := 0; p.stagedBytes+size > p.stageCap && i < len(p.stageOrder); {
		old := p.stageOrder[i]
		if !old.ready || old.op != nil {
			i++
			continue
		}
		p.unstageLocked(old)
		p.lostLocked(old.notif)
		p.freeBuf(old.buf)
	}
	if p.stagedBytes+size > p.stageCap {
		p.lostLocked(notif)
		return nil, nil
	}
	st := &staged{notif: notif, ids: ids, buf: p.getBuf(size)}
	if p.staged == nil {
		p.staged = map[string]*staged{}
	}
	p.staged[notif] = st
	p.stageOrder = append(p.stageOrder, st)
	p.stagedBytes += size
	return st, nil
}

// lostLocked notes a push dropped: a READ under its grant asks for the
// bytes again. Under smu.
func (p *peer) lostLocked(notif string) {
	p.d.pushDrops.Add(1)
	if p.lost == nil || len(p.lost) >= 4096 {
		p.lost = map[string]struct{}{} // bounded; a READ that misses it gets an error and is retried
	}
	p.lost[notif] = struct{}{}
}

func (p *peer) unstageLocked(st *staged) {
	delete(p.staged, st.notif)
	p.stageOrder = slices.DeleteFunc(p.stageOrder, func(t *staged) bool { return t == st })
	p.stagedBytes -= len(st.buf)
}

func (p *peer) getBuf(n int) []byte {
	for i, b := range p.freeBufs {
		if cap(b) >= n {
			p.freeBufs = slices.Delete(p.freeBufs, i, i+1)
			return b[:n]
		}
	}
	return make([]byte, n)
}

// freeBuf keeps b for the next push, a few at most. Under smu.
func (p *peer) freeBuf(b []byte) {
	if len(p.freeBufs) < 8 {
		p.freeBufs = append(p.freeBufs, b)
	}
}

// pushArrived records that st's bytes are in; it returns the READ that
// waits for them, now the caller's to land (st is no longer kept).
func (p *peer) pushArrived(st *staged) *readOp {
	p.smu.Lock()
	defer p.smu.Unlock()
	st.ready = true
	op := st.op
	if op != nil {
		p.unstageLocked(st)
	}
	return op
}

// pushFailed forgets st, whose bytes will not come; a READ that waited
// for them fails.
func (p *peer) pushFailed(st *staged) {
	p.smu.Lock()
	op := st.op
	if p.staged[st.notif] == st {
		p.unstageLocked(st)
	}
	p.smu.Unlock()
	if op != nil {
		op.fail()
	}
}

// claimPush gives op the push of its grant, if one with exactly op's
// blocks is kept: ready, to land now (the caller's, no longer kept), or
// still arriving (op waits for it, and its reader lands it). Else op's
// READ is to be sent, and op is noted as asked: a push that comes after
// lands in it straight away.
func (p *peer) claimPush(op *readOp, notif []byte) (st *staged, ready bool) {
	if p.stageCap == 0 {
		return nil, false
	}
	if _, g, _, ok := wire.SplitNotifGrant(notif); !ok || g == 0 {
		return nil, false // not a Go consumer's READ: never pushed
	}
	p.smu.Lock()
	defer p.smu.Unlock()
	st = p.staged[string(notif)]
	if st == nil || st.op != nil || !sameRuns(st.ids, op.remote) {
		if p.asked == nil {
			p.asked = map[string]*readOp{}
		}
		if n := len(p.asked); n >= 64 && n > 2*int(p.inflight.Load()) {
			// READs that ended without their answer (a connection broke):
			// forget them, a few at a time as the map grows.
			for k, o := range p.asked {
				if s := o.state.Load(); s != opPending && s != opWriting {
					delete(p.asked, k)
				}
			}
		}
		op.asked = string(notif)
		p.asked[op.asked] = op
		if _, ok := p.lost[op.asked]; ok {
			// We dropped its push: the producer must send the bytes.
			delete(p.lost, op.asked)
			op.resend = true
		}
		return nil, false
	}
	if st.ready {
		p.unstageLocked(st)
		return st, true
	}
	st.op = op
	return st, false
}

// sameRuns reports whether ids, in order, are the blocks runs names.
func sameRuns(ids []int, runs [][2]int) bool {
	i := 0
	for _, r := range runs {
		for b := r[0]; b < r[0]+r[1]; b++ {
			if i == len(ids) || ids[i] != b {
				return false
			}
			i++
		}
	}
	return i == len(ids)
}

// landPush copies a push into op's blocks (its bytes are in op's remote
// order) and gives the buffer back. true: op completed, and its
// notification is the caller's to send (notify).
func (p *peer) landPush(op *readOp, buf []byte) bool {
	defer func() {
		p.smu.Lock()
		p.freeBuf(buf)
		p.smu.Unlock()
	}()
	op.mu.Lock()
	if !op.state.CompareAndSwap(opPending, opWriting) {
		op.mu.Unlock()
		op.fail() // released before it landed
		return false
	}
	bs := p.d.region.BlockSize()
	off := 0
	for _, r := range op.local {
		off += copy(p.d.region.Span(r[0], r[1]), buf[off:off+r[1]*bs])
	}
	op.mu.Unlock()
	p.d.pushLanded.Add(1)
	op.state.Store(opComplete)
	p.d.signal()
	return true
}

// takePush reads a push frame's notification, blocks and bytes off c (its
// 22-byte head read: nl is the notification's length), and keeps them,
// lands them in the READ that waits for them, or drops them.
func (l *link) takePush(c net.Conn, nl int, size uint64) error {
	p := l.p
	bs := uint64(p.d.region.BlockSize())
	if p.stageCap == 0 || nl == 0 || nl > maxNotifLen || size == 0 || size%bs != 0 || size > uint64(p.stageCap) || size > maxPushSize {
		return errProtocol
	}
	n := int(size / bs)
	raw := make([]byte, nl+4*n)
	if err := readFullDeadline(c, raw, p.d.cfg.IOTimeout); err != nil {
		return err
	}
	notif := string(raw[:nl])
	raw = raw[nl:]
	ids := make([]int, n)
	for i := range ids {
		b := binary.BigEndian.Uint32(raw[4*i:])
		if uint64(b) >= uint64(p.blocks) {
			return errProtocol
		}
		ids[i] = int(b)
	}
	st, op := p.stagePush(notif, ids, int(size))
	if op != nil {
		// Its READ went out before the push came: land it now (the
		// answer, when it comes, finds the READ complete).
		return l.landAsked(c, op, size)
	}
	if st == nil {
		return discard(c, int64(size), p.d.cfg.IOTimeout)
	}
	if err := readFullDeadline(c, st.buf, p.d.cfg.IOTimeout); err != nil {
		p.pushFailed(st)
		return err
	}
	if op := p.pushArrived(st); op != nil && p.landPush(op, st.buf) {
		p.notify([]*readOp{op})
	}
	return nil
}

// landAsked reads a push straight into the blocks of op, whose READ was
// sent, unless op was released (then the bytes are dropped). Release
// waits on op.mu while the bytes land.
func (l *link) landAsked(c net.Conn, op *readOp, size uint64) error {
	p := l.p
	op.mu.Lock()
	op.byPush.Store(true) // before the state says writing: Release reads them in turn
	if !op.state.CompareAndSwap(opPending, opWriting) {
		op.mu.Unlock()
		p.d.pushDrops.Add(1)
		return discard(c, int64(size), p.d.cfg.IOTimeout)
	}
	for _, r := range op.local {
		if err := readFullDeadline(c, p.d.region.Span(r[0], r[1]), p.d.cfg.IOTimeout); err != nil {
			op.state.Store(opFailed) // from opWriting: only we change it now
			op.mu.Unlock()
			op.settle()
			return err
		}
	}
	op.state.Store(opComplete)
	op.mu.Unlock()
	p.d.pushLanded.Add(1)
	op.settle() // its notification goes with the answer's done
	return nil
}

// answered forgets op as asked: its answer came.
func (p *peer) answered(op *readOp) {
	if op.asked == "" {
		return
	}
	p.smu.Lock()
	if p.asked[op.asked] == op {
		delete(p.asked, op.asked)
	}
	p.smu.Unlock()
}

// postPushed lands op from a push kept for its grant, or makes it wait for
// one arriving; false: there is none, the READ is to be sent. Called with
// d.mu, which it releases when it returns true.
func (d *TCPData) postPushed(p *peer, op *readOp) bool {
	st, ready := p.claimPush(op, op.notif)
	if st == nil {
		return false
	}
	op.fast = true // no READ frame: Release waits on op.mu, the writer sends its notification
	d.mu.Unlock()
	if ready && p.landPush(op, st.buf) {
		p.notify([]*readOp{op})
	}
	return true
}

func appendStage(b []byte, staging uint32) []byte {
	b = appendHead(b, frameStage)
	return binary.BigEndian.AppendUint32(b, staging)
}

// appendPushHead appends a push's head, 22 bytes as a data answer's
// (notification length u16 and 6 zero bytes in the id's place, status 0,
// length), its notification and its block ids.
func appendPushHead(b []byte, notif []byte, size uint64, blocks []int) []byte {
	b = appendHead(b, framePush)
	b = binary.BigEndian.AppendUint16(b, uint16(len(notif)))
	b = append(b, 0, 0, 0, 0, 0, 0, 0)
	b = binary.BigEndian.AppendUint64(b, size)
	b = append(b, notif...)
	for _, id := range blocks {
		b = binary.BigEndian.AppendUint32(b, uint32(id))
	}
	return b
}

var _ xfer.Pusher = (*TCPData)(nil)
