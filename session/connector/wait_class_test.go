package connector

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/ecxfer/ecxfer/internal/xfake"
	"github.com/ecxfer/ecxfer/xfer"
)

// waitSteps sleeps in Wait (a 10 s context) and steps (step, advancing the
// caller's clock by the real time slept) until done; it fails where Wait
// sleeps until its context ends while the next Step has work.
func (w *world) waitSteps(t *testing.T, what string, step func(time.Duration) Results, done func(Results) bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	last := time.Now()
	for i := 0; ; i++ {
		start := time.Now()
		if !w.pool.Wait(ctx) {
			t.Fatalf("Wait slept %v until its context ended with %s due to the next Step (sessions %d, InFlight %d, held %d)",
				time.Since(start).Round(time.Millisecond), what, w.pool.sessions(), w.pool.InFlight(), len(w.pool.held))
		}
		d := time.Since(last)
		last = time.Now()
		if done(step(d)) {
			return
		}
		if i == 100000 {
			t.Fatalf("%s not done after %d Waits", what, i)
		}
	}
}

// A session with nothing in flight closes after IdleSession, in a Step:
// a Wait with nothing in flight must not sleep on the control plane alone
// past that.
func TestWaitReturnsToReapAnIdleSession(t *testing.T) {
	w := newWorld(t, PoolConfig{IdleSession: 40 * time.Millisecond})
	w.entry(t, "H", 2, true)
	w.fetch(t, "H", time.Minute)
	w.until(t, time.Millisecond, 10, func(r Results) bool { return len(r.Completed) == 1 })
	if w.pool.sessions() != 1 || w.pool.InFlight() != 0 {
		t.Fatalf("sessions %d, InFlight %d", w.pool.sessions(), w.pool.InFlight())
	}
	w.waitSteps(t, "an idle session's reaping", w.stepOnly, func(Results) bool { return w.pool.sessions() == 0 })
	if s := w.pool.Stats(); s.Reaped != 1 {
		t.Fatalf("Reaped %d", s.Reaped)
	}
}

// stuckRead fetches h (2 blocks) into a READ that never ends and cannot be
// stopped, and steps until it is posted.
func (w *world) stuckRead(t *testing.T, h string) {
	t.Helper()
	w.entry(t, h, 2, true)
	w.cdata.QueueOutcomes(xfake.Outcome{Kind: xfake.Stuck, Unstoppable: true})
	w.fetch(t, h, time.Minute)
	w.step(time.Millisecond)
	w.step(time.Millisecond)
	if len(w.cdata.Posts()) != 1 {
		t.Fatal("no READ posted")
	}
}

// The routes below each have a fetch in flight or blocks held.

// A first send refused (a full queue) is retried after its backoff.
func TestWaitReturnsForARetry(t *testing.T) {
	w := newWorld(t, PoolConfig{Retry: RetryConfig{BaseBackoff: 20 * time.Millisecond}})
	w.entry(t, "H", 2, true)
	w.ctl.sendErr = fmt.Errorf("full: %w", xfer.ErrQueueFull)
	w.fetch(t, "H", time.Minute)
	w.ctl.sendErr = nil
	w.waitSteps(t, "a retry", w.step, func(r Results) bool { return len(r.Completed) == 1 })
}

// A request the producer never answers ends at the fetch's deadline.
func TestWaitReturnsForADeadline(t *testing.T) {
	w := newWorld(t, PoolConfig{AckTimeout: time.Minute})
	w.entry(t, "H", 2, true)
	w.fetch(t, "H", 30*time.Millisecond)
	w.waitSteps(t, "the fetch's deadline", w.stepOnly, func(r Results) bool { return len(r.Failed) == 1 })
}

// A READ that never ends times out, and its held blocks come back Forced
// at the quarantine deadline, with no fetch in flight by then.
func TestWaitReturnsForAForcedRelease(t *testing.T) {
	w := newWorld(t, PoolConfig{Xfer: xfer.Config{ReadTimeout: 20 * time.Millisecond, QuarantineTimeout: 30 * time.Millisecond}})
	w.stuckRead(t, "H")
	var failed bool
	w.waitSteps(t, "the READ timeout, then the forced release", w.stepOnly, func(r Results) bool {
		failed = failed || len(r.Failed) == 1 && r.Failed[0].BlocksHeld
		return len(r.Released) == 1 && r.Released[0].Forced
	})
	if !failed {
		t.Fatal("no BlocksHeld failure before the release")
	}
}

// A READ runs on after its control connection closed (a draining session):
// its timeout still comes.
func TestWaitReturnsForADrainingSessionsRead(t *testing.T) {
	w := newWorld(t, PoolConfig{Xfer: xfer.Config{ReadTimeout: 20 * time.Millisecond, QuarantineTimeout: 30 * time.Millisecond}})
	w.stuckRead(t, "H")
	w.ctl.dead = append(w.ctl.dead, xfer.Death{Addr: addr, Err: errClosed})
	w.stepOnly(time.Millisecond)
	if len(w.pool.draining) != 1 {
		t.Fatalf("draining %d", len(w.pool.draining))
	}
	w.waitSteps(t, "a draining session's READ timeout and release", w.stepOnly, func(r Results) bool {
		return len(r.Released) == 1
	})
}

// While grants remain, a Producer's wait is bounded by a poll or by the
// first lease; grants held past their end by a READ still served have no
// lease and signal nothing at their release, so they are polled.
func TestProducerWaitBoundedWhileGrantsRemain(t *testing.T) {
	now := time.Now()
	for _, signals := range []bool{false, true} {
		p := &Producer{}
		if signals {
			p.ready = make(chan struct{})
		}
		if w := p.waitFor(1, time.Time{}, now); w > 5*time.Millisecond {
			t.Errorf("signals %v: held grants only: wait %v, not a poll", signals, w)
		}
		if w := p.waitFor(1, now.Add(30*time.Millisecond), now); w > 31*time.Millisecond {
			t.Errorf("signals %v: a lease in 30 ms: wait %v", signals, w)
		}
	}
}

// Close's Failed and Released come in the next Step: a loop that steps
// while Wait returns true takes them, then ends.
func TestWaitReturnsForCloseOutcomes(t *testing.T) {
	w := newWorld(t, PoolConfig{})
	w.entry(t, "H", 2, true)
	w.fetch(t, "H", time.Minute)
	if err := w.pool.Close(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var failed []Failure
	for w.pool.Wait(ctx) {
		w.now = w.now.Add(time.Millisecond)
		failed = append(failed, w.pool.Step(w.now).Failed...)
	}
	if ctx.Err() != nil {
		t.Fatal("Wait after Close slept until its context ended")
	}
	if len(failed) != 1 || failed[0].Reason != xfer.Closed {
		t.Fatalf("failed %+v, want H's, xfer.Closed", failed)
	}
}
