package transport

import (
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// quietConn is a TCP connection whose reads and writes enter the kernel as
// raw system calls. They never block (the runtime's poller waits for
// readiness, under the connection's deadlines), yet syscall.Read, Write and
// the runtime's writev tell the scheduler that they might, and the first
// such call after the process went idle wakes the runtime's monitor
// thread, which then sleeps in 20 µs steps until the process is idle
// again. A step loop idles between fetches, so that was a thread wakeup and
// several timer sleeps per fetch on each side, each taking a core from the
// peer on a small host. Race-detector builds make the same calls, and
// tell the detector which bytes the kernel moves and what it orders (see
// rawSys): the production path is the one the detector checks.
//
// While its owner steps, a hot connection (see stepReads) is also taken
// out of Go's poller: its descriptor is duplicated and the connection
// closed, so that a message arriving wakes no thread; Drain reads the
// duplicate without waiting. The first read or write that has to wait
// wraps the duplicate again (attach), and waits in the poller as before.
type quietConn struct {
	// mmu guards the mode: tc and raw while attached, fd while detached,
	// and is held over a detached descriptor's system calls, so that the
	// descriptor is not closed under one. Taken after rmu and wmu.
	mmu      sync.Mutex
	tc       sysConn // nil while detached
	raw      syscall.RawConn
	fd       int // the duplicate while detached, else -1
	detached atomic.Bool
	stayIn   atomic.Bool // tryRead leaves it in the poller: its owner waits on it
	closed   bool
	rdl, wdl time.Time // the deadlines, set again on attach
	laddr    net.Addr
	raddr    net.Addr

	rmu    sync.Mutex // one read at a time: the callback's state is shared
	rfn    func(fd uintptr) bool
	rb     []byte
	rn     int
	rEOF   bool
	rerr   syscall.Errno
	rnow   bool // tryRead: do not wait
	rempty bool // tryRead found nothing

	wmu  sync.Mutex
	wfn  func(fd uintptr) bool
	wvfn func(fd uintptr) bool
	wb   []byte
	wv   *net.Buffers
	iov  []syscall.Iovec
	wn   int64
	werr syscall.Errno
}

// sysConn is a socket whose descriptor quietConn can take: a TCP or a
// Unix-domain connection.
type sysConn interface {
	net.Conn
	SyscallConn() (syscall.RawConn, error)
	SetWriteBuffer(bytes int) error
}

// quietIO returns c with quiet reads and writes, or c itself if it is not
// a TCP or Unix-domain connection (a test's pipe, a proxy's wrapper).
func quietIO(c net.Conn) net.Conn {
	tc, ok := sysOf(c)
	if !ok {
		return c
	}
	raw, err := tc.SyscallConn()
	if err != nil {
		return c
	}
	q := &quietConn{tc: tc, raw: raw, fd: -1, laddr: tc.LocalAddr(), raddr: tc.RemoteAddr()}
	q.rfn, q.wfn, q.wvfn = q.readOnce, q.writeOnce, q.writevOnce // bound once: a closure per call allocates
	return q
}

// rawSys reads or writes b on the non-blocking descriptor fd without
// telling the scheduler. Race-detector builds make the same calls and tell
// the detector what the ordinary ones would (see raceWrote, raceRead).
func rawSys(trap, fd uintptr, b []byte) (int, syscall.Errno) {
	if raceEnabled && trap == syscall.SYS_WRITE {
		raceRead(b)
	}
	r, _, e := syscall.RawSyscall(trap, fd, uintptr(unsafe.Pointer(unsafe.SliceData(b))), uintptr(len(b)))
	if raceEnabled && trap == syscall.SYS_READ && e == 0 {
		raceWrote(b[:r])
	}
	return int(r), e
}

// ioSync orders, for the race detector only, what one goroutine wrote to a
// socket before what another read from one, as syscall.Write and Read
// tell it: bytes that cross the kernel carry a happens-before edge.
var ioSync sync.Mutex

// raceRead tells the race detector that b is read now (the kernel copies
// it out) and that what this goroutine did so far happens before any
// socket read that follows.
func raceRead(b []byte) {
	var chunk [4096]byte // copy reads its source as one range: cheap under the detector
	for len(b) > 0 {
		b = b[copy(chunk[:], b):]
	}
	ioSync.Lock()
	//lint:ignore SA2001 an empty critical section: the edge is the point
	ioSync.Unlock()
}

// raceWrote tells the race detector that the kernel wrote b, in this
// goroutine, after every socket write that came before.
func raceWrote(b []byte) {
	ioSync.Lock()
	//lint:ignore SA2001 an empty critical section: the edge is the point
	ioSync.Unlock()
	copy(b, b)
}

func (q *quietConn) readOnce(fd uintptr) bool {
	for {
		n, e := rawSys(syscall.SYS_READ, fd, q.rb)
		switch e {
		case 0:
			q.rn, q.rEOF = n, n == 0
			return true
		case syscall.EINTR:
			continue
		case syscall.EAGAIN:
			q.rempty = q.rnow
			return q.rnow // else the poller waits, within the deadline
		default:
			q.rerr = e
			return true
		}
	}
}

// errNothing is tryRead's answer when the socket has nothing to read.
var errNothing = errors.New("transport: nothing to read")

// tryRead reads what the socket has now, without waiting: errNothing if
// it has nothing. It is the hot reader's (a Drain's), so it takes the
// connection out of Go's poller first.
func (q *quietConn) tryRead(p []byte) (int, error) {
	if !q.detached.Load() && !q.stayIn.Load() {
		q.detach()
	}
	q.rmu.Lock()
	defer q.rmu.Unlock()
	q.rb, q.rn, q.rEOF, q.rerr, q.rnow, q.rempty = p, 0, false, 0, true, false
	raw, err := q.current(q.rfn, "read")
	if raw != nil {
		err = raw.Read(q.rfn)
	}
	q.rb, q.rnow = nil, false
	switch {
	case err != nil:
		return 0, err
	case q.rempty:
		return 0, errNothing
	case q.rerr != 0:
		return 0, q.opError("read", q.rerr)
	case q.rEOF:
		return 0, io.EOF
	}
	return q.rn, nil
}

// Read reads what the socket has, waiting for something as net.Conn does.
func (q *quietConn) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	q.rmu.Lock()
	defer q.rmu.Unlock()
	q.rb, q.rn, q.rEOF, q.rerr = p, 0, false, 0
	raw, err := q.current(nil, "read")
	if raw != nil {
		err = raw.Read(q.rfn)
	}
	q.rb = nil
	switch {
	case err != nil: // closed, or the deadline passed
		return 0, err
	case q.rerr != 0:
		return 0, q.opError("read", q.rerr)
	case q.rEOF:
		return 0, io.EOF
	}
	return q.rn, nil
}

