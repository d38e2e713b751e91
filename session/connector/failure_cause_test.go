package connector

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/ecxfer/ecxfer/internal/xfake"
	"github.com/ecxfer/ecxfer/wire"
	"github.com/ecxfer/ecxfer/xfer"
)

// checkNames fails t unless f's Err matches its Reason and wraps each of causes.
func checkNames(t *testing.T, f Failure, want xfer.Reason, causes ...error) {
	t.Helper()
	if f.Reason != want || !errors.Is(f.Err, f.Reason) {
		t.Errorf("reason %v (want %v), err %q: errors.Is(err, reason) = %v", f.Reason, want, f.Err, errors.Is(f.Err, f.Reason))
	}
	for _, c := range causes {
		if !errors.Is(f.Err, c) {
			t.Errorf("err %q does not name its cause %q", f.Err, c)
		}
	}
}

var errSilent = fmt.Errorf("guard: %w", xfer.ErrPeerSilent)

// A Failure's Err names what caused its Reason, whatever route ended the
// fetch. A READ that runs on from an earlier (closed) connection, ended by
// the producer's later silence, names the silence, not the earlier close.
func TestSilenceEndsAnEarlierConnectionsReadNamingTheSilence(t *testing.T) {
	for _, unstoppable := range []bool{false, true} {
		t.Run(fmt.Sprint("unstoppable=", unstoppable), func(t *testing.T) {
			w := newWorld(t, PoolConfig{})
			w.entry(t, "H", 2, true)
			w.entry(t, "G", 2, true)
			w.cdata.SetStopsReads(!unstoppable)
			w.cdata.QueueOutcomes(xfake.Outcome{Kind: xfake.Stuck, Unstoppable: unstoppable})
			w.fetch(t, "H", time.Minute)
			w.step(time.Millisecond)
			w.step(time.Millisecond)
			w.ctl.dead = append(w.ctl.dead, xfer.Death{Addr: addr, Err: errClosed})
			w.stepOnly(time.Millisecond)
			w.fetch(t, "G", time.Minute) // a new connection to the same producer
			w.ctl.dead = append(w.ctl.dead, xfer.Death{Addr: addr, Err: errSilent})
			r := w.stepOnly(time.Millisecond)
			h := pick(r.Failed, "H")
			if len(h) != 1 {
				t.Fatalf("H not ended: %+v", r.Failed)
			}
			t.Logf("H: %v", h[0])
			checkNames(t, h[0], xfer.PeerDown, xfer.ErrPeerSilent)
		})
	}
}

// A fetch waiting for its ack when its producer is declared silent ends
// peer-down, naming the silence, whether or not a retry would have fit
// before its deadline: silence ends it, it is not retried.
func TestSilenceEndsAFetchBeforeItsDeadlineAsPeerDown(t *testing.T) {
	w := newWorld(t, PoolConfig{Retry: RetryConfig{BaseBackoff: time.Second}})
	w.entry(t, "H", 2, true)
	w.fetch(t, "H", 500*time.Millisecond)
	w.stepOnly(time.Millisecond) // sent, never answered
	w.ctl.dead = append(w.ctl.dead, xfer.Death{Addr: addr, Err: errSilent})
	r := w.stepOnly(time.Millisecond)
	h := pick(r.Failed, "H")
	if len(h) != 1 {
		t.Fatalf("%+v", r.Failed)
	}
	t.Logf("H at +2ms of a 500ms deadline: reason %v, err %v", h[0].Reason, h[0].Err)
	checkNames(t, h[0], xfer.PeerDown, xfer.ErrPeerSilent)
}

