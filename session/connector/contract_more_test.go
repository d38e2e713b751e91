package connector

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/ecxfer/ecxfer/internal/xfake"
	"github.com/ecxfer/ecxfer/xfer"
)

// A release that Connect's steps took is owed to the next Step as much as
// a completion is: Wait must not sleep past it.
func TestWaitReturnsForAnOwedRelease(t *testing.T) {
	w := newWorld(t, PoolConfig{AckTimeout: 5 * time.Millisecond})
	w.stuckRead(t, "H")
	if f, err := w.pool.Cancel("H", w.now); err != nil || !f.BlocksHeld {
		t.Fatalf("cancel: %+v %v", f, err)
	}
	w.cdata.Finish(w.cdata.Posts()[0].Handle) // the held READ ends
	// A step of Connect's takes H's release, kept for the caller's next
	// Step, as Connect's own steps do.
	w.pool.keep()
	w.pool.step(w.now)
	if !w.pool.kept || len(w.pool.res.Released) != 1 {
		t.Fatalf("the kept step took no release (kept %v, %+v)", w.pool.kept, w.pool.res)
	}
	ctx2, cancel2 := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel2()
	start := time.Now()
	woke := w.pool.Wait(ctx2)
	slept := time.Since(start)
	r := w.pool.Step(w.now)
	if !woke && len(r.Released) == 1 {
		t.Fatalf("Wait slept %v until its context ended (InFlight %d) with H's release owed to the next Step: %+v",
			slept, w.pool.InFlight(), r.Released)
	}
}

// Blocks still held with no fetch in flight come back in a later Step
// (Released): Wait must not sleep on the control plane alone past them.
func TestWaitReturnsForAHeldRelease(t *testing.T) {
	w := newWorld(t, PoolConfig{AckTimeout: 5 * time.Millisecond})
	w.stuckRead(t, "H")
	if f, err := w.pool.Cancel("H", w.now); err != nil || !f.BlocksHeld {
		t.Fatalf("cancel: %+v %v", f, err)
	}
	if n := w.pool.InFlight(); n != 0 {
		t.Fatalf("InFlight %d after the only fetch was canceled", n)
	}
	w.cdata.Finish(w.cdata.Posts()[0].Handle) // the held READ ends
	// Nothing else will wake the control plane: a Wait that misses the
	// release sleeps until the context ends.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for i := 0; ; i++ {
		if !w.pool.Wait(ctx) {
			t.Fatal("Wait slept until its context ended with H's blocks held")
		}
		w.now = w.now.Add(time.Millisecond)
		if r := w.pool.Step(w.now); len(r.Released) == 1 {
			break
		}
		if i == 1000 {
			t.Fatal("no Released after 1000 Waits")
		}
	}
}

// A fetch held behind the producer's first answer, whose own send the
// control plane then refused, has sent no request on that connection: a
// silent death of it should let the fetch go on, on a new connection.
func TestSilentDeathSparesAFetchWhoseSendItRefused(t *testing.T) {
	w := newWorld(t, PoolConfig{AckTimeout: 20 * time.Millisecond, Retry: RetryConfig{BaseBackoff: 50 * time.Millisecond}})
	w.entry(t, "A", 1, true)
	w.entry(t, "H", 2, true)
	w.fetch(t, "A", time.Minute) // the first request: the producer is not registered yet
	w.fetch(t, "H", time.Minute) // held behind A's answer
	if f := w.pool.fetches["H"]; f.heldOn == nil || f.pe != nil {
		t.Fatalf("H not held: %+v", f)
	}
	w.ctl.sendErr = fmt.Errorf("refused: %w", xfer.ErrQueueFull)
	w.stepOnly(25 * time.Millisecond) // H's hold is over; its send is refused
	w.ctl.sendErr = nil
	f := w.pool.fetches["H"]
	if f == nil || f.attempts != 0 || f.pe != nil || f.retryAt.IsZero() {
		t.Fatalf("H's send was not refused as planned: %+v", f)
	}
	t.Logf("H after its refused send: attempts %d, pe %v, heldOn %p", f.attempts, f.pe, f.heldOn)
	w.ctl.dead = append(w.ctl.dead, xfer.Death{Addr: addr, Err: fmt.Errorf("guard: %w", xfer.ErrPeerSilent)})
	r := w.stepOnly(time.Millisecond)
	if h := pick(r.Failed, "H"); len(h) != 0 {
		t.Fatalf("a silent death ended H, none of whose requests went on its connection (its send was refused): %+v", h[0])
	}
}

