package connector

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ecxfer/ecxfer/internal/xfake"
	"github.com/ecxfer/ecxfer/wire"
	"github.com/ecxfer/ecxfer/xfer"
)

// stepOnly advances the clock by d and steps the pool alone: the producer
// reads nothing, so no request is answered.
func (w *world) stepOnly(d time.Duration) Results {
	w.now = w.now.Add(d)
	r := w.pool.Step(w.now)
	return Results{Completed: append([]Done(nil), r.Completed...), Failed: append([]Failure(nil), r.Failed...),
		Released: append([]Released(nil), r.Released...)}
}

// stage is a fetch of "H" (blocks 1, 2) taken to one of the stages it
// can end in; setup starts it to end by w.now+budget.
type stage struct {
	name  string
	setup func(t *testing.T, w *world, budget time.Duration)
	held  bool // a READ may still write when it ends
	cause error
	// early: no retry fits before the deadline, so it ends as soon as
	// that is known, not later than the deadline.
	early bool
}

// stages are every stage a fetch waits in.
var stages = []stage{
	{"waiting for the ack", func(t *testing.T, w *world, budget time.Duration) {
		w.entry(t, "H", 2, true)
		w.fetch(t, "H", budget)
		w.stepOnly(time.Millisecond) // sent, never answered
	}, false, nil, false},
	{"held behind the producer's first request", func(t *testing.T, w *world, budget time.Duration) {
		w.entry(t, "H", 2, true)
		w.entry(t, "G", 1, true)
		if _, err := w.pool.Fetch(addr, "G", []int{9}, w.now.Add(time.Minute), w.now); err != nil {
			t.Fatal(err)
		}
		w.fetch(t, "H", budget) // held: G's answer registers the producer
		w.stepOnly(time.Millisecond)
	}, false, nil, false},
	{"between attempts", func(t *testing.T, w *world, budget time.Duration) {
		w.entry(t, "H", 2, false) // NACK_NOT_READY, retried after a second
		w.fetch(t, "H", budget)
		w.step(time.Millisecond)
		w.step(time.Millisecond)
	}, false, wire.NackNotReady, true},
	{"READ stalled, stoppable", func(t *testing.T, w *world, budget time.Duration) {
		w.entry(t, "H", 2, true)
		w.cdata.SetStopsReads(true)
		w.cdata.QueueOutcomes(xfake.Outcome{Kind: xfake.Stuck})
		w.fetch(t, "H", budget)
		w.step(time.Millisecond)
		w.step(time.Millisecond)
	}, false, nil, false},
	{"READ stalled, unstoppable", func(t *testing.T, w *world, budget time.Duration) {
		w.entry(t, "H", 2, true)
		w.cdata.QueueOutcomes(xfake.Outcome{Kind: xfake.Stuck, Unstoppable: true})
		w.fetch(t, "H", budget)
		w.step(time.Millisecond)
		w.step(time.Millisecond)
	}, true, nil, false},
}

