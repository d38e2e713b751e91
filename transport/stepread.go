package transport

import (
	"errors"
	"sync"
	"sync/atomic"
	"time"
)

// Reading in the step. A message that wakes a goroutine waiting in Go's
// poller costs tens of microseconds of CPU on a small VM, and, beside an
// engine that keeps every processor busy, a quarter of a millisecond of
// the engine's time (docs/performance.md, "Beside a busy engine"). An
// engine that calls Drain every step and never waits can read its sockets
// itself, for a system call that finds nothing most of the time; and only
// if their descriptors are out of Go's poller, which otherwise wakes a
// sleeping thread for every message whether or not anyone waits on it
// (quietConn.detach, done by the first Drain that reads a hot connection,
// in tryRead).
//
// So a connection is read by one of three readers, never two at once:
//
//   - cold (at first): its goroutine, waiting in Go's poller, hands whole
//     messages to the owner's queue, which Drain and Wait take from;
//   - hot: Drain reads what the socket has, without waiting, and takes
//     the messages itself; the goroutine waits to be cooled;
//   - hot and mine (a Client's, one at a time): Drain as above, and a
//     loop's wait reads it too, in the poller (Client.waitOwn), where a
//     hand-off from the goroutine would wake a second thread for each
//     reply. A Drain skips it, and a cool waits, while that wait reads.
//
// The connections are the control plane's (a Server's or a Client's;
// their Drain), a producer's served data connections that bring
// notifications alone (TCPData's DrainNotifs; anything else they bring
// cools them, and their goroutine handles it), and a consumer's
// connections to producers (the Pool's Step; see linkConn). The data
// plane keeps two sets, the producer's and the consumer's: a loop's wait
// cools both (it may step both), a producer's Serve only its own.
//
// A connection is heated by its own goroutine, between messages, while its
// owner is stepped: no one waits in Wait, and Drain ran at least twice
// since anyone last did, the last time within coolAfter and the one
// before within stepsAtMost of it. A Drain takes the queue and reads the
// hot sockets under mu, which heating takes too, so what a goroutine
// delivered before its connection was heated is taken before what a Drain
// reads from it: a connection's messages stay in order. It is cooled, and
// its goroutine woken, when someone waits; when no Drain ran for
// coolAfter (an owner that stopped stepping without waiting: a timer,
// armed while anything is hot and pushed back by each Drain, checks);
// when its socket is closed or fails; when a large frame is on its way
// (the goroutine reads it whole, faster); and after idleDrains Drains in a
// row found nothing on it. A loop that waits between steps (the README's idle
// loop) heats nothing, and Serve, whose steps run where messages arrive,
// holds its planes waiting for its whole run (the data plane's served
// connections alone: a Pool may step on the same plane).
type stepReads struct {
	mu      sync.Mutex // held by Drain; the hot set, the scratch buffer
	hot     []stepConn
	buf     []byte
	waiters int         // in Wait now, under mu
	timer   *time.Timer // checks that Drain still runs, while anything is hot
	armed   bool        // under mu
	pushing atomic.Bool // armed, for Drain: each Drain pushes the timer back
	drains  atomic.Int64
	last    atomic.Int64  // monoNow of the last Drain
	gap     atomic.Int64  // between the last two Drains
	taken   atomic.Uint64 // messages read in Drain, for tests
	checks  atomic.Uint64 // the timer's checks, for tests
	// patience replaces coolAfter where set: tests whose connections must
	// stay hot on a machine that may pause a goroutine that long.
	patience atomic.Int64

	// The owner's own wait (a Client's: its guardConfig.own). A loop
	// that waits between its steps keeps one hot connection, mine, across
	// its waits, and reads it itself while it waits (Client.waitOwn):
	// in Go's poller, the reply wakes the goroutine that waits for it,
	// where a hand-off from the connection's goroutine wakes a second
	// thread. mine is heated by its goroutine as it delivers to a loop
	// that waits (heatOwn), and cooled as any hot connection is, but
	// never while the waiter reads it. What else should end that wait
	// interrupts its read (interrupt): reading is the connection it
	// reads, under imu.
	mine    *guardConn // under mu
	ownBusy bool       // under mu: a waiter holds mine (holdOwn to waitedOwn)
	// asked: holdOwn found no mine, and the wait that follows is a loop's
	// that would read one (wantsOwn, from hold, until the next hold);
	// only such a loop is given one. A loop that waits as before is not:
	// each of its waits would cool it again.
	asked, wantsOwn bool       // under mu
	coolOwn         bool       // under mu: mine is to be cooled once its waiter is done
	imu             sync.Mutex // taken after mu, before the connection's own locks
	reading         *guardConn
	poked           bool // under imu: interrupted since holdOwn, before the read began
	// misses counts messages other connections queued since mine last
	// brought one: at ownMisses, mine is handed back, so that a producer
	// whose replies moved (the same-host socket) or that went quiet does
	// not keep the place of one that answers.
	misses atomic.Int32
	// waitedAt is when the last wait ended (monoNow): mine is taken out of
	// the poller by a Drain coolAfter later, its owner stepping without
	// waiting.
	waitedAt  atomic.Int64
	afterRead func(g *guardConn) // tests: runs as each of the waiter's reads returns
	wakeOwner func()             // ends a wait of the owner's that is not reading mine
}