func (q *quietConn) writeOnce(fd uintptr) bool {
	for len(q.wb) > 0 {
		n, e := rawSys(syscall.SYS_WRITE, fd, q.wb)
		switch e {
		case 0:
			q.wn += int64(n)
			q.wb = q.wb[n:]
		case syscall.EINTR:
		case syscall.EAGAIN:
			return false
		default:
			q.werr = e
			return true
		}
	}
	return true
}

// Write writes all of p, waiting for room as net.Conn does.
func (q *quietConn) Write(p []byte) (int, error) {
	q.wmu.Lock()
	defer q.wmu.Unlock()
	q.wb, q.wn, q.werr = p, 0, 0
	raw, err := q.current(q.wfn, "write")
	if raw != nil {
		err = raw.Write(q.wfn)
	}
	q.wb = nil
	if err == nil && q.werr != 0 {
		err = q.opError("write", q.werr)
	}
	return int(q.wn), err
}

// maxIov bounds the buffers one writev takes (Linux's IOV_MAX).
const maxIov = 1024

func (q *quietConn) writevOnce(fd uintptr) bool {
	v := q.wv
	for len(*v) > 0 {
		q.iov = q.iov[:0]
		for _, b := range *v {
			if len(b) == 0 {
				continue
			}
			if len(q.iov) == maxIov {
				break
			}
			var iv syscall.Iovec
			iv.Base = unsafe.SliceData(b)
			iv.SetLen(len(b))
			q.iov = append(q.iov, iv)
		}
		if len(q.iov) == 0 {
			*v = (*v)[:0]
			break
		}
		r, _, e := syscall.RawSyscall(syscall.SYS_WRITEV, fd, uintptr(unsafe.Pointer(&q.iov[0])), uintptr(len(q.iov)))
		switch e {
		case 0:
			q.wn += int64(r)
			consume(v, int64(r))
		case syscall.EINTR:
		case syscall.EAGAIN:
			return false
		default:
			q.werr = e
			return true
		}
	}
	return true
}

