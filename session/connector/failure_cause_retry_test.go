package connector

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/ecxfer/ecxfer/wire"
	"github.com/ecxfer/ecxfer/xfer"
)

// nackThenRetryDue: H is NACKed (not ready) at +2ms, its retry due at
// +10..14ms of a deadline of +budget.
func nackThenRetryDue(t *testing.T, budget time.Duration) *world {
	w := newWorld(t, PoolConfig{Retry: RetryConfig{BaseBackoff: 10 * time.Millisecond, MaxBackoff: 10 * time.Millisecond}})
	w.entry(t, "H", 2, false) // NACK_NOT_READY
	w.fetch(t, "H", budget)
	w.step(time.Millisecond)
	w.step(time.Millisecond) // NACK: retry planned
	if f := w.pool.fetches["H"]; f == nil || f.retryAt.IsZero() {
		t.Fatal("no retry planned")
	}
	return w
}

// The deadline that ends a retry in flight (sent, unanswered) names the
// earlier attempt's NACK, as it does between attempts.
func TestDeadlineOnARetryInFlightNamesTheEarlierAttempt(t *testing.T) {
	w := nackThenRetryDue(t, 100*time.Millisecond)
	w.stepOnly(15 * time.Millisecond) // +17ms: the retry is sent, never answered
	if f := w.pool.fetches["H"]; f == nil || !f.retryAt.IsZero() || f.attempts != 2 {
		t.Fatalf("retry not in flight: %+v", f)
	}
	h := pick(w.stepOnly(83*time.Millisecond).Failed, "H") // +100ms: the deadline
	if len(h) != 1 {
		t.Fatalf("H: %+v", h)
	}
	checkNames(t, h[0], xfer.DeadlineExceeded, wire.NackNotReady)
}

// So does the producer's silence that ends a retry in flight.
func TestSilenceOnARetryInFlightNamesTheEarlierAttempt(t *testing.T) {
	w := nackThenRetryDue(t, time.Minute)
	w.stepOnly(15 * time.Millisecond) // the retry is sent, never answered
	w.ctl.dead = append(w.ctl.dead, xfer.Death{Addr: addr, Err: errSilent})
	h := pick(w.stepOnly(time.Millisecond).Failed, "H")
	if len(h) != 1 {
		t.Fatalf("H: %+v", h)
	}
	checkNames(t, h[0], xfer.PeerDown, xfer.ErrPeerSilent, wire.NackNotReady)
}

// A retry whose send is refused (queue full) and planned again, then
// ended by the deadline between attempts, names both the earlier NACK
// and the refusal, the last thing the fetch met.
func TestRefusedRetryThenDeadlineNamesTheRefusal(t *testing.T) {
	w := nackThenRetryDue(t, 40*time.Millisecond)
	w.ctl.sendErr = fmt.Errorf("refused: %w", xfer.ErrQueueFull)
	w.stepOnly(15 * time.Millisecond) // +17ms: the retry is refused, planned again at ~+27ms
	if f := w.pool.fetches["H"]; f == nil || f.retryAt.IsZero() {
		t.Fatalf("refused retry not planned again: %+v", w.failed)
	}
	h := pick(w.stepOnly(23*time.Millisecond).Failed, "H") // +40ms: the deadline, before the retry runs
	if len(h) != 1 {
		t.Fatalf("H: %+v", h)
	}
	checkNames(t, h[0], xfer.DeadlineExceeded, wire.NackNotReady, xfer.ErrQueueFull)
}

// Pool.Close of a fetch whose READ cannot be stopped: its BlocksHeld
// Failure names the data plane's Release error, and so does the Forced
// Released that follows.
func TestCloseHeldReadNamesTheReleaseError(t *testing.T) {
	w := newWorld(t, PoolConfig{})
	w.stuckRead(t, "H")
	if err := w.pool.Close(); err != nil {
		t.Fatal(err)
	}
	r := w.pool.Step(w.now)
	h := pick(r.Failed, "H")
	if len(h) != 1 || !h[0].BlocksHeld {
		t.Fatalf("H: %+v", h)
	}
	checkNames(t, h[0], xfer.Closed, xfer.ErrMayStillWrite)
	if rel := r.Released; len(rel) != 1 || !rel[0].Forced || !errors.Is(rel[0].Err, xfer.ErrMayStillWrite) {
		t.Fatalf("released %+v, want one Forced naming xfer.ErrMayStillWrite", rel)
	}
}