// A fetch held behind the producer's first answer whose own send is then
// refused for good fails with a reason (peer-down, as a first send refused
// at Fetch does) and the refusal in its Err.
func TestHeldFetchWhoseSendIsRefusedHasAReason(t *testing.T) {
	for _, tc := range []struct {
		name    string
		refusal error
		cfg     PoolConfig
	}{
		{"not allowed", xfer.ErrNotAllowed, PoolConfig{AckTimeout: 20 * time.Millisecond}},
		{"queue full, budget spent", xfer.ErrQueueFull, PoolConfig{AckTimeout: 20 * time.Millisecond, Retry: RetryConfig{MaxElapsed: 10 * time.Millisecond}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorld(t, tc.cfg)
			w.entry(t, "A", 1, true)
			w.entry(t, "H", 2, true)
			if _, err := w.pool.Fetch(addr, "A", []int{9}, w.now.Add(time.Minute), w.now); err != nil {
				t.Fatal(err)
			}
			w.fetch(t, "H", time.Minute) // held behind A's answer
			if f := w.pool.fetches["H"]; f.heldOn == nil {
				t.Fatal("H not held")
			}
			w.ctl.sendErr = fmt.Errorf("refused: %w", tc.refusal)
			r := w.stepOnly(25 * time.Millisecond) // H's hold is over; its send is refused
			h := pick(r.Failed, "H")
			if len(h) != 1 {
				t.Fatalf("H: %+v", r.Failed)
			}
			t.Logf("H: reason %d (%v), err %v", h[0].Reason, h[0].Reason, h[0].Err)
			if h[0].Reason == xfer.NoReason {
				t.Errorf("Failure with Reason NoReason")
			}
			if !errors.Is(h[0].Err, tc.refusal) {
				t.Errorf("err does not name the refusal")
			}
		})
	}
}

// A fetch whose last attempt was NACK_NOT_READY and whose retry's send is
// refused for good fails nacked, and its Err names the refusal too.
func TestNackedThenRefusedNamesTheRefusal(t *testing.T) {
	w := newWorld(t, PoolConfig{Retry: RetryConfig{BaseBackoff: 10 * time.Millisecond, MaxBackoff: 10 * time.Millisecond}})
	w.entry(t, "H", 2, false) // NACK_NOT_READY
	w.fetch(t, "H", time.Minute)
	w.step(time.Millisecond)
	w.step(time.Millisecond) // NACK: retry planned
	h := refuseRetry(t, w, fmt.Errorf("refused: %w", xfer.ErrNotAllowed), 20*time.Millisecond)
	checkNames(t, h, xfer.Nacked, xfer.ErrNotAllowed, wire.NackNotReady)
}

// refuseRetry refuses the send of H's planned retry with refusal and
// returns H's one Failure from the Step after d, which tries it.
func refuseRetry(t *testing.T, w *world, refusal error, d time.Duration) Failure {
	t.Helper()
	if f := w.pool.fetches["H"]; f == nil || f.retryAt.IsZero() {
		t.Fatalf("no retry planned: %+v", w.failed)
	}
	w.ctl.sendErr = refusal
	h := pick(w.stepOnly(d).Failed, "H")
	if len(h) != 1 {
		t.Fatalf("H: %+v", h)
	}
	t.Logf("H: reason %v, err %v", h[0].Reason, h[0].Err)
	return h[0]
}

// A FetchEntry whose cache entry was removed under it fails bad-ack, and
// its Err matches that reason, as every Failure's does.
func TestFetchEntryLostEntryErrMatchesReason(t *testing.T) {
	w, cc := entryWorld(t, PoolConfig{}, 8)
	w.entry(t, "H", 2, true)
	if _, err := w.pool.FetchEntry(addr, "H", 9, w.now.Add(time.Minute), w.now); err != nil {
		t.Fatal(err)
	}
	if err := cc.Remove("H"); err != nil {
		t.Fatal(err)
	}
	r := w.until(t, time.Millisecond, 10, func(r Results) bool { return len(r.Failed)+len(r.Completed) > 0 })
	if len(r.Failed) != 1 {
		t.Fatalf("%+v", r)
	}
	t.Logf("H: reason %v, err %v", r.Failed[0].Reason, r.Failed[0].Err)
	checkNames(t, r.Failed[0], xfer.BadAck)
}

// A READ whose Check failed (the data plane cannot say whether it ended)
// fails check-failed with its blocks held, naming the data plane's error.
func TestCheckFailedNamesTheDataPlaneError(t *testing.T) {
	w := newWorld(t, PoolConfig{})
	w.entry(t, "H", 2, true)
	w.cdata.QueueOutcomes(xfake.Outcome{Kind: xfake.CheckError})
	w.fetch(t, "H", time.Minute)
	r := w.until(t, time.Millisecond, 10, func(r Results) bool { return len(r.Failed) > 0 })
	if !r.Failed[0].BlocksHeld {
		t.Fatalf("a READ whose end is unknown gave its blocks back: %+v", r.Failed[0])
	}
	checkNames(t, r.Failed[0], xfer.CheckFailed, xfake.ErrInjected)
}