// The deadline is the engine's budget: a fetch ends at the first Step at or
// after it, whatever it waits for, in Failed with reason deadline; its
// blocks are held only where a READ may still write.
func TestDeadlineEndsEveryStage(t *testing.T) {
	const budget = 100 * time.Millisecond
	cases := append(slices.Clone(stages), stage{"already past at Fetch", func(t *testing.T, w *world, _ time.Duration) {
		w.entry(t, "H", 2, true)
		w.fetch(t, "H", 0)
		if len(w.ctl.out[addr]) != 0 {
			t.Fatal("a fetch past its deadline sent a request")
		}
	}, false, nil, true})
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorld(t, PoolConfig{Retry: RetryConfig{BaseBackoff: time.Second}})
			start := w.now
			tc.setup(t, w, budget)
			failed := pick(w.failed, "H")
			for w.now.Before(start.Add(budget)) {
				r := w.stepOnly(min(10*time.Millisecond, start.Add(budget).Sub(w.now)))
				failed = append(failed, pick(r.Failed, "H")...)
				if len(pick(r.Completed, "H")) > 0 {
					t.Fatal("completed")
				}
				if len(failed) > 0 && w.now.Before(start.Add(budget)) && !tc.early {
					t.Fatalf("ended before its deadline, at +%v: %+v", w.now.Sub(start), failed)
				}
			}
			if len(failed) != 1 {
				t.Fatalf("at the deadline: %+v", failed)
			}
			f := failed[0]
			if f.Reason != xfer.DeadlineExceeded || !errors.Is(f.Err, xfer.DeadlineExceeded) || f.BlocksHeld != tc.held {
				t.Fatalf("failure %+v (%v), want held %v", f, f.Err, tc.held)
			}
			if tc.cause != nil && !errors.Is(f.Err, tc.cause) {
				t.Fatalf("err %v does not say %v", f.Err, tc.cause)
			}
			if w.pool.InFlight() != 1 && tc.name == "held behind the producer's first request" {
				t.Fatalf("in flight %d, want G's alone", w.pool.InFlight())
			}
			if tc.held {
				// The READ ends later: its blocks come back once.
				for _, p := range w.cdata.Posts() {
					w.cdata.Finish(p.Handle)
				}
				r := w.stepOnly(time.Millisecond)
				if len(r.Released) != 1 || r.Released[0].MMHash != "H" || r.Released[0].Forced {
					t.Fatalf("released %+v", r.Released)
				}
			}
		})
	}
}

// A producer declared dead for its silence ends every fetch that asked it
// for anything, whatever stage it waits in, at the Step that hears of the
// death: in Failed with reason peer-down and an error that names the
// silence (and, between attempts, the last attempt's cause too); its
// blocks held only where a READ may still write.
func TestSilenceEndsEveryStage(t *testing.T) {
	for _, tc := range stages {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorld(t, PoolConfig{Retry: RetryConfig{BaseBackoff: time.Second}})
			tc.setup(t, w, time.Minute)
			if f := pick(w.failed, "H"); len(f) > 0 {
				t.Fatalf("ended before the death: %+v", f)
			}
			w.ctl.dead = append(w.ctl.dead, xfer.Death{Addr: addr, Err: fmt.Errorf("guard: %w", xfer.ErrPeerSilent)})
			failed := pick(w.stepOnly(time.Millisecond).Failed, "H")
			if len(failed) != 1 {
				t.Fatalf("at the Step after the death: %+v", failed)
			}
			f := failed[0]
			if f.Reason != xfer.PeerDown || !errors.Is(f.Err, xfer.ErrPeerSilent) || f.BlocksHeld != tc.held {
				t.Fatalf("failure %+v (%v), want peer-down naming the silence, held %v", f, f.Err, tc.held)
			}
			if tc.cause != nil && !errors.Is(f.Err, tc.cause) {
				t.Fatalf("err %v does not say %v", f.Err, tc.cause)
			}
		})
	}
}

func (w *world) fetch(t *testing.T, h string, budget time.Duration) {
	t.Helper()
	if _, err := w.pool.Fetch(addr, h, []int{1, 2}, w.now.Add(budget), w.now); err != nil {
		t.Fatal(err)
	}
}

func pick[T interface{ Done | Failure }](rs []T, h string) []T {
	var out []T
	for _, r := range rs {
		var got string
		switch v := any(r).(type) {
		case Done:
			got = v.MMHash
		case Failure:
			got = v.MMHash
		}
		if got == h {
			out = append(out, r)
		}
	}
	return out
}

