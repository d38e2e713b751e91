package transport

import (
	"io"
	"net"
	"os"
	"sync"
	"syscall"
	"unsafe"
)

// quietConn is a TCP connection whose reads and writes enter the kernel as
// raw system calls. They never block (the runtime's poller waits for
// readiness), yet syscall.Read and syscall.Write tell the scheduler that
// they might, and the first such call after the process went idle wakes
// the runtime's monitor thread, which then polls every 20 µs until the
// process is idle again. A step loop idles between fetches, so that was a
// thread wakeup and a few timer sleeps per fetch on each side, each taking
// a core from the peer on a small host. net.Buffers.WriteTo still reaches
// the TCPConn's own writev (ordinary calls): it is used for a READ's bytes,
// where the call is long anyway.
type quietConn struct {
	*net.TCPConn
	raw syscall.RawConn

	rmu  sync.Mutex // one read at a time: the callback's state is shared
	rfn  func(fd uintptr) bool
	rb   []byte
	rn   int
	rEOF bool
	rerr syscall.Errno

	wmu  sync.Mutex
	wfn  func(fd uintptr) bool
	wb   []byte
	wn   int
	werr syscall.Errno
}

// quietIO returns c with quiet reads and writes, or c itself if it is not
// a TCP connection (a test's pipe, a proxy's wrapper).
func quietIO(c net.Conn) net.Conn {
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return c
	}
	raw, err := tc.SyscallConn()
	if err != nil {
		return c
	}
	q := &quietConn{TCPConn: tc, raw: raw}
	q.rfn, q.wfn = q.readOnce, q.writeOnce // bound once: a closure per call allocates
	return q
}

func rawSys(trap, fd uintptr, b []byte) (int, syscall.Errno) {
	if raceEnabled {
		// syscall.Read and Write tell the race detector that what was
		// written before a write happened before a read of it, as the
		// bytes do through the kernel; raw calls would not, and the
		// detector would report races that are not.
		var n int
		var err error
		if trap == syscall.SYS_READ {
			n, err = syscall.Read(int(fd), b)
		} else {
			n, err = syscall.Write(int(fd), b)
		}
		if e, ok := err.(syscall.Errno); ok {
			return max(n, 0), e
		}
		return n, 0
	}
	r, _, e := syscall.RawSyscall(trap, fd, uintptr(unsafe.Pointer(unsafe.SliceData(b))), uintptr(len(b)))
	return int(r), e
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
			return false // the poller waits, within the deadline
		default:
			q.rerr = e
			return true
		}
	}
}

// Read reads what the socket has, waiting for something as net.Conn does.
func (q *quietConn) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	q.rmu.Lock()
	defer q.rmu.Unlock()
	q.rb, q.rn, q.rEOF, q.rerr = p, 0, false, 0
	err := q.raw.Read(q.rfn)
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
			q.wn += n
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
	err := q.raw.Write(q.wfn)
	q.wb = nil
	if err == nil && q.werr != 0 {
		err = q.opError("write", q.werr)
	}
	return q.wn, err
}

func (q *quietConn) opError(op string, e syscall.Errno) error {
	return &net.OpError{Op: op, Net: "tcp", Source: q.LocalAddr(), Addr: q.RemoteAddr(), Err: os.NewSyscallError(op, e)}
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
