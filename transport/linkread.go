package transport

import (
	"encoding/binary"
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// A consumer's connection to a producer is read in its owner's step too
// (see stepReads): while the Pool steps, a Drain takes the pushes and the
// READ answers that came whole, lands them and writes their dones, so
// that a fetch over TCP wakes no goroutine. A frame over hotFrame (an
// answer of a large READ), one a Drain cannot handle without waiting (a
// done to write while another write holds the connection), a frame that
// stalls in part, an overdue answer, an error or an end of stream cool
// the connection: its goroutine reads what the Drains left, then the
// socket, and handles it as it always did. One implementation of each
// frame (answer, takePush) serves both readers.

// hotFrame bounds the frames a Drain takes whole: pushes (maxPushSize)
// and answers of as much, with their heads.
const hotFrame = maxPushSize + 64<<10

// hotChunk is the least room a Drain reads into; maxPre bounds what it
// holds of a connection: a frame in part and one read past it.
const (
	hotChunk = 64 << 10
	maxPre   = hotFrame + hotChunk
)

// hotFrames bounds the frames one Drain handles on one connection (with
// four reads at most): a producer that floods it makes no Step long.
const hotFrames = 64

// frameReader is what a link's frames are read from after their head:
// its goroutine's buffered reader, or a frame a Drain took whole.
type frameReader interface {
	io.Reader
	Discard(n int) (int, error)
}

// memFrame reads a frame a Drain took whole.
type memFrame struct{ b []byte }

func (m *memFrame) Read(p []byte) (int, error) {
	if len(m.b) == 0 {
		return 0, io.EOF
	}
	n := copy(p, m.b)
	m.b = m.b[n:]
	return n, nil
}

func (m *memFrame) Discard(n int) (int, error) {
	if n > len(m.b) {
		k := len(m.b)
		m.b = nil
		return k, io.ErrUnexpectedEOF
	}
	m.b = m.b[n:]
	return n, nil
}

// linkConn is a link's connection as a step reads it.
type linkConn struct {
	l     *link
	c     net.Conn
	smu   sync.Mutex // pre, empty, stall; held by a Drain reading it
	pre   []byte     // read by Drains and not handled: its goroutine reads them first
	empty int        // Drains in a row that found nothing
	stall int64      // monoNow when pre last held a frame in part and nothing came; 0: none
	hot   atomic.Bool
	cool  chan struct{}
	gone  chan struct{}
	shut  sync.Once
	mem   memFrame
	sent  bool // doneNow wrote the frame's done (and let go of wmu)
	done  func(id uint64) error
	// waiting are READs whose push may be on its way (viaAwait): the
	// next Drain lands those whose push came, and sends the rest, as
	// does a cool; under smu.
	waiting []*readOp
}

func newLinkConn(l *link, c net.Conn) *linkConn {
	lc := &linkConn{l: l, c: c, cool: make(chan struct{}, 1), gone: make(chan struct{})}
	lc.done = lc.doneNow
	return lc
}

// hotConn returns the link's connection if Drains read it.
func (l *link) hotConn() *linkConn {
	l.mu.Lock()
	lc := l.lc
	l.mu.Unlock()
	if lc == nil || !lc.hot.Load() {
		return nil
	}
	return lc
}

// await keeps op for the next Drain; false: the connection is no longer
// read by Drains, and op is to be sent now.
func (lc *linkConn) await(op *readOp) bool {
	lc.smu.Lock()
	defer lc.smu.Unlock()
	if !lc.hot.Load() {
		return false
	}
	lc.waiting = append(lc.waiting, op)
	return true
}

// sendWaiting sends the READs that waited for a Drain and were not
// landed by their push (missed: a Drain found none for them, not a cool);
// under smu.
func (lc *linkConn) sendWaiting(missed bool) {
	if len(lc.waiting) == 0 {
		return
	}
	p := lc.l.p
	for _, op := range lc.waiting {
		if op.state.Load() == opQueued {
			if missed {
				p.push.missed.Store(true)
			}
			p.sendFirst(op)
		}
	}
	clear(lc.waiting)
	lc.waiting = lc.waiting[:0]
}

// close wakes its goroutine if it waits to be cooled; the connection is
// closed by its link.
func (lc *linkConn) close() { lc.shut.Do(func() { close(lc.gone) }) }

// park lets the owner's Drains read the connection while the owner
// steps, and waits until it is cooled or closed; called by its goroutine
// between frames, with nothing buffered.
func (lc *linkConn) park() {
	lc.l.p.d.links.heat(lc)
	for lc.hot.Load() {
		select {
		case <-lc.cool:
		case <-lc.gone:
			return
		}
	}
}

// Read is what its goroutine reads: what Drains left, then the network.
func (lc *linkConn) reader(r io.Reader) io.Reader { return preRead{lc, r} }

type preRead struct {
	lc *linkConn
	r  io.Reader
}

func (p preRead) Read(b []byte) (int, error) {
	lc := p.lc
	lc.smu.Lock()
	if len(lc.pre) > 0 {
		n := copy(b, lc.pre)
		if lc.pre = lc.pre[n:]; len(lc.pre) == 0 {
			lc.pre = nil
		}
		lc.smu.Unlock()
		return n, nil
	}
	lc.smu.Unlock()
	return p.r.Read(b)
}

// setHot implements stepConn.
func (lc *linkConn) setHot(on bool) bool {
	if _, ok := lc.c.(*quietConn); on && !ok {
		return false
	}
	lc.smu.Lock()
	defer lc.smu.Unlock()
	if on {
		if isClosed(lc.gone) || len(lc.pre) > 0 {
			return false
		}
	}
	lc.hot.Store(on)
	lc.empty, lc.stall = 0, 0
	if !on {
		lc.sendWaiting(false)
	}
	return true
}

// wake implements stepConn.
func (lc *linkConn) wake() {
	select {
	case lc.cool <- struct{}{}:
	default:
	}
}

// readNow implements stepConn: it reads what the socket has and handles
// the frames that came whole; false: the connection is to be cooled, and
// what is left is its goroutine's.
func (lc *linkConn) readNow([]byte) bool {
	if !lc.smu.TryLock() {
		return true // its goroutine is cooling it
	}
	defer lc.smu.Unlock()
	defer lc.sendWaiting(true) // what this Drain's frames did not land
	q := lc.c.(*quietConn)
	got := false
	budget := hotFrames
	if len(lc.pre) > 0 && !lc.frames(&budget) { // left by the last Drain's budget
		return false
	}
	for range 4 {
		if budget == 0 {
			break
		}
		if cap(lc.pre)-len(lc.pre) < hotChunk && cap(lc.pre) < maxPre {
			grown := make([]byte, len(lc.pre), min(max(2*cap(lc.pre), 4*hotChunk), maxPre))
			copy(grown, lc.pre)
			lc.pre = grown
		}
		room := cap(lc.pre) - len(lc.pre)
		if room == 0 {
			return false // cannot be: frames took or refused what it held
		}
		n, err := q.tryRead(lc.pre[len(lc.pre):cap(lc.pre)])
		lc.pre = lc.pre[:len(lc.pre)+n]
		if n > 0 {
			got = true
			if !lc.frames(&budget) {
				return false
			}
		}
		switch {
		case errors.Is(err, errNothing):
		case err != nil:
			return false
		case n == room:
			continue // it may have more
		}
		break
	}
	if (len(lc.pre) == 0 || budget == 0) && lc.overdue() {
		if len(lc.pre) > 0 {
			// Frames keep coming, none of them the answer: the goroutine
			// would be as busy with them, so the connection ends here.
			lc.l.breakIf(lc.c, os.ErrDeadlineExceeded)
		}
		return false // its goroutine times the answer out
	}
	if budget == 0 {
		lc.stall = 0 // whole frames wait for the next Drain
		lc.empty = 0
		return true
	}
	if len(lc.pre) == 0 {
		if cap(lc.pre) > 4*hotChunk {
			lc.pre = nil // a burst's buffer goes with it
		}
		lc.stall = 0
		if got {
			lc.empty = 0
			return true
		}
		lc.empty++
		return lc.empty < idleDrains
	}
	// A frame in part: its goroutine takes one that stalls.
	now := monoNow()
	switch {
	case got || lc.stall == 0:
		lc.stall = now
	case time.Duration(now-lc.stall) > lc.l.p.d.links.longest():
		return false
	}
	return true
}

// overdue reports whether the answer at the head of the link's READs is
// past its deadline (see armLocked).
func (lc *linkConn) overdue() bool {
	l := lc.l
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.pending) > 0 && time.Since(l.headAt) >= l.p.d.cfg.IOTimeout
}