// writeBuffers writes all of *v with writev, consuming it as
// net.Buffers.WriteTo does, waiting for room as net.Conn does.
func (q *quietConn) writeBuffers(v *net.Buffers) (int64, error) {
	if raceEnabled {
		for _, b := range *v {
			raceRead(b)
		}
	}
	q.wmu.Lock()
	defer q.wmu.Unlock()
	q.wv, q.wn, q.werr = v, 0, 0
	raw, err := q.current(q.wvfn, "writev")
	if raw != nil {
		err = raw.Write(q.wvfn)
	}
	q.wv = nil
	clear(q.iov) // keep no pointer into the caller's buffers
	if err == nil && q.werr != 0 {
		err = q.opError("writev", q.werr)
	}
	return q.wn, err
}

// consume drops n written bytes from the front of *v.
func consume(v *net.Buffers, n int64) {
	for len(*v) > 0 {
		ln0 := int64(len((*v)[0]))
		if ln0 > n {
			(*v)[0] = (*v)[0][n:]
			return
		}
		n -= ln0
		(*v)[0] = nil
		*v = (*v)[1:]
	}
}

func (q *quietConn) opError(op string, e syscall.Errno) error {
	return &net.OpError{Op: op, Net: q.laddr.Network(), Source: q.laddr, Addr: q.raddr, Err: os.NewSyscallError(op, e)}
}

// current returns the connection to wait on with fn, attached; or, while
// detached, runs fn on the duplicate once and returns nil if it had no
// need to wait (fn nil: it always has), attaching otherwise. The caller
// holds rmu or wmu.
func (q *quietConn) current(fn func(fd uintptr) bool, op string) (syscall.RawConn, error) {
	q.mmu.Lock()
	defer q.mmu.Unlock()
	if q.closed {
		return nil, &net.OpError{Op: op, Net: q.laddr.Network(), Source: q.laddr, Addr: q.raddr, Err: net.ErrClosed}
	}
	if q.tc != nil {
		return q.raw, nil
	}
	if fn != nil && fn(uintptr(q.fd)) {
		return nil, nil
	}
	if err := q.attachLocked(); err != nil {
		return nil, &net.OpError{Op: op, Net: q.laddr.Network(), Source: q.laddr, Addr: q.raddr, Err: err}
	}
	return q.raw, nil
}

// detach takes the connection out of Go's poller, if no read or write is
// waiting in it; called by the one reader that reads it hot (Drain).
func (q *quietConn) detach() {
	q.rmu.Lock()
	defer q.rmu.Unlock()
	if !q.wmu.TryLock() {
		return // a write waits for room: try again at a later Drain
	}
	defer q.wmu.Unlock()
	q.mmu.Lock()
	defer q.mmu.Unlock()
	if q.closed || q.tc == nil {
		return
	}
	fd, derr := -1, error(nil)
	if err := q.raw.Control(func(s uintptr) { fd, derr = unix.FcntlInt(s, unix.F_DUPFD_CLOEXEC, 0) }); err != nil || derr != nil {
		return
	}
	q.tc.Close() // nothing waits in it: rmu and wmu are ours
	q.tc, q.raw, q.fd = nil, nil, fd
	q.detached.Store(true)
}

