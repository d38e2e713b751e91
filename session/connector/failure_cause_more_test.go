package connector

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/ecxfer/ecxfer/session"
	"github.com/ecxfer/ecxfer/wire"
	"github.com/ecxfer/ecxfer/xfer"
)

// Fetch refuses bad blocks itself (session.ErrBadBlocks), nothing started,
// even for a fetch it would hold behind the producer's first answer, whose
// own StartXfer comes later: such a fetch must not fail later as if its
// producer were down.
func TestHeldFetchChecksItsBlocksAtFetch(t *testing.T) {
	w := newWorld(t, PoolConfig{AckTimeout: 20 * time.Millisecond})
	w.entry(t, "A", 1, true)
	w.entry(t, "H", 2, true)
	if _, err := w.pool.Fetch(addr, "A", []int{9}, w.now.Add(time.Minute), w.now); err != nil {
		t.Fatal(err)
	}
	_, err := w.pool.Fetch(addr, "H", []int{3, 3}, w.now.Add(time.Minute), w.now) // duplicate block
	if !errors.Is(err, session.ErrBadBlocks) {
		t.Errorf("Fetch with duplicate blocks, held: err %v, want session.ErrBadBlocks", err)
	}
	if err != nil {
		return
	}
	r := w.stepOnly(25 * time.Millisecond)
	for _, f := range pick(r.Failed, "H") {
		t.Errorf("later Failure: reason %v, err %v (errors.Is ErrBadBlocks %v)", f.Reason, f.Err, errors.Is(f.Err, session.ErrBadBlocks))
	}
}

// A fetch whose connection closed while it waited for its ack, and whose
// retry's send is then refused for good, fails peer-down naming both the
// refusal and the death that caused the reason.
func TestRefusedRetryAfterDeathNamesTheDeath(t *testing.T) {
	w := newWorld(t, PoolConfig{Retry: RetryConfig{BaseBackoff: 10 * time.Millisecond, MaxBackoff: 10 * time.Millisecond}})
	w.entry(t, "H", 2, true)
	w.fetch(t, "H", time.Minute)
	w.stepOnly(time.Millisecond) // sent, never answered
	w.ctl.dead = append(w.ctl.dead, xfer.Death{Addr: addr, Err: errClosed})
	w.stepOnly(time.Millisecond) // peer-down: retry planned
	h := refuseRetry(t, w, fmt.Errorf("refused: %w", xfer.ErrNotAllowed), 20*time.Millisecond)
	checkNames(t, h, xfer.PeerDown, xfer.ErrNotAllowed, errClosed)
}

// A fetch between attempts (NACK_NOT_READY) whose retry's send is refused
// when no further retry fits before its deadline ends deadline-exceeded,
// naming the refusal and its last attempt's NACK, as end does for the same
// stage.
func TestRefusedRetryPastDeadlineNamesLastAttempt(t *testing.T) {
	w := newWorld(t, PoolConfig{Retry: RetryConfig{BaseBackoff: 10 * time.Millisecond, MaxBackoff: 10 * time.Millisecond}})
	w.entry(t, "H", 2, false) // NACK_NOT_READY
	w.fetch(t, "H", 25*time.Millisecond)
	w.step(time.Millisecond)
	w.step(time.Millisecond) // NACK: retry planned at ~+12ms
	// The retry is due and refused; the next would pass the deadline.
	h := refuseRetry(t, w, fmt.Errorf("refused: %w", xfer.ErrQueueFull), 18*time.Millisecond)
	checkNames(t, h, xfer.DeadlineExceeded, xfer.ErrQueueFull, wire.NackNotReady)
}

// A fetch whose send was refused (it never reached the producer) goes on
// after the producer's silence, and completes on a new connection; fetches
// in the other stages end once each; nothing is left in flight.
func TestSilenceSparesTheRefusedAndEndsEachOnce(t *testing.T) {
	w := newWorld(t, PoolConfig{Retry: RetryConfig{BaseBackoff: 10 * time.Millisecond, MaxBackoff: 10 * time.Millisecond}})
	w.entry(t, "R", 2, true)
	w.fetch(t, "R", time.Minute)
	w.until(t, time.Millisecond, 10, func(r Results) bool { return len(r.Completed) > 0 }) // registered
	w.entry(t, "W", 1, true)                                                               // waiting for its ack
	w.entry(t, "N", 1, false)                                                              // between attempts (NACK)
	w.entry(t, "X", 1, true)                                                               // refused: never reached it
	if _, err := w.pool.Fetch(addr, "N", []int{5}, w.now.Add(time.Minute), w.now); err != nil {
		t.Fatal(err)
	}
	w.step(time.Millisecond)
	w.step(time.Millisecond) // N nacked, retry planned
	if _, err := w.pool.Fetch(addr, "W", []int{6}, w.now.Add(time.Minute), w.now); err != nil {
		t.Fatal(err)
	}
	w.ctl.sendErr = fmt.Errorf("wrapped: %w", xfer.ErrPeerDown)
	if _, err := w.pool.Fetch(addr, "X", []int{7}, w.now.Add(time.Minute), w.now); err != nil {
		t.Fatal(err)
	}
	w.ctl.sendErr = nil
	delete(w.ctl.out, addr) // W's request is lost with the producer
	w.ctl.dead = append(w.ctl.dead, xfer.Death{Addr: addr, Err: errSilent})
	r := w.stepOnly(time.Millisecond)
	ended := map[string]int{}
	for _, f := range r.Failed {
		ended[f.MMHash]++
		checkNames(t, f, xfer.PeerDown, xfer.ErrPeerSilent)
	}
	if ended["W"] != 1 || ended["N"] != 1 || ended["X"] != 0 {
		t.Fatalf("at the silence: %v", ended)
	}
	all := w.until(t, 5*time.Millisecond, 100, func(r Results) bool { return len(r.Completed)+len(r.Failed) > 0 })
	for _, f := range all.Failed {
		ended[f.MMHash]++
	}
	if len(pick(all.Completed, "X")) != 1 || ended["W"] != 1 || ended["N"] != 1 || w.pool.InFlight() != 0 {
		t.Fatalf("after: %+v, %v, in flight %d", all, ended, w.pool.InFlight())
	}
}

// A fetch whose first send was refused (queue full) starts; when its
// deadline ends it between attempts, its error names the refusal.
func TestRefusedAtFetchThenDeadlineNamesTheRefusal(t *testing.T) {
	w := newWorld(t, PoolConfig{Retry: RetryConfig{BaseBackoff: 10 * time.Millisecond, MaxBackoff: 10 * time.Millisecond}})
	w.entry(t, "H", 2, true)
	w.ctl.sendErr = fmt.Errorf("refused: %w", xfer.ErrQueueFull)
	w.fetch(t, "H", 30*time.Millisecond)
	r := w.stepOnly(40 * time.Millisecond) // past the deadline before the retry ran
	h := pick(r.Failed, "H")
	if len(h) != 1 {
		t.Fatalf("H: %+v", r.Failed)
	}
	t.Logf("H: reason %v, err %v", h[0].Reason, h[0].Err)
	checkNames(t, h[0], xfer.DeadlineExceeded, xfer.ErrQueueFull)
}
