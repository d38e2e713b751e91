package transport

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/ecxfer/ecxfer/xfer"
)

// link is one connection to a producer.
type link struct {
	p     *peer
	first bool       // pushes come on it: its hello offers to keep them
	mu    sync.Mutex // guards conn, nb, pending and headAt; never held across I/O
	wmu   sync.Mutex // one writer of conn at a time
	dial  sync.Mutex // one dial at a time
	conn  net.Conn
	nb    *nbWriter // conn's, for writes that must not wait
	lc    *linkConn // conn's, as a step reads it
	// welcomed is conn's: closed once its reader took the producer's
	// welcome (and its proof), or gave up on it.
	welcomed chan struct{}
	// welcomeErr says why the last connection gave up on its welcome.
	welcomeErr error
	// pending are the READs sent on conn and not answered, in order;
	// headAt is when pending[0] became the head: the deadline of its
	// answer runs from then (see arm).
	pending []*readOp
	headAt  time.Time
	frame   []byte // under wmu
}

var errReleased = errors.New("transport: a READ before it on the connection was released while landing")

func (l *link) writer() {
	defer l.p.d.wg.Done()
	var buf []byte
	var firstq chan *readOp // the first link's own queue
	if l.first {
		firstq = l.p.firstq
	}
	for {
		select {
		case <-l.p.stop:
			for {
				select {
				case op := <-l.p.queue:
					op.fail(errStopped)
				case op := <-firstq:
					op.fail(errStopped)
				case <-l.p.notes: // none comes after the stop (sendNotes)
					l.p.d.notesLost.Add(1)
					l.p.noting.Add(-1)
				default:
					return
				}
			}
		case op := <-l.p.queue:
			if op.state.Load() == opQueued {
				buf = l.sendOn().send(op, buf)
			}
		case op := <-firstq:
			if op.state.Load() == opQueued {
				buf = l.send(op, buf)
			}
		case n := <-l.p.notes:
			l.note(n)
		}
	}
}

// sendOn is the link a writer sends its READ on: its own, but the first
// while that one is down and the producer pushes to us. Pushes come on the
// first link only, after a READ there showed the producer whose connection
// it is; were READs to go only on the others, nothing would be pushed.
func (l *link) sendOn() *link {
	first := l.p.links[0]
	if l == first || l.p.push == nil || first.up() {
		return l
	}
	return first
}

func (l *link) up() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.conn != nil
}

// send writes op's READ on l, connecting first if it must; buf is scratch
// space, returned for the next READ.
func (l *link) send(op *readOp, buf []byte) []byte {
	conn, err := l.connect(context.Background())
	if err != nil {
		// A READ still queued when its peer is removed or the plane
		// closes (a consumer shutting down) fails quietly: the producer
		// was not unreachable.
		level := slog.LevelWarn
		if errors.Is(err, xfer.ErrClosed) {
			level = slog.LevelDebug
		}
		l.p.d.log.Log(context.Background(), level, "ec data: cannot reach producer", "peer", l.p.name, "addr", l.p.addr, "err", err)
		if errors.Is(err, xfer.ErrClosed) || l.p.stopped() {
			op.fail(errStopped)
		} else {
			op.fail(fmt.Errorf("transport: cannot reach the producer at %s: %w", l.p.addr, err))
		}
		return buf
	}
	buf = appendRead(buf[:0], op.id, op.notif, op.n, op.remote, op.resend)
	// Under wmu from the enqueue: the order of pending is the order of
	// the writes, whichever goroutine writes (PostRead may, see tryPost).
	l.wmu.Lock()
	if !l.enqueue(conn, op) {
		l.wmu.Unlock()
		return buf
	}
	err = writeFull(conn, net.Buffers{buf}, l.p.d.cfg.IOTimeout)
	l.wmu.Unlock()
	if err != nil {
		l.breakIf(conn, err)
	}
	return buf
}

