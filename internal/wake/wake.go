// Package wake lets one goroutine sleep until another wakes it or a
// timeout passes, woken by the runtime's network poller rather than by a
// channel.
//
// A goroutine woken through a channel is made runnable by the waker, and
// the runtime then wakes a second thread to look for it when a processor
// is idle: on a small host that wakeup, and the thread spinning on a core
// the peer process needs, cost more than a fetch's round trip. A goroutine
// parked on a descriptor is picked up by the thread that polls next, which
// is the waker's own as soon as it parks. On Linux the descriptor is an
// eventfd and the timeout its read deadline, a Go timer (so about a
// millisecond late for short waits; see internal/ptimer); elsewhere a
// channel and a Go timer serve.
package wake

import (
	"sync/atomic"
	"time"
)

// Waiter is waited on by one goroutine at a time and woken by any.
type Waiter struct {
	pending atomic.Bool // a Wake not yet returned by a Wait
	impl
}

// New returns a waiter. Close releases it.
func New() *Waiter {
	w := &Waiter{}
	w.init()
	return w
}

// Wake makes the Wait in progress return, or else the next one. Its
// caller's writes before Wake are seen by the waiter after Wait.
func (w *Waiter) Wake() {
	if !w.pending.Swap(true) {
		w.kick()
	}
}

// Wait returns when woken (by a Wake since the last Wait returned) or
// after d; d < 0 waits for a Wake only. It may also return early: a waiter
// looks at its work and the clock after each return anyway.
func (w *Waiter) Wait(d time.Duration) {
	if w.pending.Swap(false) {
		w.drain() // its kick, if in already: not a wake for the next Wait
		return
	}
	if d == 0 {
		return
	}
	w.arm(d)
	w.block()
	w.pending.Swap(false) // a Swap, not a Store: it sees the last Wake's writes
}
