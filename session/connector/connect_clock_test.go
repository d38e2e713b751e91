package connector

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/ecxfer/ecxfer/internal/xfake"
	"github.com/ecxfer/ecxfer/session"
)

// Connect steps the pool with time.Now(), while Step runs on the
// caller's clock (the package's rule: every deadline comes from the
// caller's now). A READ of another producer that ends during Connect is
// judged against the wrong clock: here the caller's clock is an hour
// ahead of the wall clock, the READ ends after its grant's lease by the
// caller's clock (the producer unpinned and a new save rewrote the
// block), and the fetch completes with the new save's bytes.
func TestConnectJudgesFetchesOnTheCallersClock(t *testing.T) {
	w := newWorld(t, PoolConfig{AckTimeout: 20 * time.Millisecond})
	w.now = time.Now().Add(time.Hour) // the engine's clock
	w.prod = must(session.NewProducerSession(session.ProducerConfig{Logger: quiet, PinLease: 100 * time.Millisecond},
		w.pdata, w.cache, compat))
	w.entry(t, "H", 1, true)
	ent, _ := w.cache.Get("H")
	copy(w.pdata.Block(ent.Blocks[0]), "H-bytes!")
	w.cdata.SetOutcome(xfake.Outcome{Kind: xfake.CompleteAfter, After: 3})
	if _, err := w.pool.Fetch(addr, "H", []int{7}, w.now.Add(time.Minute), w.now); err != nil {
		t.Fatal(err)
	}
	w.step(time.Millisecond) // granted; the READ is posted
	if len(w.cdata.Posts()) != 1 {
		t.Fatalf("%d READs posted", len(w.cdata.Posts()))
	}
	// The grant's lease ends (caller's clock): unpinned; a new save
	// rewrites the block.
	w.now = w.now.Add(300 * time.Millisecond)
	w.prod.Poll(nil, replier{w.ctl, addr}, w.now)
	if w.prod.Grants() != 0 {
		t.Fatal("the grant outlived its lease")
	}
	copy(w.pdata.Block(ent.Blocks[0]), "J-bytes!")

	// The engine warms up another producer, which does not answer.
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Millisecond)
	defer cancel()
	w.pool.cfg.Now = func() time.Time { return w.now } // the engine's clock
	w.pool.Connect(ctx, "tcp://other:1")

	r := w.pool.Step(w.now)
	for _, d := range r.Completed {
		got := w.cdata.Block(7)
		t.Fatalf("fetch %s completed, READ ended past its grant's lease by the caller's clock; block holds %q (Connect stepped on time.Now())",
			d.MMHash, bytes.TrimRight(got, "\x00"))
	}
}
