package transport

import (
	"net"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/ecxfer/ecxfer/internal/plane"
	"github.com/ecxfer/ecxfer/xfer"
)

// attachment is a producer session's hold on the data plane (see package
// internal/plane): its gate, its grants on the board, the connections
// proven to be its consumers' (for pushes), its notification hook. All of
// it goes with Detach, or with the next Attach.
type attachment struct {
	d        *TCPData
	gate     plane.Gate
	hook     atomic.Pointer[func() bool]
	detached atomic.Bool

	mu     sync.Mutex
	pushTo map[uint64][]*servedConn // by consumer session: connections that proved it, taking pushes
	broken []xfer.Notif             // READs served under its grants that cannot complete (Broken)
	// waiting are the pushes that found their connection being written
	// to, by connection: its drainer writes them once the write is done.
	waiting map[*servedConn]*pushQueue
}

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
}

// maxPushWaiting bounds the pushes waiting on one connection: as many as
// the grants it remembers pushing (servedConn.recent), so that none of
// theirs is forgotten before its READ comes.
const maxPushWaiting = 64

// maxBound is how many consumer sessions one connection takes pushes for:
// a consumer's data plane has a session per producer, or a few.
const maxBound = 8

// attach implements plane.Attacher: g gates the READs served from now on,
// alone or with TCPConfig.Authorize. An attachment already there is
// detached, and the board starts empty.
func (d *TCPData) attach(g plane.Gate) plane.Attachment {
	a := &attachment{d: d, gate: g, pushTo: map[uint64][]*servedConn{}, waiting: map[*servedConn]*pushQueue{}}
	if old := d.att.Swap(a); old != nil {
		old.drop()
	}
	d.clearBoard()
	return a
}

// Detach implements plane.Attachment.
func (a *attachment) Detach() {
	if a.d.att.CompareAndSwap(a, nil) {
		a.drop()
		a.d.clearBoard()
		return
	}
	a.drop()
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
// connection closed before its done; false when there is no room (its
// grant then ends with its lease) or a is detached.
func (a *attachment) broke(agent string, notif []byte) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.detached.Load() || len(a.broken) >= maxQueuedNotifs {
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
func (a *attachment) Publish(id uint64) {
	t := a.d.grantTab
	if len(t) == 0 || id == 0 || a.detached.Load() {
		return
	}
	slot := &t[id%uint64(len(t))]
	if slot.CompareAndSwap(0, id) && a.detached.Load() {
		slot.CompareAndSwap(id, 0) // detached meanwhile: the board is the next session's
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
		queued := busy != nil && a.wait(busy, notif, blocks, size, release)
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
		err := writeFull(s.c, left, d.cfg.IOTimeout)
		s.wmu.Unlock()
		release()
		if err != nil {
			s.close()
		}
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
func (a *attachment) wait(s *servedConn, notif []byte, blocks []int, size int, release func()) bool {
	if a.detached.Load() {
		return false
	}
	w := waitingPush{notif: slices.Clone(notif), blocks: slices.Clone(blocks), release: release} // the caller's to reuse
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
			if !isClosed(s.gone) && !a.detached.Load() {
				size := len(w.blocks) * d.region.BlockSize()
				if err := writeFull(s.c, pushFrame(s, w.notif, w.blocks, size), d.cfg.IOTimeout); err != nil {
					s.close()
				}
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
