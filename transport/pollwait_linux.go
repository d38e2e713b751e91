package transport

import (
	"context"
	"slices"
	"time"
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
// its goroutine parks in Go's poller on the bell's epoll set, their
// sockets armed in it, so that a message on a hot connection wakes it
// directly, with no goroutine to hand it over (see stepReads). It returns, true, when a hot
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
	efd, epfd, raw, ep, ok := st.bell.enter()
	if !ok {
		return false, false
	}
	defer st.bell.leave()
	if ctx.Done() != nil {
		defer context.AfterFunc(ctx, st.bell.ring)()
	}
	armed, fired := st.armedFDs[:0], st.firedFDs[:0]
	defer func() {
		// What a wait armed and did not see fire is disarmed.
		for _, fd := range armed {
			if !slices.Contains(fired, fd) {
				disarm(epfd, fd)
			}
		}
		st.armedFDs, st.firedFDs = armed[:0], fired[:0]
	}()
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
		armed = st.armHot(epfd, armed)
		var over bool
		if fired, over = sleep(raw, ep, epfd, efd, left, fired[:0]); over {
			return true, true
		}
		// The bell: see what rang it, with the hot set as it is now.
	}
}

// armHot arms each hot connection's socket in the wait's epoll set, and
// adds its descriptor to armed (all a wait armed, to disarm at its end).
func (st *stepReads) armHot(epfd int, armed []int) []int {
	st.mu.Lock()
	defer st.mu.Unlock()
	for _, c := range st.hot {
		if p, ok := c.(pollable); ok {
			if fd := p.pollFD(); fd >= 0 {
				arm(epfd, fd)
				if !slices.Contains(armed, fd) {
					armed = append(armed, fd)
				}
			}
		}
	}
	return armed
}