// attachLocked wraps the duplicate in a connection again, in Go's poller;
// under mmu, detached. On failure the connection is closed.
func (q *quietConn) attachLocked() error {
	f := os.NewFile(uintptr(q.fd), "")
	c, err := net.FileConn(f) // a duplicate of its own
	f.Close()
	q.fd = -1
	q.detached.Store(false)
	tc, ok := sysOf(c)
	if err == nil && !ok {
		c.Close()
		err = errors.New("not a TCP or Unix-domain connection")
	}
	if err != nil {
		q.closed = true
		return err
	}
	raw, err := tc.SyscallConn()
	if err != nil {
		tc.Close()
		q.closed = true
		return err
	}
	if !q.rdl.IsZero() {
		tc.SetReadDeadline(q.rdl)
	}
	if !q.wdl.IsZero() {
		tc.SetWriteDeadline(q.wdl)
	}
	q.tc, q.raw = tc, raw
	return nil
}

// Close closes the connection, attached or not.
func (q *quietConn) Close() error {
	q.mmu.Lock()
	defer q.mmu.Unlock()
	if q.closed {
		return &net.OpError{Op: "close", Net: q.laddr.Network(), Source: q.laddr, Addr: q.raddr, Err: net.ErrClosed}
	}
	q.closed = true
	if q.tc != nil {
		return q.tc.Close()
	}
	fd := q.fd
	q.fd = -1
	q.detached.Store(false)
	return unix.Close(fd)
}

func (q *quietConn) LocalAddr() net.Addr  { return q.laddr }
func (q *quietConn) RemoteAddr() net.Addr { return q.raddr }

func (q *quietConn) SetDeadline(t time.Time) error      { return q.setDeadline(t, true, true) }
func (q *quietConn) SetReadDeadline(t time.Time) error  { return q.setDeadline(t, true, false) }
func (q *quietConn) SetWriteDeadline(t time.Time) error { return q.setDeadline(t, false, true) }

// setDeadline keeps the read or write deadline for attach, and sets it on
// the attached connection.
func (q *quietConn) setDeadline(t time.Time, read, write bool) error {
	q.mmu.Lock()
	defer q.mmu.Unlock()
	if read {
		q.rdl = t
	}
	if write {
		q.wdl = t
	}
	switch {
	case q.tc == nil:
		return nil
	case read && write:
		return q.tc.SetDeadline(t)
	case read:
		return q.tc.SetReadDeadline(t)
	default:
		return q.tc.SetWriteDeadline(t)
	}
}

// rawWrite writes what the non-blocking descriptor fd takes of b, for
// nbWriter's callback (see quietConn).
func rawWrite(fd uintptr, b []byte) (int, error) {
	n, e := rawSys(syscall.SYS_WRITE, fd, b)
	if e != 0 {
		return 0, e
	}
	return n, nil
}

// SyscallConn returns a RawConn that follows the connection's mode: its
// calls run on the duplicate while detached, and wait in the poller only
// once attached again.
func (q *quietConn) SyscallConn() (syscall.RawConn, error) { return quietRaw{q}, nil }

type quietRaw struct{ q *quietConn }

func (r quietRaw) Control(f func(fd uintptr)) error {
	q := r.q
	q.mmu.Lock()
	defer q.mmu.Unlock() // detach cannot close tc under the call
	if q.closed {
		return net.ErrClosed
	}
	if q.tc != nil {
		return q.raw.Control(f)
	}
	f(uintptr(q.fd))
	return nil
}

// Read and Write hold rmu / wmu, as quietConn's own do, so that detach
// (which takes both) cannot close the attached connection under them.
func (r quietRaw) Read(f func(fd uintptr) bool) error {
	r.q.rmu.Lock()
	defer r.q.rmu.Unlock()
	raw, err := r.q.current(f, "read")
	if raw != nil {
		return raw.Read(f)
	}
	return err
}

func (r quietRaw) Write(f func(fd uintptr) bool) error {
	r.q.wmu.Lock()
	defer r.q.wmu.Unlock()
	raw, err := r.q.current(f, "write")
	if raw != nil {
		return raw.Write(f)
	}
	return err
}

// sysOf is c as a sysConn, if it is a TCP or Unix-domain connection.
func sysOf(c net.Conn) (sysConn, bool) {
	switch c := c.(type) {
	case *net.TCPConn:
		return c, true
	case *net.UnixConn:
		return c, true
	}
	return nil, false
}
