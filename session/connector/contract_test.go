package connector

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/ecxfer/ecxfer/internal/xfake"
	"github.com/ecxfer/ecxfer/xfer"
)

const addr2 = "tcp://producer:2"

// stepBoth is world.step delivering the requests sent to addr and to addr2
// to the one producer session (as two consumers' identities), each reply
// back to the address its request went to.
func (w *world) stepBoth(d time.Duration) Results {
	w.now = w.now.Add(d)
	for _, a := range []string{addr, addr2} {
		var msgs []xfer.Message
		for _, p := range w.ctl.out[a] {
			msgs = append(msgs, xfer.Message{Identity: []byte(a), Payload: p})
		}
		delete(w.ctl.out, a)
		w.prod.Poll(msgs, replier{w.ctl, a}, w.now)
	}
	r := w.pool.Step(w.now)
	w.failed = append(w.failed, r.Failed...)
	return Results{slices.Clone(r.Completed), slices.Clone(r.Failed), slices.Clone(r.Released)}
}

// A Released outcome gives back the blocks of the fetch whose READ ended,
// never those of another fetch of the same mm_hash whose READ may still
// write. Here a plain Fetch of H from one producer is cancelled with its
// READ unstoppable (held), then the engine fetches H into the cache from
// another producer (FetchEntry), and that READ is held too. When the
// first READ ends, its release must not free the cache entry of the
// second, whose READ still runs.
func TestNoFetchWhileAnEarlierReadMayWrite(t *testing.T) {
	w, cc := entryWorld(t, PoolConfig{}, 16)
	w.entry(t, "H", 2, true)
	w.cdata.QueueOutcomes(xfake.Outcome{Kind: xfake.Stuck, Unstoppable: true})

	// Plain fetch from addr into the engine's own blocks 40, 41.
	if _, err := w.pool.Fetch(addr, "H", []int{40, 41}, w.now.Add(time.Minute), w.now); err != nil {
		t.Fatal(err)
	}
	w.stepBoth(time.Millisecond)
	w.stepBoth(time.Millisecond)
	if len(w.cdata.Posts()) != 1 {
		t.Fatal("no READ posted")
	}
	if f, err := w.pool.Cancel("H", w.now); err != nil || !f.BlocksHeld {
		t.Fatalf("cancel: %+v %v", f, err)
	}

	// The same entry into the cache, from the other producer: refused
	// while the first READ may still write, whichever session follows it.
	if _, err := w.pool.FetchEntry(addr2, "H", 16, w.now.Add(time.Minute), w.now); !errors.Is(err, ErrInFlight) {
		t.Fatalf("FetchEntry from the second producer while a READ of H may still write: %v", err)
	}
	if _, err := w.pool.Fetch(addr2, "H", []int{42, 43}, w.now.Add(time.Minute), w.now); !errors.Is(err, ErrInFlight) {
		t.Fatalf("Fetch from the second producer while a READ of H may still write: %v", err)
	}
	// The first READ ends: its blocks (40, 41) come back, and H may be
	// fetched again, into the cache.
	w.cdata.Finish(w.cdata.Posts()[0].Handle)
	r := w.stepBoth(time.Millisecond)
	if len(r.Released) != 1 || !slices.Equal(r.Released[0].Blocks, []int{40, 41}) {
		t.Fatalf("released %+v", r.Released)
	}
	if _, err := w.pool.FetchEntry(addr2, "H", 16, w.now.Add(time.Minute), w.now); err != nil {
		t.Fatal(err)
	}
	var done []Done
	for range 10 {
		done = append(done, w.stepBoth(time.Millisecond).Completed...)
	}
	if len(done) != 1 || !done[0].Held {
		t.Fatalf("%+v", done)
	}
	if st := cc.Stats(); st.Pinned != 1 || st.NotReady != 0 {
		t.Fatalf("cache %+v", st)
	}
}

