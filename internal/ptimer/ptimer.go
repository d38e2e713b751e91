// Package ptimer is a one-shot timer that fires within tens of
// microseconds of its deadline.
//
// Go's timers are checked where the runtime waits for network events, and
// on Linux that wait has millisecond resolution: when nothing else runs, a
// 50 µs timer fires about a millisecond late. A step loop that waits for
// its next due time (an open-loop generator, a retry due in 200 µs) would
// take that millisecond as latency. A timerfd is an event to that same
// wait, so its expiry ends the wait at once. Where there is no timerfd,
// Timer falls back to a Go timer.
package ptimer

import "time"

// Timer is a one-shot timer for one goroutine at a time. C receives when
// the timer fires; a receive may also be stale (from an arming that Reset
// or Stop replaced after it fired), so a waiter must treat it as a hint to
// look at the clock, as a step loop does anyway.
type Timer struct {
	C  <-chan time.Time
	c  chan time.Time
	gt *time.Timer // the fallback, where there is no timerfd
	impl
}

// New returns a stopped timer. Close releases it.
func New() *Timer {
	t := &Timer{c: make(chan time.Time, 1)}
	t.C = t.c
	t.init()
	return t
}

// Reset arms the timer to fire after d (at once for d <= 0), replacing
// any earlier arming, and drains a receive still waiting in C.
func (t *Timer) Reset(d time.Duration) {
	t.drain()
	t.arm(max(d, 1))
}

// Stop disarms the timer and drains C.
func (t *Timer) Stop() {
	t.arm(0)
	t.drain()
}

func (t *Timer) drain() {
	select {
	case <-t.c:
	default:
	}
}

// initGo makes the fallback, a stopped Go timer that fires into C.
func (t *Timer) initGo() {
	t.gt = time.AfterFunc(time.Hour, t.fire)
	t.gt.Stop()
}

// armGo arms the fallback to fire after d; 0 disarms it.
func (t *Timer) armGo(d time.Duration) {
	if d == 0 {
		t.gt.Stop()
	} else {
		t.gt.Reset(d)
	}
}

func (t *Timer) fire() {
	select {
	case t.c <- time.Now():
	default:
	}
}
