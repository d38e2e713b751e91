package connector

import (
	"context"
	"testing"
	"time"

	"github.com/ecxfer/ecxfer/internal/xfake"
)

// Outcomes of fetches that end during Connect's steps are kept for the
// next Step (p.kept). Close, called instead of a Step, resets the
// results first: those outcomes are lost, and a fetch ends neither in
// Completed nor in Failed (its blocks are never handed back).
func TestCloseAfterConnectKeepsItsOutcomes(t *testing.T) {
	w := newWorld(t, PoolConfig{AckTimeout: 20 * time.Millisecond})
	w.entry(t, "H", 1, true)
	w.cdata.SetOutcome(xfake.Outcome{Kind: xfake.CompleteAfter, After: 2})
	// Caller's clock on the wall clock, so that Connect's own steps (on
	// time.Now()) judge nothing late.
	w.now = time.Now()
	if _, err := w.pool.Fetch(addr, "H", []int{7}, w.now.Add(time.Minute), w.now); err != nil {
		t.Fatal(err)
	}
	w.step(time.Millisecond) // granted; the READ is posted
	// Connect runs until H's READ has ended and been released (its outcome
	// taken by Connect's own steps), however slowly the machine runs it.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	read := w.cdata.Posts()[0].Handle
	go func() {
		for ctx.Err() == nil && w.cdata.Releases(read) == 0 {
			time.Sleep(100 * time.Microsecond)
		}
		cancel()
	}()
	w.pool.cfg.Now = func() time.Time { return w.now } // the engine's clock
	w.pool.Connect(ctx, "tcp://other:1")               // H's READ completes during it
	if len(w.pool.fetches) != 0 || w.pool.InFlight() != 1 {
		t.Fatalf("H did not end during Connect, or its outcome is not owed (%d in flight)", w.pool.InFlight())
	}
	if err := w.pool.Close(); err != nil {
		t.Fatal(err)
	}
	r := w.pool.Step(w.now) // what Close ended
	if len(r.Completed)+len(r.Failed) != 1 {
		t.Fatalf("fetch H ended during Connect and its outcome is lost at Close: %+v", *r)
	}
}
