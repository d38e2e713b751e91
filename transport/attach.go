package transport

import (
	"errors"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ecxfer/ecxfer/internal/plane"
	"github.com/ecxfer/ecxfer/xfer"
)

// attachment is a producer session's hold on the data plane (see package
// internal/plane): its gate, its grants on the board, the connections
// proven to be its consumers' (for pushes), its notification hook, its
// broken READs. All of it goes with Detach.
//
// Several may be live at once (a producer draining while its successor
// grants): what a READ served under one's gate brings (its done, its
// notification, its broken report) and its pushes stay that one's, until
// it is detached. The newest is the current one: its gate is asked first,
// it alone shows grants on the board, and it takes notifications that name
// no live grant of another.
type attachment struct {
	d        *TCPData
	gate     plane.Gate
	lease    time.Duration // the gate's (plane.Leased): bounds its pushes' writes
	hook     atomic.Pointer[func() bool]
	detached atomic.Bool
	// Under d.mu: its notifications were queued while its wake went to
	// Ready, which another waiter may take; nudges counts the signals
	// others' drains sent it since (at most maxNudges).
	owed   bool
	nudges int

	mu        sync.Mutex
	pushTo    map[uint64][]*servedConn // by consumer session: connections that proved it, taking pushes
	broken    []xfer.Notif             // READs served under its grants that cannot complete (Broken)
	maxBroken int
	// waiting are the pushes that found their connection being written
	// to, by connection: its drainer writes them once the write is done.
	waiting map[*servedConn]*pushQueue
}

// maxLive bounds the attachments live at once on one plane: an Attach
// beyond it detaches the oldest, whose grants then end at their leases.
const maxLive = 4

// maxNudges bounds the signals other sessions' drains send for an
// attachment whose notifications wait, until it drains: enough that a wake
// another waiter took reaches it, without a loop that spins for one no
// one steps.
const maxNudges = 4

// pushQueue is the pushes waiting on one connection for its write lock,
// in order. What waits is bounded as a push is: with it, a quarter of
// what the consumer keeps (room), and maxPushWaiting pushes; a push past
// either is declined, and its READ asks for the bytes.
type pushQueue struct {
	pushes []waitingPush
	bytes  int
}

type waitingPush struct {
	notif   []byte
	blocks  []int
	release func()
	by      time.Time // its grant's time is up (pushBy)
}

// pushBy is when a push made now must be written by: its grant's lease
// and the grace a READ's answer has (answerGrace), so that a consumer
// that reads slowly holds the entry no longer through a push than through
// a READ. Zero: the gate has no lease, and only IOTimeout bounds it.
func (a *attachment) pushBy() time.Time {
	if a.lease <= 0 {
		return time.Time{}
	}
	return time.Now().Add(a.lease + answerGrace)
}

// pushDone ends a push's write: a cut one is counted, and its connection,
// a frame in part on it, closed.
func (d *TCPData) pushDone(s *servedConn, err error) {
	if errors.Is(err, errGrantTime) {
		d.pushesCut.Add(1)
	}
	if err != nil {
		s.close()
	}
}

// maxPushWaiting bounds the pushes waiting on one connection: as many as
// the grants it remembers pushing (servedConn.recent), so that none of
// theirs is forgotten before its READ comes.
const maxPushWaiting = 64

// maxBound is how many consumer sessions one connection takes pushes for:
// a consumer's data plane has a session per producer, or a few.
const maxBound = 8

