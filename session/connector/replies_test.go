package connector

import (
	"testing"
	"time"

	"github.com/ecxfer/ecxfer/session"
)

// An OK ack the Pool's step handles after its grant's lease (the engine
// stalled between the reply and the step) posts no READ; the fetch asks
// again, gets a new grant, and completes.
func TestPoolRetriesAckPastItsLease(t *testing.T) {
	w := newWorld(t, PoolConfig{AckTimeout: 5 * time.Second})
	w.prod = must(session.NewProducerSession(session.ProducerConfig{Logger: quiet, PinLease: time.Second}, w.pdata, w.cache, compat))
	w.entry(t, "H", 2, true)
	if _, err := w.pool.Fetch(addr, "H", []int{5, 6}, w.now.Add(time.Minute), w.now); err != nil {
		t.Fatal(err)
	}
	// The request is answered and the step that takes the ack comes
	// 1.5 s after it was sent: past the 1 s lease the ack advertises.
	if r := w.step(1500 * time.Millisecond); len(r.Completed)+len(r.Failed) != 0 {
		t.Fatalf("%+v", r)
	}
	if n := len(w.cdata.Posts()); n != 0 {
		t.Fatalf("%d READs posted past the lease", n)
	}
	if st := w.pool.Stats(); st.Retries != 1 {
		t.Fatalf("retries %d", st.Retries)
	}
	r := w.until(t, 10*time.Millisecond, 20, func(r Results) bool { return len(r.Completed)+len(r.Failed) > 0 })
	if len(r.Completed) != 1 || len(w.cdata.Posts()) != 1 || w.prod.Stats().Grants != 2 {
		t.Fatalf("%+v; posts %d, grants %d", r, len(w.cdata.Posts()), w.prod.Stats().Grants)
	}
}