// A producer declared dead for its silence ends its READs at once, held
// where they may still write; one whose connection closed lets them run
// on, and the fetch still completes.
func TestSilentProducerEndsItsReads(t *testing.T) {
	for _, tc := range []struct {
		name        string
		err         error
		unstoppable bool
	}{
		{"silent, stoppable", fmt.Errorf("guard: %w", xfer.ErrPeerSilent), false},
		{"silent, unstoppable", fmt.Errorf("guard: %w", xfer.ErrPeerSilent), true},
		{"closed", errClosed, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorld(t, PoolConfig{})
			w.entry(t, "H", 2, true)
			w.cdata.SetStopsReads(!tc.unstoppable)
			w.cdata.QueueOutcomes(xfake.Outcome{Kind: xfake.Stuck, Unstoppable: tc.unstoppable})
			w.fetch(t, "H", time.Minute)
			w.step(time.Millisecond)
			w.step(time.Millisecond)
			if len(w.cdata.Posts()) != 1 {
				t.Fatal("no READ posted")
			}
			w.ctl.dead = append(w.ctl.dead, xfer.Death{Addr: addr, Err: tc.err})
			r := w.stepOnly(time.Millisecond)
			if !errors.Is(tc.err, xfer.ErrPeerSilent) {
				if len(r.Failed) != 0 {
					t.Fatalf("a closed connection ended the READ: %+v", r.Failed)
				}
				w.cdata.Finish(w.cdata.Posts()[0].Handle)
				if r := w.stepOnly(time.Millisecond); len(r.Completed) != 1 {
					t.Fatalf("the READ that ran on did not complete: %+v", r)
				}
				return
			}
			if len(r.Failed) != 1 || r.Failed[0].Reason != xfer.PeerDown || r.Failed[0].BlocksHeld != tc.unstoppable ||
				!errors.Is(r.Failed[0].Err, xfer.ErrPeerSilent) {
				t.Fatalf("failed %+v", r.Failed)
			}
		})
	}
}

// The first fetch from a producer not registered yet is the request the
// others wait on; when its ack times out, its retry goes after the
// backoff, not after a second ack timeout behind its own request.
func TestFirstRetryWaitsOnNoRequestOfItsOwn(t *testing.T) {
	w := newWorld(t, PoolConfig{AckTimeout: time.Second, Retry: RetryConfig{BaseBackoff: 10 * time.Millisecond}})
	w.entry(t, "H", 2, true)
	w.fetch(t, "H", time.Minute)
	sent := func() int { return len(w.ctl.out[addr]) }
	w.stepOnly(time.Millisecond)
	for w.now.Before(t0.Add(time.Second + 100*time.Millisecond)) {
		w.stepOnly(5 * time.Millisecond)
	}
	if sent() != 2 {
		t.Fatalf("%d requests 100 ms after the first ack timeout, want the retry's too", sent())
	}
}

// A bad-fit ack is given back at once: the producer unpins the entry in
// its next step, not at the lease.
func TestBadFitAckIsGivenBack(t *testing.T) {
	w := newWorld(t, PoolConfig{})
	w.entry(t, "H", 2, true)
	if _, err := w.pool.Fetch(addr, "H", []int{1}, w.now.Add(time.Minute), w.now); err != nil {
		t.Fatal(err)
	}
	r := w.until(t, time.Millisecond, 5, func(r Results) bool { return len(r.Failed) > 0 })
	if len(r.Failed) != 1 || r.Failed[0].Reason != xfer.BadAck {
		t.Fatalf("%+v", r)
	}
	if w.cache.Stats().Pinned != 1 {
		t.Fatal("the entry was not pinned")
	}
	w.step(time.Millisecond) // the producer takes the notification
	if st := w.cache.Stats(); st.Pinned != 0 || w.cdata.Notifies() != 1 {
		t.Fatalf("pinned %d after the bad fit was given back (%d notifications)", st.Pinned, w.cdata.Notifies())
	}
}