// enqueue moves op from queued to sent on conn, the caller about to write
// its frame (holding wmu). false: conn broke meanwhile (op failed) or op
// was released.
//
// A READ's link is set before its state says sent, so that whoever sees
// it sent sees the connection it went on: a push that comes while the
// frame is being written lands it (takePush), as the producer, which
// pushed before it read the frame, answers "pushed". Set on a READ that
// then is not sent, the link is never read.
func (l *link) enqueue(conn net.Conn, op *readOp) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.conn != conn {
		op.fail(errors.New("transport: its connection to the producer closed before it was sent"))
		return false
	}
	op.link.Store(l)
	if !op.state.CompareAndSwap(opQueued, opSent) {
		return false
	}
	if f := l.p.sentHook.Load(); f != nil {
		(*f)(op)
	}
	op.sentAt = time.Now()
	l.pending = append(l.pending, op)
	if len(l.pending) == 1 {
		l.headAt = op.sentAt
		l.armLocked()
	}
	return true
}

// armLocked sets conn's read deadline for the answer at the head: the head
// has IOTimeout from when it became the head (its READ was sent, or the
// answer ahead of it landed), however long the connection idled before,
// and however long the READs ahead of it took. No READ waiting: none.
func (l *link) armLocked() {
	if l.conn == nil {
		return
	}
	if len(l.pending) == 0 {
		l.conn.SetReadDeadline(time.Time{})
		return
	}
	l.conn.SetReadDeadline(l.headAt.Add(l.p.d.cfg.IOTimeout))
}

// tryPost sends op's READ on a connected link that no one is writing to,
// on the caller's goroutine, when the socket takes the frame without
// waiting: the READ then leaves without a hand-off to a writer goroutine.
// false: no link was free, and op goes to the writers' queue.
func (p *peer) tryPost(op *readOp) bool {
	if p.push != nil && !p.links[0].up() {
		// The link pushes come on is down: a writer brings it up with this
		// READ (sendOn).
		return false
	}
	for _, l := range p.links {
		if l.tryPost(op) {
			return true
		}
	}
	return false
}

// tryPost sends op's READ on l, if it is connected and no one is writing
// to it, without waiting.
func (l *link) tryPost(op *readOp) bool {
	if !l.wmu.TryLock() {
		return false
	}
	l.mu.Lock()
	conn, nb := l.conn, l.nb
	l.mu.Unlock()
	if conn == nil || nb == nil {
		l.wmu.Unlock()
		return false
	}
	l.frame = appendRead(l.frame[:0], op.id, op.notif, op.n, op.remote, op.resend)
	if l.enqueue(conn, op) {
		l.sendFrameLocked(conn, nb)
	} else {
		l.wmu.Unlock()
	}
	return true
}

// sendFrameLocked writes l.frame on conn without waiting; the caller holds
// wmu, which is released at once, or, when the socket took the frame only
// in part, by a goroutine of its own once it wrote the rest. A write that
// fails breaks the connection, and its error is returned.
func (l *link) sendFrameLocked(conn net.Conn, nb *nbWriter) error {
	n, err := nb.write(l.frame)
	switch {
	case err != nil:
		l.wmu.Unlock()
		l.breakIf(conn, err)
		return err
	case n < len(l.frame):
		rest := net.Buffers{append([]byte(nil), l.frame[n:]...)}
		l.p.d.wg.Add(1)
		go func() {
			defer l.p.d.wg.Done()
			err := writeFull(conn, rest, l.p.d.cfg.IOTimeout)
			l.wmu.Unlock()
			if err != nil {
				l.breakIf(conn, err)
			}
		}()
	default:
		l.wmu.Unlock()
	}
	return nil
}

// note sends one notification, connecting if it must.
func (l *link) note(n []byte) {
	defer l.p.noting.Add(-1) // sendNotes counted it
	conn, err := l.connect(context.Background())
	if err != nil {
		l.p.d.notesLost.Add(1)
		return
	}
	l.wmu.Lock()
	err = writeFull(conn, net.Buffers{appendNotify(nil, n)}, l.p.d.cfg.IOTimeout)
	l.wmu.Unlock()
	if err != nil {
		l.breakIf(conn, err)
	}
}