// after is coolAfter, or the patience a test set; longest, stepsAtMost
// in proportion.
func (st *stepReads) after() time.Duration {
	if p := st.patience.Load(); p > 0 {
		return time.Duration(p)
	}
	return coolAfter
}

func (st *stepReads) longest() time.Duration { return st.after() / (coolAfter / stepsAtMost) }

// monoEpoch anchors monoNow: durations between its readings are the
// monotonic clock's, whatever the wall clock does.
var monoEpoch = time.Now()

// monoNow is the time since monoEpoch, on the monotonic clock.
func monoNow() int64 { return int64(time.Since(monoEpoch)) }

// stepConn is a connection a Drain can read: the control plane's
// (guardConn) and the data plane's served ones (servedConn).
type stepConn interface {
	// readNow reads what the socket has, without waiting, and handles the
	// whole messages; false: the connection is to be cooled.
	readNow(buf []byte) bool
	// setHot sets whether Drains read the connection, under its own lock;
	// a connection that is within a message, or closed, is not heated.
	setHot(on bool) bool
	// wake wakes its goroutine, waiting to be cooled.
	wake()
}

// A Drain's work is bounded: it reads at most maxHot connections, each
// up to four buffers and, a link, hotFrames frames (readNow); a
// connection that brought nothing for
// idleDrains Drains goes back to its goroutine, and another may take its
// place.
const (
	coolAfter = 20 * time.Millisecond
	// stepsAtMost is the longest step of an owner whose connections are
	// heated: one that steps more slowly would see the timer cool them
	// before its next step, for a heat and a cool per step and no read.
	stepsAtMost = coolAfter / 4
	idleDrains  = 1024
	ownMisses   = 2
	maxHot      = 32
)

// drained notes a Drain.
//
// While anything is hot it pushes the timer back to coolAfter from now,
// so that an owner that keeps stepping is never woken by it.
func (st *stepReads) drained() {
	st.drains.Add(1)
	now := monoNow()
	st.gap.Store(now - st.last.Swap(now))
	if st.pushing.Load() {
		st.timer.Reset(st.after())
	}
}

// drain is a Drain's read of the hot connections.
func (st *stepReads) drain() {
	st.drained()
	st.mu.Lock()
	st.readLocked()
	st.mu.Unlock()
}

// wait notes that the owner waits until done is called, cooling every hot
// connection: their goroutines read for the waiter.
func (st *stepReads) wait() (done func()) {
	st.hold()
	return st.waited
}

// hold is wait, for a caller that calls waited itself.
func (st *stepReads) hold() {
	st.mu.Lock()
	st.wantsOwn, st.asked = st.asked, false
	st.waiters++
	st.drains.Store(0)
	st.coolAllLocked()
	st.mu.Unlock()
}

// holdOwn is hold for a waiter that reads mine itself: every other hot
// connection is cooled. nil, and nothing held: there is no mine, or
// someone else waits.
func (st *stepReads) holdOwn() *guardConn {
	st.mu.Lock()
	defer st.mu.Unlock()
	g := st.mine
	if g == nil || st.waiters > 0 {
		st.asked = true
		return nil
	}
	st.waiters++
	st.ownBusy = true
	st.drains.Store(0)
	st.coolAllBut(g)
	g.Conn.(*quietConn).stayIn.Store(true) // waited on again: back in the poller
	st.imu.Lock()
	st.poked = false
	st.imu.Unlock()
	return g
}

