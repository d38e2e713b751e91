package transport

import (
	"encoding/binary"
	"runtime"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// bell is the eventfd an owner waiting in pollWait sleeps on beside its
// hot sockets: whatever else should end the wait (a message a goroutine
// delivered, the data plane's signal, a context's end, Close, a hot
// socket's descriptor changing) rings it. Its descriptor is made by the
// first wait and closed by Close, or by the last wait under way when
// Close came, so that no ring or poll ever uses a number that may name
// another file by then.
type bell struct {
	mu     sync.Mutex
	fd     int  // the eventfd, while made
	made   bool // by the first wait
	users  int  // waits under way, which hold fd open
	closed bool
	one    [8]byte
}

// enter returns the descriptor to poll, held open until leave; false if
// there is none (closed, or no eventfd).
func (b *bell) enter() (int, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return -1, false
	}
	if !b.made {
		fd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
		if err != nil {
			return -1, false
		}
		b.fd, b.made = fd, true
		binary.NativeEndian.PutUint64(b.one[:], 1)
	}
	b.users++
	return b.fd, true
}

// leave ends a wait that entered; the last one closes a closed bell.
func (b *bell) leave() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.users--
	if b.closed && b.users == 0 && b.made {
		unix.Close(b.fd)
		b.made = false
	}
}

// ring wakes the wait under way. A wait that begins later checks what it
// waits for before it polls, so a ring with none under way is skipped by
// the caller (stepReads.ring).
func (b *bell) ring() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.made {
		unix.Write(b.fd, b.one[:]) // EAGAIN: it is rung already
	}
}

// clear takes the rings so far.
func (b *bell) clear(fd int) {
	var v [8]byte
	unix.Read(fd, v[:])
}

// close closes the descriptor, now or when the last wait leaves, after
// ringing it for those.
func (b *bell) close() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return
	}
	b.closed = true
	if !b.made {
		return
	}
	if b.users > 0 {
		unix.Write(b.fd, b.one[:])
		return
	}
	unix.Close(b.fd)
	b.made = false
}

// pollFor polls fds for input for at most d (negative: no limit).
//
// The thread sleeps in the system call and keeps its processor until the
// runtime's monitor takes it back (20 µs to 10 ms later): a goroutine
// queued on that processor would wait that long for it (the copy
// goroutines a READ just started, the engine's own). So the waiting
// goroutine first yields, and sleeps only once whatever was queued
// behind it ran; nothing is queued on a processor whose thread is asleep,
// and the other processors steal what would be.
func pollFor(fds []unix.PollFd, d time.Duration) {
	runtime.Gosched()
	if d < 0 {
		unix.Ppoll(fds, nil, nil)
		return
	}
	ts := unix.NsecToTimespec(int64(d))
	unix.Ppoll(fds, &ts, nil)
}

// pollFD implements pollable: the descriptor the connection's bytes
// arrive on, whether or not it is in Go's poller; -1 if closed. A change
// of it (attach, detach) rings moved, so that a wait polling the old
// number, which may name another file once closed, polls the new one.
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