// attach implements plane.Attacher: g gates the READs served from now on,
// alone or with TCPConfig.Authorize, asked before the gates of the
// attachments still live. The board starts empty: it is the new
// attachment's.
func (d *TCPData) attach(g plane.Gate) plane.Attachment {
	a := &attachment{d: d, gate: g, pushTo: map[uint64][]*servedConn{}, waiting: map[*servedConn]*pushQueue{},
		maxBroken: maxQueuedNotifs}
	if l, ok := g.(plane.Leased); ok {
		a.lease = l.Lease()
	}
	d.everAttached.Store(true)
	d.mu.Lock()
	live := slices.Clone(d.liveList())
	var oldest *attachment
	if len(live) >= maxLive {
		oldest = live[0]
	}
	live = append(live, a)
	d.live.Store(&live)
	d.att.Store(a)
	// Cleared before d.mu goes: an earlier session's Detach, which finds
	// it is no longer current under d.mu, leaves the board to us, and its
	// session unpins its grants as Detach returns.
	d.clearBoard()
	d.mu.Unlock()
	if oldest != nil {
		oldest.Detach()
	}
	return a
}

// liveList returns the attachments live, oldest first; the last is
// current.
func (d *TCPData) liveList() []*attachment {
	if l := d.live.Load(); l != nil {
		return *l
	}
	return nil
}

// Detach implements plane.Attachment: its notifications not yet drained
// are dropped (its session ended its grants), and the board is cleared if
// it was the current one, the one before it current again.
func (a *attachment) Detach() {
	d := a.d
	a.detached.Store(true) // first: queueNotif, Publish and broke see it
	d.mu.Lock()
	live := d.liveList()
	if i := slices.Index(live, a); i >= 0 {
		live = slices.Delete(slices.Clone(live), i, i+1)
		d.live.Store(&live)
	}
	current := d.att.Load() == a
	if current {
		var next *attachment
		if len(live) > 0 {
			next = live[len(live)-1]
		}
		d.att.Store(next)
	}
	d.takeNotifsLocked(nil, func(o *attachment) bool { return o == a }, true)
	d.mu.Unlock()
	a.drop()
	if current {
		d.clearBoard() // no grant of a's is retired one by one
	}
}

// drop ends what a holds; the board is the caller's to clear.
func (a *attachment) drop() {
	a.detached.Store(true)
	a.hook.Store(nil)
	a.mu.Lock()
	clear(a.pushTo) // a connection's list of bindings, its own, is reset as it binds again
	clear(a.broken)
	a.broken = nil
	a.mu.Unlock()
}

// DrainNotifs implements plane.Drainer: the notifications queued for a's
// grants, and, while it is current, those routed to no attachment. If
// another live attachment's wait while its wake may have gone to another
// waiter of Ready, Ready is signalled again (maxNudges).
func (a *attachment) DrainNotifs(dst []xfer.Notif) ([]xfer.Notif, error) {
	d := a.d
	if a.detached.Load() {
		return dst, nil
	}
	d.steps.drained()
	d.steps.mu.Lock()
	d.steps.readLocked() // before the queue: it queues what it reads
	d.steps.mu.Unlock()
	d.mu.Lock()
	current := d.att.Load() == a
	dst = d.takeNotifsLocked(dst, func(o *attachment) bool { return o == a || (o == nil && current) }, false)
	a.owed, a.nudges = false, 0
	nudge := false
	for _, o := range d.liveList() {
		if o != a && o.owed && o.nudges < maxNudges {
			o.nudges++
			nudge = true
		}
	}
	d.mu.Unlock()
	if nudge {
		d.notify()
	}
	return dst, nil
}

// Broken implements plane.Attachment.
func (a *attachment) Broken(dst []xfer.Notif) []xfer.Notif {
	a.mu.Lock()
	defer a.mu.Unlock()
	dst = append(dst, a.broken...)
	clear(a.broken)
	a.broken = a.broken[:0]
	return dst
}

// broke queues the notification of a READ served under a's gate whose
// connection closed before its done; false when a is detached, or its
// list is full (maxBroken): that grant then ends at its lease, counted in
// TCPStats.BrokenLost.
func (a *attachment) broke(agent string, notif []byte) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.detached.Load() {
		return false
	}
	if len(a.broken) >= a.maxBroken {
		a.d.brokenLost.Add(1)
		return false
	}
	a.broken = append(a.broken, xfer.Notif{Agent: agent, Msg: notif})
	return true
}

