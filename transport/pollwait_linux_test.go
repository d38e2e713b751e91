package transport

import (
	"context"
	"encoding/binary"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/ecxfer/ecxfer/xfer"
)

// stepEcho serves s from its own loop, as an engine does: Wait, Drain, Reply,
// each reply after a pause drawn from pause (nil: none). It returns a
// function that stops it and reports its error.
func stepEcho(t *testing.T, s *Server, pause func() time.Duration) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		var msgs []xfer.Message
		for s.Wait(ctx) {
			msgs = s.Drain(msgs[:0])
			for _, m := range msgs {
				if pause != nil {
					time.Sleep(pause())
				}
				if err := s.Reply(m.Identity, m.Payload); err != nil {
					t.Error(err)
					return
				}
			}
		}
	}()
	return func() { cancel(); wg.Wait() }
}

// roundTrips sends n numbered requests one at a time and waits for each
// reply with Wait alone, no timeout: a wait that misses what it waits
// for fails by ctx's deadline instead of returning.
func roundTrips(t *testing.T, c *Client, ep string, n int, between func()) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var in []xfer.Inbound
	for i := range n {
		if err := c.Send(ep, seq(i)); err != nil {
			t.Fatal(err)
		}
		for len(in) == 0 {
			if !c.Wait(ctx) {
				t.Fatalf("round trip %d: Wait returned false (%v): its wake-up was lost", i, ctx.Err())
			}
			in = c.Drain(in[:0])
		}
		if got := binary.BigEndian.Uint64(in[0].Payload); got != uint64(i) || len(in) != 1 {
			t.Fatalf("round trip %d: %d replies, the first %d", i, len(in), got)
		}
		in = in[:0]
		if between != nil {
			between()
		}
	}
}

// An owner that waits between its steps reads its busy connections
// itself: after the first messages, which the connections' goroutines
// deliver, both sides take nearly every message in their own Drain, woken
// in Wait by the socket, and no goroutine hands one over.
func TestWaitReadsItsOwnConnections(t *testing.T) {
	s := newServer(t, ServerConfig{})
	c := newClient(t, ClientConfig{})
	defer stepEcho(t, s, nil)()
	const n = 2000
	roundTrips(t, c, s.Endpoint(), n, nil)
	st, ct := s.steps.taken.Load(), c.steps.taken.Load()
	t.Logf("read by the owner: %d requests, %d replies of %d", st, ct, n)
	if st < n*9/10 || ct < n*9/10 {
		t.Fatalf("read by the owner: %d requests, %d replies of %d; want nearly all", st, ct, n)
	}
}

// Whatever may end a wait ends it, with the connections hot or cold, in
// any order with the wait's start: a delivery by a connection's
// goroutine, a connection heated or cooled meanwhile, the timer that
// cools an owner that stopped stepping, pauses on both sides around the
// heat and cool rules' limits. Any wake-up lost hangs a Wait (no timeout).
func TestWaitMissesNoWakeUp(t *testing.T) {
	s := newServer(t, ServerConfig{})
	c := newClient(t, ClientConfig{})
	// A short patience: the timer cools connections between most waits.
	s.steps.patience.Store(int64(2 * time.Millisecond))
	c.steps.patience.Store(int64(2 * time.Millisecond))
	rng := rand.New(rand.NewPCG(1, 2))
	var mu sync.Mutex
	draw := func(max time.Duration) time.Duration {
		mu.Lock()
		defer mu.Unlock()
		if rng.IntN(3) == 0 {
			return 0
		}
		return time.Duration(rng.Int64N(int64(max)))
	}
	defer stepEcho(t, s, func() time.Duration { return draw(300 * time.Microsecond) })()
	roundTrips(t, c, s.Endpoint(), 3000, func() { time.Sleep(draw(4 * time.Millisecond)) })
	st, ct := s.steps.taken.Load(), c.steps.taken.Load()
	t.Logf("read by the owner: %d requests, %d replies", st, ct)
	if st == 0 || ct == 0 || st == 3000 || ct == 3000 {
		t.Fatalf("read by the owner: %d requests, %d replies of 3000: both readers must be used, or the test proves little", st, ct)
	}
}

// A wait in progress ends on each of its other causes: its context
// (false), Close (false), the data plane's signal, which rings it (true),
// its time (true, not before it).
func TestWaitInEnds(t *testing.T) {
	for _, tc := range []struct {
		name string
		end  func(c *Client, cancel func(), ready chan struct{})
		d    time.Duration
		want bool
	}{
		{"context", func(_ *Client, cancel func(), _ chan struct{}) { cancel() }, -1, false},
		{"close", func(c *Client, _ func(), _ chan struct{}) { c.Close() }, -1, false},
		{"ready", func(c *Client, _ func(), ready chan struct{}) { ready <- struct{}{}; c.steps.ring() }, -1, true},
		{"time", func(*Client, func(), chan struct{}) {}, 20 * time.Millisecond, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newServer(t, ServerConfig{})
			c := newClient(t, ClientConfig{})
			if err := c.Connect(context.Background(), s.Endpoint()); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			wctx, wcancel := context.WithCancel(ctx)
			defer wcancel()
			got, ready := make(chan bool, 1), make(chan struct{}, 1)
			start := time.Now()
			go func() { got <- c.waitIn(wctx, ready, tc.d) }()
			// End it once it polls (a ring before that is not this case).
			poll(t, 10*time.Second, "a wait polling", func() bool { return c.steps.pollers.Load() == 1 })
			tc.end(c, wcancel, ready)
			select {
			case woke := <-got:
				if woke != tc.want {
					t.Fatalf("the wait returned %v, want %v", woke, tc.want)
				}
				if took := time.Since(start); took < tc.d {
					t.Fatalf("the wait returned after %v, before its %v", took, tc.d)
				}
			case <-ctx.Done():
				t.Fatal("the wait did not end")
			}
			if c.steps.pollers.Load() != 0 {
				t.Fatal("the wait still counted as polling")
			}
		})
	}
}
