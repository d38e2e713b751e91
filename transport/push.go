package transport

import (
	"bufio"
	"encoding/binary"
	"io"
	"slices"
	"sync"
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
// posted before its push began arriving is asked for as usual; the push
// is then dropped when it comes (its bytes cross twice; nothing waits).
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

// stage holds a consumer's pushes from one producer until READs claim them.
type stage struct {
	cap   int // bytes
	mu    sync.Mutex
	kept  map[string]*staged // by notification
	order []*staged          // oldest first
	bytes int
	asked map[string]struct{} // notifications whose READ went out: their push is dropped
	free  [][]byte
	down  bool
}

// staged is a push kept until a READ claims it.
type staged struct {
	notif string
	ids   []int
	buf   []byte
	at    time.Time
	ready bool    // every byte arrived
	op    *readOp // a READ that claimed it before it was ready: the reader lands it
}

func newStage(capacity int) *stage {
	return &stage{cap: capacity, kept: map[string]*staged{}, asked: map[string]struct{}{}}
}

// claim gives op the push of its grant, if one with exactly op's blocks
// is kept: ready (the caller lands it; it is no longer kept) or still
// arriving (op waits for it, and the reader lands it). Else op's READ is
// to be sent, and its notification is noted as asked.
func (s *stage) claim(op *readOp) (st *staged, ready bool) {
	if grantOf(op.notif) == 0 {
		return nil, false // not a Go consumer's READ: never pushed
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	st = s.kept[string(op.notif)]
	if st == nil || st.op != nil || !sameRuns(st.ids, op.remote) {
		if len(s.asked) >= 4096 {
			clear(s.asked) // bounded; a push that then comes is kept and ages out
		}
		s.asked[string(op.notif)] = struct{}{}
		return nil, false
	}
	if st.ready {
		s.unkeepLocked(st)
		return st, true
	}
	st.op = op
	return st, false
}

// keep makes room for a push of size bytes and keeps it, or returns nil:
// its READ went out already, one of that grant is kept, or there is no
// room. The bytes are then to be dropped.
func (s *stage) keep(notif string, ids []int, size int) *staged {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.asked[notif]; ok || s.down {
		delete(s.asked, notif)
		return nil
	}
	if s.kept[notif] != nil || size > s.cap {
		return nil
	}
	now := time.Now()
	for i := 0; i < len(s.order); {
		old := s.order[i]
		if !old.ready || old.op != nil || (s.bytes+size <= s.cap && now.Sub(old.at) < pushKeep) {
			i++
			continue
		}
		s.unkeepLocked(old)
		s.freeLocked(old.buf)
	}
	if s.bytes+size > s.cap {
		return nil
	}
	st := &staged{notif: notif, ids: ids, buf: s.bufLocked(size), at: now}
	s.kept[notif] = st
	s.order = append(s.order, st)
	s.bytes += size
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
	for _, st := range s.order {
		if st.op != nil {
			waiting = append(waiting, st.op)
		}
	}
	s.down = true
	clear(s.kept)
	s.order, s.free, s.bytes = nil, nil, 0
	s.mu.Unlock()
	for _, op := range waiting {
		op.fail()
	}
}

func (s *stage) unkeepLocked(st *staged) {
	delete(s.kept, st.notif)
	s.order = slices.DeleteFunc(s.order, func(t *staged) bool { return t == st })
	s.bytes -= len(st.buf)
	if len(s.order) == 0 {
		s.order = nil // a burst's list goes with it
	}
}

func (s *stage) bufLocked(n int) []byte {
	for i, b := range s.free {
		if cap(b) >= n {
			s.free = slices.Delete(s.free, i, i+1)
			return b[:n]
		}
	}
	return make([]byte, n)
}

// freeLocked keeps b for the next push, a few at most.
func (s *stage) freeLocked(b []byte) {
	if len(s.free) < 4 {
		s.free = append(s.free, b)
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
// op's remote order). true: op is done, and its notification is the
// caller's to send.
func (p *peer) landStaged(op *readOp, st *staged) bool {
	defer p.push.done(st.buf)
	if !op.claim(opQueued) {
		return false // released before it landed
	}
	bs := p.d.region.BlockSize()
	off := 0
	for _, r := range op.local {
		off += copy(p.d.region.Span(r[0], r[1]), st.buf[off:off+r[1]*bs])
	}
	p.d.pushLanded.Add(1)
	op.land(true)
	return true
}

// takePush reads a push frame (its head read) and keeps it, lands it in
// the READ that waits for it, or drops it.
func (l *link) takePush(r *bufio.Reader) error {
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
	ids, ok := readIDs(r, make([]int, 0, n), n, p.blocks, make([]byte, min(4*n, 16<<10)))
	if !ok {
		return errProtocol
	}
	st := p.push.keep(string(notif), ids, int(size))
	if st == nil {
		p.d.pushDrops.Add(1)
		_, err := r.Discard(int(size))
		return err
	}
	_, err := io.ReadFull(r, st.buf)
	op := p.push.arrived(st, err == nil)
	switch {
	case op == nil:
	case err != nil:
		op.fail()
	case p.landStaged(op, st):
		p.sendNotes([][]byte{op.notif})
	}
	return err
}
