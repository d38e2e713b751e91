package transport

import (
	"encoding/binary"
	"fmt"
	"io"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Pushes: between Go peers that do not share memory, a producer sends a
// grant's blocks on its consumer's data connection as soon as the ack is
// out, so that they travel while the ack does, and the consumer's READ
// finds them there: a fetch costs one round trip, not two.
//
// Whose connection it is, is proven, never claimed: a connection takes
// pushes for a consumer session only once a READ on it presented the
// token of one of that session's grants (the producer's gate says which
// session a grant is for, see plane.Hold), and only if its hello offered
// to keep pushes (room), which a consumer does on its first connection
// to a producer whose metadata says "push". A hello that names a
// consumer's agent gets nothing for it.
//
// The consumer keeps a push until a READ with its notification
// ("<session>:<mm_hash>#<grant>.<token>", so a push of another grant,
// session or producer never matches) and exactly its blocks claims it,
// then lands it (a copy out of the staging buffer) and sends the
// notification, as the same-host path does; a READ posted while its push
// is arriving waits for it, and its connection's reader lands it. A READ
// posted before its push began arriving goes on the connection pushes
// come on: the push, when it comes, lands it, and the producer, which
// knows it pushed that grant on that connection, answers "pushed" with no
// bytes. A push whose READ went elsewhere, or was answered already, is
// dropped.
// Pushes nobody claims (a fetch cancelled, an ack lost) go, oldest first,
// when a new one needs the room or after pushKeep.

// maxPushSize bounds an entry the producer pushes: beyond it the transfer
// dwarfs the round trip a push saves, and the consumer's extra copy
// (staging to blocks) costs more than it saves.
const maxPushSize = 1 << 20

// defaultPushBuffer is a consumer's staging per producer (TCPConfig.PushBuffer).
const defaultPushBuffer = 8 << 20

// pushKeep is how long an unclaimed push is kept at most.
const pushKeep = 10 * time.Second

// maxKept bounds the pushes a stage keeps, whatever their size, as
// maxAsked bounds asked, and lost is bounded.
const (
	maxKept  = 4096
	maxAsked = 4096
)

// stage holds a consumer's pushes from one producer until READs claim them.
// What it does per push is bounded, not only what it holds: the pushes
// kept are a list, oldest first, and a push makes room by evicting from
// its head only, each eviction O(1).
type stage struct {
	cap  int // bytes
	mu   sync.Mutex
	kept map[string]*staged // by notification
	head *staged            // the oldest kept; then next
	tail *staged
	// bytes are what the kept pushes' buffers hold and spare what the
	// free ones do, by capacity: both count against cap, the free ones
	// dropped first.
	bytes int
	spare int
	// asked are the READs posted with no push kept for them, by
	// notification: a push that comes for one lands it, if it is not
	// answered yet; else it is dropped.
	asked   map[string]*readOp
	askSkip int // claims before the next scan of asked (claim)
	// lost are notifications whose push was dropped for want of room:
	// their READ tells the producer to send the bytes (readResend).
	lost map[string]struct{}
	free [][]byte
	down bool
	// missed: a READ that waited a Step for its push found none, so
	// READs are sent at once, until a push lands one (see viaAwait).
	missed atomic.Bool
}

// staged is a push kept until a READ claims it.
type staged struct {
	notif string
	ids   []int
	buf   []byte
	at    time.Time
	ready bool    // every byte arrived
	op    *readOp // a READ that claimed it before it was ready: the reader lands it

	prev, next *staged // kept, in arrival order
}

func newStage(capacity int) *stage {
	return &stage{cap: capacity, kept: map[string]*staged{}, asked: map[string]*readOp{}, lost: map[string]struct{}{}}
}

// claim gives op the push of its grant, if one with exactly op's blocks
// is kept: ready (the caller lands it; it is no longer kept) or still
// arriving (op waits for it, and the reader lands it). Else op's READ is
// to be sent, and op is noted as asked; resend says the push of its grant
// was dropped, and the producer must send the bytes.
func (s *stage) claim(op *readOp) (st *staged, ready, resend bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	st = s.kept[string(op.notif)]
	if st == nil || st.op != nil || !sameRuns(st.ids, op.remote) {
		// Ended READs are forgotten by a scan when the map is full, and
		// after a scan that left it nearly full, only once as many claims
		// as it holds went by: a scan per claim would cost each READ
		// posted thousands of looks under the lock.
		if s.askSkip > 0 {
			s.askSkip--
		} else if len(s.asked) >= maxAsked {
			for k, o := range s.asked {
				if o.state.Load() > opWriting { // ended
					delete(s.asked, k)
				}
			}
			if len(s.asked) >= maxAsked/2 {
				s.askSkip = len(s.asked)
			}
		}
		if len(s.asked) < maxAsked {
			s.asked[string(op.notif)] = op
		}
		_, resend = s.lost[string(op.notif)]
		delete(s.lost, string(op.notif))
		return nil, false, resend
	}
	if st.ready {
		s.unkeepLocked(st)
		s.missed.Store(false) // pushes come
		return st, true, false
	}
	st.op = op
	return st, false, false
}

// take matches a push of notif's grant, of ids (size bytes), with the READ
// asked for it, or else keeps it, in one hold of s.mu, as claim runs: a
// READ posted while the push arrives either is found asked here, or finds
// the push kept, never neither (the push kept for no one, and the READ,
// which the producer answers "pushed", failed). op: the READ the push may
// land; st: the push, kept; neither: the push is to be dropped.
func (s *stage) take(notif []byte, ids []int, size int) (op *readOp, st *staged) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if op = s.askedLocked(notif, ids); op != nil {
		return op, nil
	}
	return nil, s.keepLocked(string(notif), ids, size)
}