func (d *TCPData) clearBoard() {
	for i := range d.grantTab {
		d.grantTab[i].Store(0)
	}
}

// Publish implements plane.Attachment: the grant's slot shows its id,
// unless another live grant holds the slot (its consumer asks per READ).
// Only the current attachment shows grants: the board is cleared as the
// next one attaches, and an earlier one's consumers ask per READ.
func (a *attachment) Publish(id uint64) {
	t := a.d.grantTab
	if len(t) == 0 || id == 0 || a.detached.Load() || a.d.att.Load() != a {
		return
	}
	slot := &t[id%uint64(len(t))]
	if slot.CompareAndSwap(0, id) && (a.detached.Load() || a.d.att.Load() != a) {
		slot.CompareAndSwap(id, 0) // replaced or detached meanwhile: the board is the next session's
	}
}

// Retire implements plane.Attachment.
func (a *attachment) Retire(id uint64) {
	if t := a.d.grantTab; len(t) > 0 && id != 0 {
		t[id%uint64(len(t))].CompareAndSwap(id, 0)
	}
}

// OnNotify implements plane.Attachment.
func (a *attachment) OnNotify(f func() bool) {
	if f == nil || a.detached.Load() {
		a.hook.Store(nil)
		return
	}
	a.hook.Store(&f)
}

// bind notes that s presented a grant of consumer: it takes that
// session's pushes, if its hello offered room for them.
func (a *attachment) bind(s *servedConn, consumer uint64) {
	if s.room == 0 || consumer == 0 || a.detached.Load() {
		return
	}
	if s.att != nil && s.att != a {
		s.unbind() // its pushes are now another attachment's consumers'
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if s.att != a {
		s.att, s.bound = a, nil
	}
	if slices.Contains(s.bound, consumer) || a.detached.Load() {
		return
	}
	if len(s.bound) == maxBound {
		a.unbindLocked(s, s.bound[0])
		s.bound = slices.Delete(s.bound, 0, 1)
	}
	s.bound = append(s.bound, consumer)
	a.pushTo[consumer] = append(a.pushTo[consumer], s)
}

func (a *attachment) unbindLocked(s *servedConn, consumer uint64) {
	list := slices.DeleteFunc(a.pushTo[consumer], func(t *servedConn) bool { return t == s })
	if len(list) == 0 {
		delete(a.pushTo, consumer)
	} else {
		a.pushTo[consumer] = list
	}
}

// unbind forgets s, whose connection is closing.
func (s *servedConn) unbind() {
	a := s.att
	if a == nil {
		return
	}
	a.mu.Lock()
	if s.att == a {
		for _, k := range s.bound {
			a.unbindLocked(s, k)
		}
		s.bound = nil
	}
	a.mu.Unlock()
}

// Push implements plane.Attachment: it writes the grant's blocks, with
// notif, on a connection of consumer's that takes pushes of that size,
// without waiting. On a connection no one is writing to, it writes at
// once, and what the socket does not take is finished by a goroutine;
// when every such connection is being written to (an answer, another
// push), the push waits on one, behind that write, for its drainer
// (pushQueue bounds what waits). release is called when the bytes are out
// of the region, or will never be (the connection closed first).
func (a *attachment) Push(consumer uint64, notif []byte, blocks []int, release func()) bool {
	d := a.d
	size := len(blocks) * d.region.BlockSize()
	if size == 0 || size > maxPushSize || len(notif) > maxNotifLen || d.cfg.NoPush || a.detached.Load() {
		return false
	}
	// Counted before a connection is chosen: Close waits for the write,
	// or for the drainer.
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return false
	}
	d.wg.Add(1)
	d.mu.Unlock()
	by := a.pushBy()
	a.mu.Lock()
	var s, busy *servedConn
	for _, t := range a.pushTo[consumer] {
		// A quarter of what the consumer keeps: room for the next ones.
		if 4*size > t.room || t.nb == nil {
			continue
		}
		if t.wmu.TryLock() {
			s = t
			break
		}
		if busy == nil && a.waits(t, size) {
			busy = t
		}
	}
	if s == nil {
		queued := busy != nil && a.wait(busy, waitingPush{notif, blocks, release, by}, size)
		a.mu.Unlock()
		if !queued {
			d.wg.Done()
		}
		return queued
	}
	a.mu.Unlock()
	bufs := pushFrame(s, notif, blocks, size)
	rest, err := s.nb.writeAll(bufs)
	d.pushes.Add(1)
	if err != nil || len(rest) == 0 {
		s.wmu.Unlock()
		release()
		if err != nil {
			s.close() // its serve sees it and ends
		}
		d.wg.Done()
		return true
	}
	left := net.Buffers(slices.Clone(rest)) // s.bufs is the next push's
	go func() {
		defer d.wg.Done()
		err := writeBy(s.c, left, d.cfg.IOTimeout, by)
		s.wmu.Unlock()
		release()
		d.pushDone(s, err)
	}()
	return true
}