// The ack of a fetch that ended (cancelled, or past its deadline) is given
// back at once.
func TestEndedFetchsAckIsGivenBack(t *testing.T) {
	for _, how := range []string{"cancel", "deadline"} {
		t.Run(how, func(t *testing.T) {
			w := newWorld(t, PoolConfig{})
			w.entry(t, "H", 2, true)
			w.fetch(t, "H", 50*time.Millisecond)
			w.stepOnly(time.Millisecond)
			if how == "cancel" {
				if _, err := w.pool.Cancel("H", w.now); err != nil {
					t.Fatal(err)
				}
			} else if r := w.stepOnly(60 * time.Millisecond); len(r.Failed) != 1 || r.Failed[0].Reason != xfer.DeadlineExceeded {
				t.Fatalf("%+v", r)
			}
			w.step(time.Millisecond) // the producer grants; the pool gets the ack
			if w.cache.Stats().Pinned != 1 || w.prod.Stats().Grants != 1 {
				t.Fatalf("no grant: %+v", w.prod.Stats())
			}
			w.step(time.Millisecond)
			if st := w.cache.Stats(); st.Pinned != 0 {
				t.Fatalf("pinned %d after the unread grant was given back", st.Pinned)
			}
			if len(w.cdata.Posts()) != 0 {
				t.Fatal("a READ was posted for an ended fetch")
			}
		})
	}
}

// A failure prints what failed and why, never a status "OK".
func TestFailurePrintsNoOK(t *testing.T) {
	w := newWorld(t, PoolConfig{})
	w.entry(t, "H", 2, true)
	w.cdata.QueueOutcomes(xfake.Outcome{Kind: xfake.Stuck, Unstoppable: true})
	w.fetch(t, "H", 50*time.Millisecond)
	r := w.until(t, 10*time.Millisecond, 10, func(r Results) bool { return len(r.Failed) > 0 })
	for _, s := range []string{fmt.Sprint(r.Failed[0]), fmt.Sprintf("%v", r.Failed)} {
		if strings.Contains(s, "OK") || !strings.Contains(s, "deadline") || !strings.Contains(s, "held") {
			t.Fatalf("printed %q", s)
		}
	}
	nack := w.fetchNack(t)
	if s := fmt.Sprint(nack); !strings.Contains(s, "NACK_MISSING") {
		t.Fatalf("a NACK printed %q", s)
	}
}

func (w *world) fetchNack(t *testing.T) Failure {
	t.Helper()
	if _, err := w.pool.Fetch(addr, "absent", []int{3}, w.now.Add(time.Minute), w.now); err != nil {
		t.Fatal(err)
	}
	return w.until(t, time.Millisecond, 10, func(r Results) bool { return len(pick(r.Failed, "absent")) > 0 }).Failed[0]
}

// A READ stopped for certain (by the deadline, or Cancel) gives its grant
// back: the producer unpins at once, not at the lease.
func TestStoppedReadGivesItsGrantBack(t *testing.T) {
	for _, how := range []string{"deadline", "cancel"} {
		t.Run(how, func(t *testing.T) {
			w := newWorld(t, PoolConfig{})
			w.entry(t, "H", 2, true)
			w.cdata.SetStopsReads(true)
			w.cdata.QueueOutcomes(xfake.Outcome{Kind: xfake.Stuck})
			w.fetch(t, "H", 50*time.Millisecond)
			w.step(time.Millisecond)
			w.step(time.Millisecond)
			if len(w.cdata.Posts()) != 1 || w.cache.Stats().Pinned != 1 {
				t.Fatal("no READ under a grant")
			}
			if how == "cancel" {
				if f, err := w.pool.Cancel("H", w.now); err != nil || f.BlocksHeld {
					t.Fatalf("%+v %v", f, err)
				}
			} else if r := w.step(60 * time.Millisecond); len(r.Failed) != 1 || r.Failed[0].BlocksHeld {
				t.Fatalf("%+v", r)
			}
			w.step(time.Millisecond) // the producer takes the notification
			if st := w.cache.Stats(); st.Pinned != 0 {
				t.Fatalf("pinned %d after the stopped READ's grant was given back", st.Pinned)
			}
		})
	}
}