// askedLocked returns the READ asked for notif, with exactly ids, that a
// push of its grant may land (queued, or sent on l), and forgets it.
func (s *stage) askedLocked(notif []byte, ids []int) *readOp {
	op := s.asked[string(notif)]
	if op == nil {
		return nil
	}
	delete(s.asked, string(notif))
	if op.n != len(ids) || !sameRuns(ids, op.remote) {
		return nil
	}
	return op
}

// keep makes room for a push of size bytes and keeps it, or returns nil:
// one of that grant is kept, or there is no room (then its READ will ask
// for the bytes). The bytes are then to be dropped.
func (s *stage) keep(notif string, ids []int, size int) *staged {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.keepLocked(notif, ids, size)
}

func (s *stage) keepLocked(notif string, ids []int, size int) *staged {
	if s.kept[notif] != nil || s.down {
		return nil
	}
	if s.bytes+s.spare+size > s.cap {
		s.free, s.spare = nil, 0 // spare buffers yield first, before any push
	}
	now := time.Now()
	// Oldest first: once one is young and there is room, so are the rest.
	// One arriving, or claimed while it arrives, stays.
	for old := s.head; old != nil; {
		next := old.next
		if s.bytes+s.spare+size <= s.cap && len(s.kept) < maxKept && now.Sub(old.at) < pushKeep {
			break
		}
		if old.ready && old.op == nil {
			s.unkeepLocked(old)
			s.freeLocked(old.buf)
		}
		old = next
	}
	if s.bytes+s.spare+size > s.cap {
		s.free, s.spare = nil, 0 // evictions freed some: they yield too
	}
	if s.bytes+size > s.cap || len(s.kept) >= maxKept {
		if len(s.lost) >= 4096 {
			clear(s.lost) // bounded: a READ that misses it fails, and is asked for anew
		}
		s.lost[notif] = struct{}{}
		return nil
	}
	st := &staged{notif: notif, ids: ids, buf: s.bufLocked(size), at: now, prev: s.tail}
	s.kept[notif] = st
	if s.tail != nil {
		s.tail.next = st
	} else {
		s.head = st
	}
	s.tail = st
	s.bytes += cap(st.buf)
	return st
}

// arrived records that st's bytes are all in (ok) or never will be; it
// returns the READ that waits for them, now the caller's to land or fail.
func (s *stage) arrived(st *staged, ok bool) *readOp {
	s.mu.Lock()
	defer s.mu.Unlock()
	st.ready = ok
	op := st.op
	if (op != nil || !ok) && s.kept[st.notif] == st {
		s.unkeepLocked(st)
	}
	if !ok {
		s.freeLocked(st.buf)
	}
	return op
}

// shutdown fails the READs waiting for pushes and drops the pushes.
func (s *stage) shutdown() {
	s.mu.Lock()
	var waiting []*readOp
	for st := s.head; st != nil; st = st.next {
		if st.op != nil {
			waiting = append(waiting, st.op)
		}
	}
	s.down = true
	clear(s.kept)
	s.head, s.tail, s.free, s.bytes, s.spare = nil, nil, nil, 0, 0
	s.mu.Unlock()
	for _, op := range waiting {
		op.fail(errStopped)
	}
}

func (s *stage) unkeepLocked(st *staged) {
	delete(s.kept, st.notif)
	if st.prev != nil {
		st.prev.next = st.next
	} else {
		s.head = st.next
	}
	if st.next != nil {
		st.next.prev = st.prev
	} else {
		s.tail = st.prev
	}
	st.prev, st.next = nil, nil
	s.bytes -= cap(st.buf)
}