// pushFrame records a push of notif's grant, of blocks (size bytes), on
// s and returns its frame, the blocks' bytes in place; under s.wmu, whose
// scratch it uses.
func pushFrame(s *servedConn, notif []byte, blocks []int, size int) net.Buffers {
	s.pushed(notif, blocks)
	s.frame = appendPushHead(s.frame[:0], notif, uint64(size), blocks)
	s.bufs = append(s.bufs[:0], s.frame)
	s.runs = spans(s.runs[:0], blocks)
	for _, r := range s.runs {
		s.bufs = append(s.bufs, s.d.region.Span(r[0], r[1]))
	}
	return s.bufs
}

// waits reports whether a push of size bytes may wait on s. Under a.mu.
func (a *attachment) waits(s *servedConn, size int) bool {
	q := a.waiting[s]
	return q == nil || (len(q.pushes) < maxPushWaiting && 4*(q.bytes+size) <= s.room)
}

// wait queues a push on s, which another write holds, and starts s's
// drainer if none runs; the caller counted it in d.wg, which the drainer
// takes over (false: a already detached, nothing queued). Under a.mu.
func (a *attachment) wait(s *servedConn, w waitingPush, size int) bool {
	if a.detached.Load() {
		return false
	}
	w.notif, w.blocks = slices.Clone(w.notif), slices.Clone(w.blocks) // the caller's to reuse
	if q := a.waiting[s]; q != nil {
		q.pushes = append(q.pushes, w)
		q.bytes += size
		a.d.wg.Done() // its drainer is counted already
		return true
	}
	q := &pushQueue{pushes: []waitingPush{w}, bytes: size}
	a.waiting[s] = q
	go a.drain(s, q)
	return true
}

// drain writes the pushes waiting on s, each time s's write lock comes
// free, until none waits. Those left when s closed, or a was detached, are
// not written, and their holds end.
func (a *attachment) drain(s *servedConn, q *pushQueue) {
	d := a.d
	defer d.wg.Done()
	for {
		s.wmu.Lock()
		a.mu.Lock()
		batch := q.pushes
		q.pushes, q.bytes = nil, 0
		if len(batch) == 0 {
			delete(a.waiting, s)
			a.mu.Unlock()
			s.wmu.Unlock()
			return
		}
		a.mu.Unlock()
		for _, w := range batch {
			switch {
			case isClosed(s.gone) || a.detached.Load():
			case !w.by.IsZero() && !time.Now().Before(w.by):
				d.pushesCut.Add(1) // its time went by in the queue: its READ asks
			default:
				size := len(w.blocks) * d.region.BlockSize()
				d.pushDone(s, writeBy(s.c, pushFrame(s, w.notif, w.blocks, size), d.cfg.IOTimeout, w.by))
				d.pushes.Add(1)
			}
			w.release()
		}
		s.wmu.Unlock()
	}
}

// isClosed reports whether ch is closed.
func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}