// Fetch refuses an mm_hash while a READ of an earlier fetch of it may
// still write (ErrInFlight), as its doc says, whichever producer the new
// fetch goes to.
func TestFetchRefusedWhileADrainingReadMayWrite(t *testing.T) {
	w := newWorld(t, PoolConfig{})
	w.entry(t, "H", 2, true)
	w.cdata.QueueOutcomes(xfake.Outcome{Kind: xfake.Stuck, Unstoppable: true})
	if _, err := w.pool.Fetch(addr, "H", []int{40, 41}, w.now.Add(time.Minute), w.now); err != nil {
		t.Fatal(err)
	}
	w.stepBoth(time.Millisecond)
	w.stepBoth(time.Millisecond)
	if f, err := w.pool.Cancel("H", w.now); err != nil || !f.BlocksHeld {
		t.Fatalf("cancel: %+v %v", f, err)
	}
	// The same producer: refused, as documented.
	if _, err := w.pool.Fetch(addr, "H", []int{42, 43}, w.now.Add(time.Minute), w.now); !errors.Is(err, ErrInFlight) {
		t.Fatalf("same producer: %v", err)
	}
	// Another producer: the READ into 40, 41 may still write all the same.
	if _, err := w.pool.Fetch(addr2, "H", []int{42, 43}, w.now.Add(time.Minute), w.now); !errors.Is(err, ErrInFlight) {
		t.Fatalf("another producer: Fetch of H while a READ of H may still write: err %v, in flight %d", err, w.pool.InFlight())
	}
}

// Results are valid until the next Step, Connect or Close, and every
// fetch ends once: a Step after Connect hands over what ended during
// Connect, not again what the Step before it handed over.
func TestConnectHandsOutNoOutcomeTwice(t *testing.T) {
	w := newLoopWorld(t, false)
	w.entry(t, "H", 1, true)
	if _, err := w.pool.Fetch(addr, "H", []int{5}, w.now.Add(time.Minute), w.now); err != nil {
		t.Fatal(err)
	}
	var done int
	for range 10 {
		r := w.step(time.Millisecond)
		done += len(r.Completed)
		if done > 0 {
			break
		}
	}
	if done != 1 {
		t.Fatalf("%d completed", done)
	}
	w.pool.cfg.Now = func() time.Time { return w.now }
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if err := w.pool.Connect(ctx, "tcp://other:1"); err != nil {
		t.Fatal(err)
	}
	r := w.step(time.Millisecond)
	if len(r.Completed) != 0 {
		t.Fatalf("the Step after Connect handed over H's completion again: %+v", r.Completed)
	}
}

// The same with a fetch into the cache: the Done says Held, and an engine
// that lets go of each Done's entry once (Cache.Unpin) unpins it twice.
func TestConnectHandsOutNoHeldEntryTwice(t *testing.T) {
	w, cc := entryWorld(t, PoolConfig{}, 8)
	lc := &loopCtl{memCtl: w.ctl, w: w}
	w.pool.ctl = lc
	w.entry(t, "H", 1, true)
	if _, err := w.pool.FetchEntry(addr, "H", 8, w.now.Add(time.Minute), w.now); err != nil {
		t.Fatal(err)
	}
	var unpins []error
	take := func(r Results) {
		for _, d := range r.Completed {
			if d.Held {
				unpins = append(unpins, cc.Unpin(d.MMHash))
			}
		}
	}
	for range 10 {
		if take(w.step(time.Millisecond)); len(unpins) > 0 {
			break
		}
	}
	w.pool.cfg.Now = func() time.Time { return w.now }
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if err := w.pool.Connect(ctx, "tcp://other:1"); err != nil {
		t.Fatal(err)
	}
	take(w.step(time.Millisecond))
	if len(unpins) != 1 {
		t.Fatalf("%d held completions of one fetch; unpins: %v", len(unpins), unpins)
	}
}

// A producer declared dead for its silence ends its fetches at once, in
// Failed with reason peer-down, whatever they wait for: its ack, too, not
// only a READ.
func TestSilentProducerEndsAFetchWaitingForItsAck(t *testing.T) {
	w := newWorld(t, PoolConfig{})
	w.entry(t, "H", 2, true)
	w.fetch(t, "H", time.Minute)
	w.stepOnly(time.Millisecond) // sent, never answered
	w.ctl.dead = append(w.ctl.dead, xfer.Death{Addr: addr, Err: fmt.Errorf("guard: %w", xfer.ErrPeerSilent)})
	r := w.stepOnly(time.Millisecond)
	if len(r.Failed) != 1 || r.Failed[0].Reason != xfer.PeerDown {
		for range 50 {
			w.stepOnly(20 * time.Millisecond)
		}
		t.Fatalf("the fetch of a producer declared dead for its silence did not end: failed %+v; "+
			"%d requests sent since; %d failures in %v", r.Failed, len(w.ctl.out[addr]), len(w.failed), w.now.Sub(t0))
	}
}