// startReading notes that the waiter reads g until dl (zero: no limit),
// so that interrupt can end the read; false: interrupted already, since
// holdOwn.
func (st *stepReads) startReading(g *guardConn, dl time.Time) bool {
	st.imu.Lock()
	defer st.imu.Unlock()
	if st.poked {
		return false
	}
	st.reading = g
	g.Conn.SetReadDeadline(dl)
	return true
}

// stopReading ends startReading: the deadline is gone before anyone else
// may read g.
func (st *stepReads) stopReading(g *guardConn) {
	st.imu.Lock()
	st.reading = nil
	g.Conn.SetReadDeadline(time.Time{})
	st.imu.Unlock()
}

// handBack asks for mine to go back to its goroutine once its waiter is
// done (waitedOwn); the waiter's.
func (st *stepReads) handBack() {
	st.mu.Lock()
	st.coolOwn = true
	st.mu.Unlock()
}

// waitedOwn ends holdOwn's wait: mine is cooled now if someone asked
// while the waiter read it, or the waiter did (handBack).
func (st *stepReads) waitedOwn() {
	st.mu.Lock()
	st.ownBusy = false
	if st.coolOwn {
		st.coolOwn = false
		st.coolAllBut(nil) // mine is all that is hot: holdOwn cooled the rest
	}
	st.mu.Unlock()
	st.waited()
}

func (st *stepReads) coolAllLocked() { st.coolAllBut(nil) }

// coolAllBut cools every hot connection but keep (nil: all). Mine, while
// its waiter reads it, is kept too, cooled when the waiter is done
// (waitedOwn): two readers at once could hand its messages on out of
// order.
func (st *stepReads) coolAllBut(keep *guardConn) {
	if st.ownBusy && keep == nil && st.mine != nil {
		keep = st.mine
		st.coolOwn = true
		st.interrupt()
	}
	kept := false
	for _, c := range st.hot {
		if keep != nil && c == stepConn(keep) {
			kept = true
			continue
		}
		cool(c)
	}
	clear(st.hot)
	st.hot = st.hot[:0]
	if kept {
		st.hot = append(st.hot, keep)
	} else {
		st.mine = nil
	}
	st.pushing.Store(false) // the timer fires once more, and disarms
}

// heatOwn makes g mine, hot, if its owner's last wait would have read
// one and nothing is hot: called by g's goroutine just after it queued a
// message, which wakes that owner if it still waits. Its Drains read g
// from then on, and its next wait reads g itself.
func (st *stepReads) heatOwn(g *guardConn) bool {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.mine != nil && st.mine != g {
		if st.misses.Add(1) < ownMisses {
			return false
		}
		if st.ownBusy {
			st.coolOwn = true // its waiter, which this message woke, hands it back
			return false
		}
		st.coolAllBut(nil)
	}
	// A wait under way is the one that asked. It is woken again below:
	// the message's own wake-up may have been taken by a Drain, and this
	// wait begun after it, with g's goroutine about to stop reading. With
	// another wait beside it, that one would sleep with g unread.
	if !st.wantsOwn || st.waiters > 1 || st.ownBusy || len(st.hot) > 0 || st.mine != nil || !g.setHot(true) {
		return false
	}
	g.Conn.(*quietConn).stayIn.Store(true) // the waiter reads it in the poller
	st.hot = append(st.hot, g)
	st.mine = g
	st.misses.Store(0)
	st.armLocked()
	st.pushing.Store(true)
	if st.waiters > 0 && st.wakeOwner != nil {
		st.wakeOwner() // its next wait reads g
	}
	return true
}

// interrupt ends the waiter's read of mine, if one runs: something else
// is for the loop.
func (st *stepReads) interrupt() {
	st.imu.Lock()
	if g := st.reading; g != nil {
		g.Conn.SetReadDeadline(longAgo)
	} else {
		st.poked = true // for a waiter between holdOwn and its read
	}
	st.imu.Unlock()
}

// longAgo is a deadline already passed.
var longAgo = time.Unix(1, 0)

// check cools everything if no Drain ran for coolAfter; the timer's.
func (st *stepReads) check() {
	st.checks.Add(1)
	st.mu.Lock()
	defer st.mu.Unlock()
	since := time.Duration(monoNow() - st.last.Load())
	if st.ownBusy {
		// Mine, all that is hot, is its waiter's to read; waited arms
		// the timer again.
		st.armed = false
		st.pushing.Store(false)
		return
	}
	if since >= st.after() {
		st.coolAllLocked()
	}
	st.armed = len(st.hot) > 0
	st.pushing.Store(st.armed)
	if st.armed {
		st.timer.Reset(st.after() - since)
	}
}