// ControlClient.Dead says a silent death ends the READs from that
// producer. A READ that runs on from an earlier connection to it (one
// that closed) is one of them.
func TestSilentProducerEndsTheReadOfItsEarlierConnection(t *testing.T) {
	w := newWorld(t, PoolConfig{})
	w.entry(t, "H", 2, true)
	w.entry(t, "G", 2, true)
	w.cdata.SetStopsReads(true)
	w.cdata.QueueOutcomes(xfake.Outcome{Kind: xfake.Stuck})
	w.fetch(t, "H", time.Minute)
	w.step(time.Millisecond)
	w.step(time.Millisecond)
	if len(w.cdata.Posts()) != 1 {
		t.Fatal("no READ posted")
	}
	w.ctl.dead = append(w.ctl.dead, xfer.Death{Addr: addr, Err: errClosed})
	if r := w.stepOnly(time.Millisecond); len(r.Failed) != 0 {
		t.Fatalf("a closed connection ended H: %+v", r.Failed)
	}
	w.fetch(t, "G", time.Minute) // a new connection to the same producer
	w.ctl.dead = append(w.ctl.dead, xfer.Death{Addr: addr, Err: fmt.Errorf("guard: %w", xfer.ErrPeerSilent)})
	r := w.stepOnly(time.Millisecond)
	if len(pick(r.Failed, "G")) != 1 {
		t.Fatalf("G not ended: %+v", r.Failed)
	}
	if len(pick(r.Failed, "H")) != 1 {
		t.Fatalf("the producer was declared silent and H's READ from it runs on (draining %d, in flight %d): %+v",
			len(w.pool.draining), w.pool.InFlight(), r.Failed)
	}
}

// Stats may be called from any goroutine while Steps complete fetches.
func TestStatsWhileStepping(t *testing.T) {
	w := newWorld(t, PoolConfig{})
	var wg sync.WaitGroup
	stop := make(chan struct{})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			s := w.pool.Stats()
			_ = s.Latency.Quantile(0.5)
			_ = s.FailedBy.String()
		}
	}()
	for i := range 20 {
		h := fmt.Sprintf("H%d", i)
		w.entry(t, h, 1, true)
		if _, err := w.pool.Fetch(addr, h, []int{i}, w.now.Add(time.Minute), w.now); err != nil {
			t.Fatal(err)
		}
		w.until(t, time.Millisecond, 10, func(r Results) bool { return len(r.Completed) > 0 })
	}
	close(stop)
	wg.Wait()
	if s := w.pool.Stats(); s.Latency.N != 20 {
		t.Fatalf("latency counted %d", s.Latency.N)
	}
}

// InFlight counts a hit owed to the next Step; PoolStats.InFlight says
// "fetches not ended" too.
func TestStatsInFlightCountsAHit(t *testing.T) {
	w, cc := entryWorld(t, PoolConfig{}, 8)
	e, _ := cc.Alloc("H", 1)
	cc.MarkReady(e.Key)
	if _, err := w.pool.FetchEntry(addr, "H", 8, w.now.Add(time.Minute), w.now); err != nil {
		t.Fatal(err)
	}
	w.pool.publish()
	if got, want := w.pool.Stats().InFlight, w.pool.InFlight(); got != want {
		t.Fatalf("Stats().InFlight %d, InFlight() %d", got, want)
	}
}
