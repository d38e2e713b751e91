package transport

import (
	"encoding/binary"
	"os"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// bell is what an owner waiting in pollWait sleeps on: an epoll set, kept
// in Go's poller as one file, that holds an eventfd (the bell itself) and
// the owner's hot sockets, each armed once per wait (EPOLLONESHOT). The
// waiting goroutine parks in Go's poller, as one reading a socket does:
// a message on a hot socket wakes it directly, and a thread that waits
// holds no processor. Whatever else should end the wait (a message a
// goroutine delivered, the data plane's signal, a context's end, Close)
// rings the eventfd. The descriptors are made by the first wait and
// closed by Close, or by the last wait under way when Close came, so that
// no ring or wait ever uses a number that may name another file by then.
type bell struct {
	mu     sync.Mutex
	made   bool // by the first wait
	efd    int  // the eventfd, while made
	epfd   int  // the epoll set, while made
	ep     *os.File
	raw    syscall.RawConn
	users  int // waits under way, which hold the descriptors open
	closed bool
	one    [8]byte
}

// enter returns the bell's descriptors, held open until leave; false if
// there are none (closed, or the system refused them).
func (b *bell) enter() (efd, epfd int, raw syscall.RawConn, ep *os.File, ok bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return -1, -1, nil, nil, false
	}
	if !b.made && !b.makeLocked() {
		return -1, -1, nil, nil, false
	}
	b.users++
	return b.efd, b.epfd, b.raw, b.ep, true
}

func (b *bell) makeLocked() bool {
	efd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		return false
	}
	epfd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err == nil {
		err = unix.EpollCtl(epfd, unix.EPOLL_CTL_ADD, efd, &unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(efd)})
		if err == nil {
			err = unix.SetNonblock(epfd, true) // so that Go's poller takes it
		}
		if err != nil {
			unix.Close(epfd)
		}
	}
	if err != nil {
		unix.Close(efd)
		return false
	}
	ep := os.NewFile(uintptr(epfd), "ecxfer-wait")
	raw, err := ep.SyscallConn()
	if err != nil {
		ep.Close()
		unix.Close(efd)
		return false
	}
	b.efd, b.epfd, b.ep, b.raw, b.made = efd, epfd, ep, raw, true
	binary.NativeEndian.PutUint64(b.one[:], 1)
	return true
}

// leave ends a wait that entered; the last one closes a closed bell.
func (b *bell) leave() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.users--
	if b.closed && b.users == 0 {
		b.freeLocked()
	}
}

func (b *bell) freeLocked() {
	if b.made {
		b.ep.Close()
		unix.Close(b.efd)
		b.made = false
	}
}

// ring wakes the waits under way. A wait that begins later checks what
// it waits for before it sleeps, so a ring with none under way is
// skipped by the caller (stepReads.ring).
func (b *bell) ring() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.made {
		unix.Write(b.efd, b.one[:]) // EAGAIN: it is rung already
	}
}

// clear takes the rings so far.
func (b *bell) clear(efd int) {
	var v [8]byte
	unix.Read(efd, v[:])
}

// close closes the descriptors, now or when the last wait leaves, after
// ringing them for those.
func (b *bell) close() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return
	}
	b.closed = true
	if b.users > 0 {
		unix.Write(b.efd, b.one[:])
		return
	}
	b.freeLocked()
}

// arm arms fd in the epoll set for one event (EPOLLONESHOT): a socket's
// registration wakes no one once it fired, or once the wait disarmed it.
func arm(epfd, fd int) {
	ev := unix.EpollEvent{Events: unix.EPOLLIN | unix.EPOLLRDHUP | unix.EPOLLONESHOT, Fd: int32(fd)}
	if unix.EpollCtl(epfd, unix.EPOLL_CTL_MOD, fd, &ev) != nil {
		unix.EpollCtl(epfd, unix.EPOLL_CTL_ADD, fd, &ev)
	}
}

// disarm disarms fd in the epoll set, where a wait armed it and it did
// not fire: bytes arriving while the owner steps wake no thread.
func disarm(epfd, fd int) {
	unix.EpollCtl(epfd, unix.EPOLL_CTL_MOD, fd, &unix.EpollEvent{Events: unix.EPOLLONESHOT, Fd: int32(fd)})
}

// sleep waits in Go's poller until the epoll set has an event or d passes
// (d < 0: no limit); it appends the sockets whose events came to fired
// (the bell's is cleared), and reports whether the wait is over: a socket
// fired, or d passed.
func sleep(raw syscall.RawConn, ep *os.File, epfd, efd int, d time.Duration, fired []int) ([]int, bool) {
	var dl time.Time
	if d >= 0 {
		dl = time.Now().Add(d)
	}
	ep.SetReadDeadline(dl)
	var evs [8]unix.EpollEvent
	err := raw.Read(func(uintptr) bool {
		n, _ := unix.EpollWait(epfd, evs[:], 0)
		for _, ev := range evs[:max(n, 0)] {
			if int(ev.Fd) == efd {
				var v [8]byte
				unix.Read(efd, v[:])
			} else {
				fired = append(fired, int(ev.Fd))
			}
		}
		return n > 0
	})
	return fired, len(fired) > 0 || err != nil
}

// pollFD implements pollable: the descriptor the connection's bytes
// arrive on, whether or not it is in Go's poller; -1 if closed.
func (q *quietConn) pollFD() int {
	q.mmu.Lock()
	defer q.mmu.Unlock()
	switch {
	case q.closed:
		return -1
	case q.tc == nil:
		return q.fd
	}
	fd := -1
	q.raw.Control(func(s uintptr) { fd = int(s) })
	return fd
}