// breakIf breaks conn if it is still the link's connection.
func (l *link) breakIf(conn net.Conn, err error) {
	l.mu.Lock()
	if l.conn == conn {
		l.breakLocked(err)
	}
	l.mu.Unlock()
}

// breakOp breaks the connection op's bytes are landing from (Release).
func (l *link) breakOp(op *readOp) {
	l.mu.Lock()
	if op.from.Load() == l {
		l.breakLocked(errReleased)
	}
	l.mu.Unlock()
}

// breakLocked closes the connection and fails every READ sent on it that
// is not landing (its lander fails it, as the connection closed).
func (l *link) breakLocked(err error) {
	if l.conn != nil {
		l.conn.Close()
		l.lc.close()
		l.conn, l.nb, l.lc = nil, nil, nil
		l.p.d.log.Debug("ec data: connection to producer closed", "peer", l.p.name, "err", err)
	}
	why := fmt.Errorf("transport: its connection to the producer closed: %w", err)
	for _, op := range l.pending {
		op.fail(why)
	}
	clear(l.pending)
	l.pending = l.pending[:0]
}

// connect returns the live connection, dialing one if there is none (ctx
// bounds the dial, with DialTimeout).
func (l *link) connect(ctx context.Context) (net.Conn, error) {
	l.dial.Lock()
	defer l.dial.Unlock()
	l.mu.Lock()
	c := l.conn
	l.mu.Unlock()
	if c != nil {
		return c, nil
	}
	if l.p.stopped() {
		return nil, xfer.ErrClosed
	}
	// Whoever asked (a READ's writer, a contact), the dial ends with the
	// peer: Close and RemoveRemotePeer do not wait for DialTimeout.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(l.p.dials, cancel)()
	dialer := net.Dialer{Timeout: l.p.d.cfg.DialTimeout}
	c, err := dialer.DialContext(ctx, "tcp", l.p.addr)
	if err != nil {
		return nil, err
	}
	if tc, ok := c.(*net.TCPConn); ok {
		tuneConn(tc)
	}
	c = quietIO(c)
	room := 0
	if l.first && l.p.push != nil {
		room = l.p.push.cap
	}
	var challenge []byte
	if l.p.sh != nil {
		challenge = l.p.sh.challenge[:]
	}
	if err := writeFull(c, net.Buffers{appendHello(nil, l.p.d.name, uint32(room), challenge)}, l.p.d.cfg.IOTimeout); err != nil {
		c.Close()
		return nil, err
	}
	l.mu.Lock()
	if l.p.stopped() {
		l.mu.Unlock()
		c.Close()
		return nil, xfer.ErrClosed
	}
	welcomed := make(chan struct{})
	lc := newLinkConn(l, c)
	l.conn, l.nb, l.lc, l.welcomed = c, newNBWriter(c), lc, welcomed
	l.mu.Unlock()
	l.p.d.wg.Add(1)
	go l.reader(lc, welcomed)
	return c, nil
}

// contact brings the link's connection up and waits for the producer's
// welcome on it: once it returns nil, a READ on the link pays for no
// connection, and a same-host producer's proof is in. It fails when the
// connection broke first.
func (l *link) contact(ctx context.Context) error {
	c, err := l.connect(ctx)
	if err != nil {
		return err
	}
	l.mu.Lock()
	welcomed := l.welcomed
	up := l.conn == c
	l.mu.Unlock()
	if !up {
		return fmt.Errorf("transport: connection to %s closed before its welcome", l.p.addr)
	}
	select {
	case <-welcomed:
	case <-ctx.Done():
		return ctx.Err()
	}
	if !l.up() {
		l.mu.Lock()
		err := l.welcomeErr
		l.mu.Unlock()
		if err == nil {
			err = errors.New("closed")
		}
		return fmt.Errorf("transport: connection to %s before its welcome: %w", l.p.addr, err)
	}
	return nil
}

