package connector_test

import (
	"errors"
	"testing"
	"time"

	"github.com/ecxfer/ecxfer/xfer"
)

// The deadline given to Fetch is the engine's budget, on real sockets too:
// a fetch ends by it whatever stage it is in, with reason deadline, its
// blocks free (the TCP plane stops its READs for certain, the same-host
// copies run at memory speed) and never written after. Bounds: the
// deadline is 300 ms; the fetch ends by the deadline plus 150 ms, room for
// one step (10 ms at most between steps with a fetch in flight) on a
// loaded machine; it ends no earlier than the deadline unless no retry
// fits before it (a producer killed).
func TestDeadlineOnRealPlanes(t *testing.T) {
	if testing.Short() {
		t.Skip("real-socket faults")
	}
	const (
		budget = 300 * time.Millisecond
		slack  = 150 * time.Millisecond
	)
	stages := []struct {
		name string
		// fault is in force before the fetch; then, once the producer has
		// granted (the ack is on its way, the READ about to be posted),
		// if not nil.
		fault, then func(w *planeWorld)
		early       bool // may end before its deadline: no retry fits
		// cold: no fetch before, on the same-host plane. Once a producer
		// proved it owns its region, a same-host READ is a copy out of
		// the mapping with no socket to stall: only the first one, behind
		// the proof, waits on the data connection.
		cold bool
	}{
		{name: "waiting-for-ack", fault: func(w *planeWorld) { w.ctl.Blackhole(true) }},
		{name: "read-stalled", fault: func(w *planeWorld) { w.data.Blackhole(true) }, cold: true},
		{name: "producer-stopped", fault: func(w *planeWorld) { w.data.Blackhole(true) },
			then: func(w *planeWorld) { w.ctl.Blackhole(true) }, cold: true},
		{name: "producer-killed", fault: func(w *planeWorld) { w.data.Blackhole(true) },
			then: func(w *planeWorld) {
				w.ctl.Refuse(true)
				w.data.Refuse(true)
				w.ctl.Reset()
				w.data.Reset()
				w.kill()
			}, early: true, cold: true},
	}
	for _, pl := range []struct {
		name   string
		shared bool
	}{{"tcp", false}, {"same-host", true}} {
		for _, st := range stages {
			t.Run(pl.name+"/"+st.name, func(t *testing.T) {
				w := newPlaneWorld(t, worldConfig{shared: pl.shared, lease: 30 * time.Second})
				if !(pl.shared && st.cold) {
					w.fetchOK(0) // the producer registered, the data connection up
				}
				const item = 1
				st.fault(w)
				grants := w.prod.Stats().Grants
				start := time.Now()
				deadline := start.Add(budget)
				if _, err := w.pool.Fetch(w.endpoint, benchHash(item), w.blocks(faultBlocks), deadline, start); err != nil {
					t.Fatal(err)
				}
				then := st.then
				o := w.await(item, func() {
					if then != nil && w.prod.Stats().Grants > grants {
						then(w)
						then = nil
					}
				})
				if st.then != nil && then != nil {
					t.Fatal("the producer never granted: the stage was not reached")
				}
				if o.done != nil {
					t.Fatalf("completed at +%v despite the fault", o.at.Sub(start))
				}
				f := o.fail
				if f.Reason != xfer.DeadlineExceeded || !errors.Is(f.Err, xfer.DeadlineExceeded) || f.BlocksHeld {
					t.Fatalf("failure %+v (%v)", *f, f.Err)
				}
				if o.at.After(deadline.Add(slack)) || (!st.early && o.at.Before(deadline)) {
					t.Fatalf("ended at +%v, deadline +%v", o.at.Sub(start), budget)
				}
				t.Logf("ended at +%v: %v", o.at.Sub(start).Round(time.Millisecond), f.Err)
				w.ctl.Blackhole(false)
				w.data.Blackhole(false)
				if st.name != "producer-killed" {
					// The stalled bytes flow again: they land in no block
					// handed back (closeAndCheck), and the next fetch works.
					w.fetchOK(2)
				}
				w.closeAndCheck()
			})
		}
	}
}

// A producer that stays silent past the control plane's peer timeout (500
// ms here) with a READ under way ends that fetch at once, long before its
// deadline, with reason peer-down; its blocks are free (the TCP plane
// stops its READs), and never written after. Bound: 500 ms of silence,
// then up to 300 ms for the ping that notices it and the step.
func TestSilentProducerEndsItsFetchOnRealPlanes(t *testing.T) {
	if testing.Short() {
		t.Skip("real-socket faults")
	}
	for _, pl := range []struct {
		name   string
		shared bool
	}{{"tcp", false}, {"same-host", true}} {
		t.Run(pl.name, func(t *testing.T) {
			w := newPlaneWorld(t, worldConfig{shared: pl.shared, lease: 30 * time.Second})
			if !pl.shared {
				w.fetchOK(0)
			}
			const item = 1
			w.data.Blackhole(true)
			grants := w.prod.Stats().Grants
			start := time.Now()
			if _, err := w.pool.Fetch(w.endpoint, benchHash(item), w.blocks(faultBlocks), start.Add(10*time.Second), start); err != nil {
				t.Fatal(err)
			}
			var stopped time.Time
			o := w.await(item, func() {
				if stopped.IsZero() && w.prod.Stats().Grants > grants {
					w.ctl.Blackhole(true) // SIGSTOP: nothing comes from it
					stopped = time.Now()
				}
			})
			if stopped.IsZero() {
				t.Fatal("the producer never granted")
			}
			if o.done != nil {
				t.Fatal("completed despite the fault")
			}
			f := o.fail
			if f.Reason != xfer.PeerDown || !errors.Is(f.Err, xfer.ErrPeerSilent) || f.BlocksHeld {
				t.Fatalf("failure %+v (%v)", *f, f.Err)
			}
			// Detected at the peer timeout (500 ms; 600 measured, the check
			// running on the ping's tick), long before the fetch's 10 s
			// deadline; the slack is for a loaded machine.
			if took := o.at.Sub(stopped); took > 2*time.Second {
				t.Fatalf("ended %v after the producer stopped (peer timeout 500 ms)", took)
			}
			t.Logf("ended %v after the producer stopped: %v", o.at.Sub(stopped).Round(time.Millisecond), f.Err)
			w.ctl.Blackhole(false)
			w.data.Blackhole(false)
			w.fetchOK(2)
			w.closeAndCheck()
		})
	}
}
