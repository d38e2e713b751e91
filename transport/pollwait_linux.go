package transport

import (
	"context"
	"time"

	"golang.org/x/sys/unix"
)

// pollable is a connection whose descriptor an owner's wait can poll.
type pollable interface{ pollFD() int }

// pollFD implements pollable.
func (g *guardConn) pollFD() int {
	if q, ok := g.Conn.(*quietConn); ok {
		return q.pollFD()
	}
	return -1
}

// pollWait is the owner's wait when it reads its hot connections itself:
// it sleeps in one system call on their sockets and the bell, so that a
// message on a hot connection wakes the waiting thread directly, with no
// goroutine to hand it over (see stepReads). It returns, true, when a hot
// socket has bytes, src has something pending, ready receives, or d
// passes (d < 0: no limit); false when ctx ends or src is gone. handled is
// false where it cannot wait so (no eventfd, a hold is on, as Serve's, or
// another wait polls), and the caller waits on its channels instead.
func (st *stepReads) pollWait(ctx context.Context, ready <-chan struct{}, d time.Duration, src waitSource) (woke, handled bool) {
	st.mu.Lock()
	held := st.waiters > 0
	st.mu.Unlock()
	if held {
		return false, false
	}
	// One wait polls at a time: the bell's ring is taken by whichever wait
	// wakes first, so a second one waits on its channels.
	if st.pollers.Add(1) > 1 {
		st.pollers.Add(-1)
		return false, false
	}
	// From here on, whatever should end the wait rings.
	defer st.pollers.Add(-1)
	st.polled.Store(true)
	bfd, ok := st.bell.enter()
	if !ok {
		return false, false
	}
	defer st.bell.leave()
	if ctx.Done() != nil {
		defer context.AfterFunc(ctx, st.bell.ring)()
	}
	fds := st.pfds[:0]
	defer func() { st.pfds = fds[:0] }()
	var end int64
	if d >= 0 {
		end = monoNow() + int64(d)
	}
	for {
		if src.pending() {
			return true, true
		}
		select {
		case <-ready:
			return true, true
		case <-ctx.Done():
			return false, true
		case <-src.gone():
			return false, true
		default:
		}
		left := time.Duration(-1)
		if d >= 0 {
			if left = time.Duration(end - monoNow()); left <= 0 {
				return true, true
			}
		}
		fds = st.pollSet(fds[:0], bfd)
		pollFor(fds, left)
		if fds[0].Revents != 0 {
			st.bell.clear(bfd)
		}
		for _, f := range fds[1:] {
			if f.Revents != 0 {
				return true, true
			}
		}
		// The bell: see what rang it, with the hot set as it is now.
	}
}

// pollSet appends the bell and the hot connections' descriptors to fds.
func (st *stepReads) pollSet(fds []unix.PollFd, bell int) []unix.PollFd {
	st.mu.Lock()
	defer st.mu.Unlock()
	fds = append(fds, unix.PollFd{Fd: int32(bell), Events: unix.POLLIN})
	for _, c := range st.hot {
		if p, ok := c.(pollable); ok {
			if fd := p.pollFD(); fd >= 0 {
				fds = append(fds, unix.PollFd{Fd: int32(fd), Events: unix.POLLIN})
			}
		}
	}
	return fds
}
