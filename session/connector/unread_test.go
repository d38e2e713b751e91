package connector_test

import (
	"testing"
	"time"

	"github.com/ecxfer/ecxfer/session/connector"
	"github.com/ecxfer/ecxfer/xfer"
)

// A grant the consumer will not READ (its ack does not fit the request,
// answers a fetch that was cancelled or ended by its deadline, or came
// past its lease) is given back at once: the consumer sends its
// notification without a READ, and the Go producer unpins the entry then,
// not at its 30 s lease. Over the TCP plane and the same-host plane, on
// the first fetch (the producer registered from that very ack) and on a
// warm consumer. Bound: the pin is gone within 2 s of the grant, room for
// a loaded machine and far from the lease; no block handed back is
// written after.
func TestUnreadGrantsAreGivenBack(t *testing.T) {
	if testing.Short() {
		t.Skip("real sockets")
	}
	const lease = 30 * time.Second
	cases := []struct {
		name string
		pool connector.PoolConfig
		// fetch starts the fetch of item and returns the clock to step
		// the pool on.
		fetch func(t *testing.T, w *planeWorld, item int) (clock func() time.Time)
		why   xfer.Reason // how the fetch ends
	}{
		{"bad-fit", connector.PoolConfig{}, func(t *testing.T, w *planeWorld, item int) func() time.Time {
			// Fewer blocks than the entry has: the ack's list does not fit.
			now := time.Now()
			if _, err := w.pool.Fetch(w.endpoint, benchHash(item), w.blocks(faultBlocks-2), now.Add(10*time.Second), now); err != nil {
				t.Fatal(err)
			}
			return time.Now
		}, xfer.BadAck},
		{"cancelled", connector.PoolConfig{}, func(t *testing.T, w *planeWorld, item int) func() time.Time {
			now := time.Now()
			if _, err := w.pool.Fetch(w.endpoint, benchHash(item), w.blocks(faultBlocks), now.Add(10*time.Second), now); err != nil {
				t.Fatal(err)
			}
			// Sent, its ack not taken yet: no Step has run.
			f, err := w.pool.Cancel(benchHash(item), now)
			if err != nil || f.Reason != xfer.Canceled || f.BlocksHeld {
				t.Fatalf("cancel: %+v, %v", f, err)
			}
			w.canary(f.Blocks)
			return time.Now
		}, xfer.Canceled},
		{"past-deadline", connector.PoolConfig{}, func(t *testing.T, w *planeWorld, item int) func() time.Time {
			// The ack takes 150 ms (each way); the fetch has 50.
			w.ctl.SetDelay(150 * time.Millisecond)
			now := time.Now()
			if _, err := w.pool.Fetch(w.endpoint, benchHash(item), w.blocks(faultBlocks), now.Add(50*time.Millisecond), now); err != nil {
				t.Fatal(err)
			}
			return time.Now
		}, xfer.DeadlineExceeded},
		{"past-lease", connector.PoolConfig{AckTimeout: time.Minute, Retry: connector.RetryConfig{MaxAttempts: 1}},
			func(t *testing.T, w *planeWorld, item int) func() time.Time {
				// The engine's steps stall past the lease the ack states (a
				// clock that jumps once the producer granted): the ack is
				// handled late. A consumer's own PinLease does not do it:
				// a Go producer's ack states its lease, which the consumer
				// takes.
				grants := w.prod.Stats().Grants
				var skew time.Duration
				clock := func() time.Time {
					if skew == 0 && w.prod.Stats().Grants > grants {
						skew = lease + time.Second
					}
					return time.Now().Add(skew)
				}
				now := clock()
				if _, err := w.pool.Fetch(w.endpoint, benchHash(item), w.blocks(faultBlocks), now.Add(2*time.Minute), now); err != nil {
					t.Fatal(err)
				}
				return clock
			}, xfer.LateCompletion},
	}
	for _, pl := range []struct {
		name   string
		shared bool
	}{{"tcp", false}, {"same-host", true}} {
		for _, warm := range []bool{false, true} {
			for _, tc := range cases {
				name := pl.name + "/" + tc.name + "/first-fetch"
				if warm {
					name = pl.name + "/" + tc.name + "/warm"
				}
				t.Run(name, func(t *testing.T) {
					w := newPlaneWorld(t, worldConfig{shared: pl.shared, lease: lease, pool: tc.pool})
					if warm {
						w.fetchOK(0)
						for end := time.Now().Add(2 * time.Second); w.prod.Grants() > 0; time.Sleep(time.Millisecond) {
							if time.Now().After(end) {
								t.Fatalf("the first fetch's grant still held 2 s after it completed")
							}
						}
					}
					before := w.prod.Stats()
					const item = 1
					clock := tc.fetch(t, w, item)
					ended := tc.why == xfer.Canceled
					var granted time.Time
					ctx := time.Now().Add(5 * time.Second)
					for !ended || granted.IsZero() || w.prod.Grants() > 0 {
						if time.Now().After(ctx) {
							t.Fatalf("ended %v, granted at %v, %d grants held (lease %v); producer %+v",
								ended, granted, w.prod.Grants(), lease, w.prod.Stats())
						}
						if granted.IsZero() && w.prod.Stats().Grants > before.Grants {
							granted = time.Now()
						}
						if !granted.IsZero() && time.Since(granted) > 2*time.Second {
							t.Fatalf("the grant still holds its pin 2 s after it was made (lease %v); producer %+v", lease, w.prod.Stats())
						}
						w.pool.WaitFor(w.t.Context(), 5*time.Millisecond)
						r := w.pool.Step(clock())
						for _, d := range r.Completed {
							t.Fatalf("%s completed", d.MMHash)
						}
						for _, f := range r.Failed {
							if f.MMHash != benchHash(item) || f.Reason != tc.why || f.BlocksHeld {
								t.Fatalf("failure %+v (%v)", f, f.Err)
							}
							ended = true
							w.canary(f.Blocks)
						}
						for _, rel := range r.Released {
							w.canary(rel.Blocks)
						}
					}
					st := w.prod.Stats()
					if st.Grants != before.Grants+1 || st.Completions != before.Completions+1 || st.Expired != 0 ||
						st.BadTokens != 0 || st.UnknownNotifs != 0 {
						t.Fatalf("producer %+v; before %+v", st, before)
					}
					t.Logf("unpinned %v after the grant", time.Since(granted).Round(time.Millisecond))
					w.ctl.SetDelay(0)
					if tc.why != xfer.LateCompletion { // that pool's clock runs ahead of the producer's
						w.fetchOK(2)
					}
					w.closeAndCheck()
				})
			}
		}
	}
}