// reader takes the producer's welcome, then its answers in order, landing
// each READ's bytes straight in the local blocks, and its pushes; between
// frames, while the owner steps, it leaves them to its Drains (park).
func (l *link) reader(lc *linkConn, welcomed chan struct{}) {
	defer l.p.d.wg.Done()
	c := lc.c
	in := &deadlineReader{c: c, timeout: l.p.d.cfg.IOTimeout}
	r := bufio.NewReaderSize(lc.reader(in), 64<<10)
	err := l.welcome(r, in)
	if err != nil {
		if ne := net.Error(nil); errors.As(err, &ne) && ne.Timeout() {
			err = fmt.Errorf("%w: %w", errNoWelcome, err)
		}
		l.mu.Lock()
		l.welcomeErr = err
		l.mu.Unlock()
		l.breakIf(c, err) // before the close: contact sees the link down
	}
	close(welcomed)
	done := func(id uint64) error { return l.done(c, id) }
	for err == nil {
		if r.Buffered() == 0 {
			lc.park()
		}
		// The head's deadline (arm), until a frame starts.
		in.progress = false
		l.mu.Lock()
		if l.conn == c {
			l.armLocked()
		}
		l.mu.Unlock()
		if _, err = r.Peek(1); err != nil {
			break
		}
		in.progress = true
		var typ byte
		var head [headLen]byte
		if typ, err = readHead(r, head[:]); err != nil {
			break
		}
		switch typ {
		case frameData:
			err = l.answer(c, r, done)
		case framePush:
			err = l.takePush(r)
		default:
			err = fmt.Errorf("%w: frame %d", errProtocol, typ)
		}
	}
	l.breakIf(c, err)
}

// welcome reads the producer's first frame: the proof that it owns the
// shared region we mapped, when we sent a challenge.
func (l *link) welcome(r *bufio.Reader, in *deadlineReader) error {
	l.mu.Lock()
	if l.conn == in.c {
		l.armLocked()
	}
	l.mu.Unlock()
	// Whatever waits on the link (READs, or notifications alone), the
	// welcome comes within the hello timeout, or the link breaks.
	in.c.SetReadDeadline(time.Now().Add(l.p.d.cfg.helloTimeout()))
	var b [headLen + proofLen]byte
	if _, err := r.Peek(1); err != nil {
		return err
	}
	in.progress = true
	typ, err := readHead(r, b[:])
	if err != nil {
		return err
	}
	if typ != frameWelcome {
		return fmt.Errorf("%w: frame %d before the welcome", errProtocol, typ)
	}
	if _, err := io.ReadFull(r, b[:proofLen]); err != nil {
		return err
	}
	if l.p.sh != nil {
		l.p.sh.verify(b[:proofLen])
	}
	return nil
}

// answer takes one data frame (its head read): the answer to the READ at
// the head of pending; done writes the done of a READ.
func (l *link) answer(c net.Conn, r frameReader, done func(id uint64) error) error {
	var b [17]byte
	if _, err := io.ReadFull(r, b[:]); err != nil {
		return err
	}
	id, status, size := binary.BigEndian.Uint64(b[:]), b[8], binary.BigEndian.Uint64(b[9:])
	l.mu.Lock()
	var op *readOp
	if len(l.pending) > 0 && l.pending[0].id == id {
		op = l.pending[0]
		l.pending[0] = nil
		l.pending = l.pending[1:]
	}
	l.mu.Unlock()
	if op == nil {
		return fmt.Errorf("%w: answer %d out of order", errProtocol, id)
	}
	bs := l.p.d.region.BlockSize()
	switch {
	case status == dataRefused && size == 0:
		op.refused.Store(true)
		op.fail(errRefusedOp)
	case status == dataPushed && size == 0:
		// Its push, earlier on this connection, landed it (or found it
		// released); one we dropped leaves it to fail, and be asked for
		// anew. Its done brings the notification.
		op.fail(errPushLost)
		if err := done(id); err != nil {
			return err
		}
	case status != dataOK || size != uint64(op.n)*uint64(bs):
		err := fmt.Errorf("%w: answer %d: status %d, %d bytes for %d blocks", errProtocol, id, status, size, op.n)
		op.fail(err)
		return err
	case op.claimFrom(l, opSent):
		// Once every byte is in, the producer's notification goes before
		// the READ is seen done, so that a consumer that then drops the
		// producer (or closes) does not lose it.
		err := l.landBytes(r, op)
		if err != nil {
			err = fmt.Errorf("transport: reading its answer: %w", err)
		} else if err = done(id); err != nil {
			err = fmt.Errorf("transport: writing its done: %w", err)
		}
		op.land(err)
		if err != nil {
			return err
		}
	default: // released (or failed) before its bytes came: drop them
		if _, err := r.Discard(int(size)); err != nil {
			return err
		}
		if err := done(id); err != nil {
			return err
		}
	}
	l.mu.Lock()
	l.headAt = time.Now() // the next READ's turn starts
	l.mu.Unlock()
	return nil
}