// frames handles the whole frames at the front of pre, at most *budget
// of them, keeping the rest; false: the connection is to be cooled (or
// broke).
func (lc *linkConn) frames(budget *int) bool {
	k, ok := 0, true
	for ok && *budget > 0 {
		b := lc.pre[k:]
		if len(b) < headLen {
			break
		}
		if string(b[:4]) != frameMagic {
			ok = false // its goroutine says what is wrong
			break
		}
		need, known := frameLen(b)
		if need > hotFrame {
			ok = false // unknown, or its goroutine's to read
		}
		if !ok || !known || len(b) < need {
			break
		}
		var handled bool
		handled, ok = lc.frame(b[4], b[headLen:need])
		if !handled {
			break
		}
		if !ok {
			return false // it broke: nothing is left
		}
		lc.l.p.d.links.taken.Add(1)
		*budget--
		k += need
	}
	if k == len(lc.pre) {
		lc.pre = lc.pre[:0]
	} else if k > 0 {
		lc.pre = lc.pre[:copy(lc.pre, lc.pre[k:])]
	}
	return ok
}

// frameLen returns the length of the frame b starts with, once b holds
// enough of it to tell (known); over hotFrame for a frame no Drain takes.
func frameLen(b []byte) (need int, known bool) {
	const never = hotFrame + 1
	switch b[4] {
	case frameData:
		if len(b) < headLen+17 {
			return 0, false
		}
		size := binary.BigEndian.Uint64(b[headLen+9:])
		if size > hotFrame {
			return never, true
		}
		return headLen + 17 + int(size), true
	case framePush:
		if len(b) < headLen+14 {
			return 0, false
		}
		nl, n := int(binary.BigEndian.Uint16(b[headLen:])), uint64(binary.BigEndian.Uint32(b[headLen+2:]))
		size := binary.BigEndian.Uint64(b[headLen+6:])
		if nl > maxNotifLen || n > hotFrame/4 || size > hotFrame {
			return never, true
		}
		return headLen + 14 + nl + 4*int(n) + int(size), true
	}
	return never, true
}