// bufLocked returns a buffer for n bytes: a free one whose capacity
// fits, if within the room, else a new one.
func (s *stage) bufLocked(n int) []byte {
	for i, b := range s.free {
		if cap(b) >= n && s.bytes+cap(b) <= s.cap {
			s.free = slices.Delete(s.free, i, i+1)
			s.spare -= cap(b)
			return b[:n]
		}
	}
	return make([]byte, n)
}

// freeLocked keeps b for the next push, a few at most, within the room.
func (s *stage) freeLocked(b []byte) {
	if len(s.free) < 4 && !s.down && s.bytes+s.spare+cap(b) <= s.cap {
		s.free = append(s.free, b)
		s.spare += cap(b)
	}
}

// done gives a landed push's buffer back.
func (s *stage) done(b []byte) {
	s.mu.Lock()
	s.freeLocked(b)
	s.mu.Unlock()
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

// landStaged copies a push kept for op into its blocks (its bytes are in
// op's remote order), sends its notification and lands it, unless op was
// released first.
func (p *peer) landStaged(op *readOp, st *staged) {
	defer p.push.done(st.buf)
	if !op.claim(opQueued) {
		return // released before it landed
	}
	bs := p.d.region.BlockSize()
	off := 0
	for _, r := range op.local {
		off += copy(p.d.region.Span(r[0], r[1]), st.buf[off:off+r[1]*bs])
	}
	p.d.pushLanded.Add(1)
	p.sendNotes([][]byte{op.notif})
	op.land(nil)
}

// takePush reads a push frame (its head read) and keeps it, lands it in
// the READ that waits for it, or drops it.
func (l *link) takePush(r frameReader) error {
	p := l.p
	var b [14]byte
	if _, err := io.ReadFull(r, b[:]); err != nil {
		return err
	}
	nl, n, size := int(binary.BigEndian.Uint16(b[:])), int(binary.BigEndian.Uint32(b[2:])), binary.BigEndian.Uint64(b[6:])
	bs := p.d.region.BlockSize()
	if p.push == nil || !l.first || nl == 0 || nl > maxNotifLen || n == 0 || size != uint64(n)*uint64(bs) ||
		size > uint64(p.push.cap) || size > maxPushSize {
		return errProtocol
	}
	notif := make([]byte, nl)
	if _, err := io.ReadFull(r, notif); err != nil {
		return err
	}
	ids, ok := readIDs(r, make([]int, 0, min(n, 4096)), n, p.blocks, make([]byte, min(4*n, 16<<10)))
	if !ok {
		return errProtocol
	}
	if f := p.pushHook.Load(); f != nil {
		(*f)()
	}
	op, st := p.push.take(notif, ids, int(size))
	if op != nil {
		p.push.missed.Store(false) // pushes come
		// Its READ was posted before the push came. Not sent yet, the
		// push lands it and no READ goes; sent on this connection, the
		// push lands it as its answer would (the producer answers it
		// "pushed", and its done brings the notification). Sent
		// elsewhere, or ended, the push is dropped. Its link is set
		// before it is sent (enqueue): sent, it shows where.
		unsent := op.claimFrom(l, opQueued)
		if !unsent && (op.link.Load() != l || !op.claimFrom(l, opSent)) {
			p.d.pushDrops.Add(1)
			_, err := r.Discard(int(size))
			return err
		}
		err := l.landBytes(r, op)
		if err == nil {
			p.d.pushLanded.Add(1)
			if unsent {
				p.sendNotes([][]byte{op.notif})
			}
		} else {
			err = fmt.Errorf("transport: reading its push: %w", err)
		}
		op.land(err)
		if err == nil && !unsent {
			l.pushedHead(op)
		}
		return err
	}
	if st == nil {
		p.d.pushDrops.Add(1)
		_, err := r.Discard(int(size))
		return err
	}
	_, err := io.ReadFull(r, st.buf)
	op = p.push.arrived(st, err == nil)
	switch {
	case op == nil:
	case err != nil:
		op.fail(fmt.Errorf("transport: reading its push: %w", err))
	default:
		p.landStaged(op, st)
	}
	return err
}

// pushedHead starts the turn of the READ behind op when op, landed by its
// push, is the head of l's queue: as when an answer lands it (answer), the
// next READ's deadline runs from now. The head's own answer ("pushed", a
// few bytes) comes right behind its push; were the deadline left to run
// from when the head was sent, a push that took most of IOTimeout to
// arrive, on a link moving bytes all along, would fail the READs behind.
func (l *link) pushedHead(op *readOp) {
	l.mu.Lock()
	if len(l.pending) > 0 && l.pending[0] == op {
		l.headAt = time.Now()
	}
	l.mu.Unlock()
}