// done tells the producer every byte of READ id is in.
func (l *link) done(c net.Conn, id uint64) error {
	b := appendDone(make([]byte, 0, headLen+8), id)
	l.wmu.Lock()
	defer l.wmu.Unlock()
	return writeFull(c, net.Buffers{b}, l.p.d.cfg.IOTimeout)
}

// landBytes reads op's bytes straight into its blocks; the caller is its
// lander.
func (l *link) landBytes(r io.Reader, op *readOp) error {
	for _, run := range op.local {
		if _, err := io.ReadFull(r, l.p.d.region.Span(run[0], run[1])); err != nil {
			return err
		}
	}
	return nil
}

// deadlineReader is a connection read either under the deadline set for it
// (the head READ's, see armLocked), or, once a frame has started, with
// IOTimeout from each read: a READ fails when no byte of it moved for
// IOTimeout, however long it is.
type deadlineReader struct {
	c        net.Conn
	timeout  time.Duration
	progress bool
}

func (d *deadlineReader) Read(p []byte) (int, error) {
	if d.progress {
		d.c.SetReadDeadline(time.Now().Add(d.timeout))
	}
	return d.c.Read(p)
}

// writeFull writes bufs to c, failing only when the peer took no byte
// for timeout. Every write to a peer of unbounded size goes through it or
// writeBy: a deadline bounds the time without progress, never the time a
// write of many bytes takes.
func writeFull(c net.Conn, bufs net.Buffers, timeout time.Duration) error {
	return writeBy(c, bufs, timeout, time.Time{})
}

// writeBy is writeFull that also fails with errGrantTime at by, if set,
// however the bytes move. The caller holds c's write lock. Each try waits
// a quarter of timeout at most, so that a stall is noticed between
// timeout and 1.25 × timeout after the last byte the peer took.
func writeBy(c net.Conn, bufs net.Buffers, timeout time.Duration, by time.Time) error {
	defer c.SetWriteDeadline(time.Time{}) // one left behind would fail a later write that must not wait
	try := max(timeout/4, time.Millisecond)
	last := time.Now() // when the peer last took bytes, or the start
	for len(bufs) > 0 {
		dl := time.Now().Add(try)
		if stall := last.Add(timeout); stall.Before(dl) {
			dl = stall
		}
		if !by.IsZero() && by.Before(dl) {
			dl = by
		}
		c.SetWriteDeadline(dl)
		n, err := writeBufs(c, &bufs)
		if err == nil {
			continue
		}
		var ne net.Error
		if !errors.As(err, &ne) || !ne.Timeout() {
			return err
		}
		now := time.Now()
		if !by.IsZero() && !now.Before(by) {
			return errGrantTime
		}
		if n > 0 {
			last = now
		} else if now.Sub(last) >= timeout {
			return err
		}
	}
	return nil
}

// writeBufs writes *bufs on c, consuming it, until done or c's deadline.
func writeBufs(c net.Conn, bufs *net.Buffers) (int64, error) {
	if q, ok := c.(*quietConn); ok {
		return q.writeBuffers(bufs)
	}
	return bufs.WriteTo(c)
}

// tuneConn sets a data connection's options: no Nagle delay for the small
// frames, and socket buffers large enough to keep a READ's bytes moving.
func tuneConn(tc *net.TCPConn) {
	tc.SetNoDelay(true)
	tc.SetReadBuffer(4 << 20)
	tc.SetWriteBuffer(4 << 20)
}