func (st *stepReads) waited() {
	st.waitedAt.Store(monoNow())
	st.mu.Lock()
	st.waiters--
	if st.waiters == 0 && len(st.hot) > 0 {
		st.armLocked() // mine, kept over the wait: cooled if no Drain follows
		st.pushing.Store(true)
	}
	st.mu.Unlock()
}

// armLocked arms the timer that checks that Drain still runs.
func (st *stepReads) armLocked() {
	if st.armed {
		return
	}
	st.armed = true
	if st.timer == nil {
		st.timer = time.AfterFunc(st.after(), st.check)
	} else {
		st.timer.Reset(st.after())
	}
}

// heat makes c hot if its owner is stepped; called by c's goroutine,
// between messages.
func (st *stepReads) heat(c stepConn) {
	after := st.after()
	if st.drains.Load() < 2 || monoNow()-st.last.Load() > int64(after) || st.gap.Load() > int64(st.longest()) {
		return
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.waiters > 0 || len(st.hot) >= maxHot || !c.setHot(true) {
		return
	}
	st.hot = append(st.hot, c)
	st.armLocked()
	st.pushing.Store(true)
}

// cool clears c's hot flag, under st.mu, and wakes its goroutine.
func cool(c stepConn) {
	c.setHot(false)
	c.wake()
}

// setHot implements stepConn.
func (g *guardConn) setHot(on bool) bool {
	if _, ok := g.Conn.(*quietConn); on && !ok {
		return false
	}
	g.smu.Lock()
	defer g.smu.Unlock()
	if on {
		select {
		case <-g.done:
			return false
		default:
		}
		if len(g.in) > 0 {
			return false // within a message
		}
	}
	g.hot.Store(on)
	g.empty = 0
	if q, ok := g.Conn.(*quietConn); ok && !on {
		q.stayIn.Store(false)
	}
	return true
}

// wake implements stepConn.
func (g *guardConn) wake() {
	select {
	case g.cool <- struct{}{}:
	default:
	}
}

// readLocked reads what the hot connections' sockets have, under mu,
// handing whole messages to their guardConfig's take, which may keep the
// frames' bodies (not the slice). A connection whose socket is closed,
// failed or stayed empty is cooled: its goroutine sees the same and
// handles it as it always does.
func (st *stepReads) readLocked() {
	if len(st.hot) == 0 {
		return
	}
	if st.buf == nil {
		st.buf = make([]byte, 16<<10)
	}
	if st.mine != nil && !st.ownBusy && monoNow()-st.waitedAt.Load() > int64(st.after()) {
		// Stepped, not waited on: out of the poller like the others.
		st.mine.Conn.(*quietConn).stayIn.Store(false)
	}
	keep := st.hot[:0]
	for _, c := range st.hot {
		if st.ownBusy && c == stepConn(st.mine) {
			keep = append(keep, c) // its waiter reads it
			continue
		}
		if c.readNow(st.buf) {
			keep = append(keep, c)
		} else {
			cool(c)
			if c == stepConn(st.mine) {
				st.mine = nil
			}
		}
	}
	clear(st.hot[len(keep):])
	st.hot = keep
	if len(keep) == 0 {
		st.pushing.Store(false)
	}
}

// readNow implements stepConn: it reads up to a few buffers.
func (g *guardConn) readNow(buf []byte) bool {
	if !g.smu.TryLock() {
		return true // its goroutine is cooling it, or was delivering
	}
	defer g.smu.Unlock()
	q := g.Conn.(*quietConn)
	for range 4 {
		n, err := q.tryRead(buf)
		if n > 0 {
			g.empty = 0
			g.received(n)
			g.sink = g.cfg.take
			if g.feed(buf[:n]) != nil {
				return false // closed
			}
			if len(g.in) > readChunk {
				return false // a large frame: its goroutine reads it
			}
		}
		switch {
		case errors.Is(err, errNothing):
			g.empty++
			return g.empty < idleDrains
		case err != nil:
			return false
		case n < len(buf):
			return true // it had no more
		}
	}
	return true
}