// Cancel of a fetch started past its deadline, on a clock that starts at
// the zero time, neither panics nor fails.
func TestCancelOfAFetchStartedPastItsDeadlineAtTimeZero(t *testing.T) {
	w := newWorld(t, PoolConfig{})
	var zero time.Time
	if _, err := w.pool.Fetch(addr, "H", []int{1}, zero, zero); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if v := recover(); v != nil {
			t.Fatalf("Cancel panicked: %v", v)
		}
	}()
	if f, err := w.pool.Cancel("H", zero); err != nil || f.Reason != xfer.Canceled {
		t.Fatalf("%+v %v", f, err)
	}
}

// A grant the consumer will not READ is given back at once: here the ack
// of a Go producer that comes after the fetch's request was forgotten at
// its ack deadline (the fetch ended by its deadline). The ack names its
// grant and token, so its notification can end that grant alone; without
// it the entry stays pinned at the producer for the whole lease.
func TestLateAckOfAForgottenRequestIsGivenBack(t *testing.T) {
	w := newWorld(t, PoolConfig{AckTimeout: 20 * time.Millisecond, Retry: RetryConfig{BaseBackoff: time.Second}})
	w.entry(t, "G", 1, true)
	w.entry(t, "H", 2, true)
	// A first fetch: the producer is known to name the request each reply
	// answers, so unanswered records expire at their ack deadline.
	if _, err := w.pool.Fetch(addr, "G", []int{9}, w.now.Add(time.Minute), w.now); err != nil {
		t.Fatal(err)
	}
	w.until(t, time.Millisecond, 10, func(r Results) bool { return len(r.Completed) > 0 })
	w.step(time.Millisecond)
	if st := w.cache.Stats(); st.Pinned != 0 {
		t.Fatalf("G still pinned: %+v", st)
	}
	w.fetch(t, "H", 30*time.Millisecond) // its request goes, the producer does not read it yet
	r := w.stepOnly(25 * time.Millisecond)
	if len(r.Failed) != 1 || r.Failed[0].Reason != xfer.DeadlineExceeded {
		t.Fatalf("%+v", r)
	}
	w.step(time.Millisecond) // the producer grants H; the pool gets the late ack
	if st := w.prod.Stats(); st.Grants != 2 || w.cache.Stats().Pinned != 1 {
		t.Fatalf("no late grant: %+v", st)
	}
	w.step(time.Millisecond)
	w.step(time.Millisecond)
	if st := w.cache.Stats(); st.Pinned != 0 {
		t.Fatalf("the late grant of the ended fetch is still pinned (%d unread notifications sent, %d stray acks); "+
			"it waits out its lease", w.cdata.Notifies(), w.pool.peers[addr].s.Stats().StrayAcks)
	}
}

// The consumer loop of the README, over entries the cache holds already
// (FetchEntry hits): each completes in the next Step, held, and the loop
// lets each go; no pin is left behind.
func TestReadmeLoopTakesHits(t *testing.T) {
	w, cc := entryWorld(t, PoolConfig{}, 8)
	e, err := cc.Alloc("H", 1)
	if err != nil {
		t.Fatal(err)
	}
	cc.MarkReady(e.Key)
	if _, err := w.pool.FetchEntry(addr, "H", 8, w.now.Add(50*time.Millisecond), w.now); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	steps := 0
	for w.pool.InFlight() > 0 && w.pool.Wait(ctx) {
		r := w.pool.Step(w.now)
		steps++
		for _, d := range r.Completed {
			cc.Unpin(d.MMHash)
		}
	}
	if st := cc.Stats(); st.Pinned != 0 {
		t.Fatalf("the hit's entry is left pinned (InFlight %d, %d steps): %+v", w.pool.InFlight(), steps, st)
	}
}

// Wait returns when a Step has work: a hit to hand over is such work.
func TestWaitReturnsForAHit(t *testing.T) {
	w, cc := entryWorld(t, PoolConfig{}, 8)
	e, _ := cc.Alloc("H", 1)
	cc.MarkReady(e.Key)
	if _, err := w.pool.FetchEntry(addr, "H", 8, w.now.Add(50*time.Millisecond), w.now); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if !w.pool.Wait(ctx) {
		t.Fatal("Wait slept until its context ended with a hit to hand over")
	}
}