// frame handles one whole frame of type typ, body its bytes after the
// head: handled, whether it took it; ok, false when the connection is to
// be cooled. A frame that fails breaks the connection, as it would on its
// goroutine, and leaves nothing to it.
func (lc *linkConn) frame(typ byte, body []byte) (handled, ok bool) {
	l := lc.l
	lc.mem.b = body
	defer func() { lc.mem.b = nil }()
	var err error
	if typ == frameData {
		// Its done is written without waiting, under the write lock
		// taken here: with another write in progress the frame is its
		// goroutine's, which may wait.
		if !l.wmu.TryLock() {
			return false, false
		}
		lc.sent = false
		err = l.answer(lc.c, &lc.mem, lc.done)
		if !lc.sent {
			l.wmu.Unlock()
		}
	} else {
		err = l.takePush(&lc.mem)
	}
	if err != nil {
		lc.pre = nil
		l.breakIf(lc.c, err)
		return true, false
	}
	return true, true
}

// doneNow writes the done of READ id on the connection without waiting,
// the caller holding wmu, which it lets go of (at once, or once the rest
// of the frame is written).
func (lc *linkConn) doneNow(id uint64) error {
	l := lc.l
	lc.sent = true
	l.mu.Lock()
	conn, nb := l.conn, l.nb
	l.mu.Unlock()
	if conn != lc.c || nb == nil {
		l.wmu.Unlock()
		return net.ErrClosed
	}
	l.frame = appendDone(l.frame[:0], id)
	return l.sendFrameLocked(conn, nb)
}
