package connector_test

import (
	"context"
	"testing"
	"time"

	"github.com/ecxfer/ecxfer/transport"
)

// A Pool stepped without waiting (its link hot: its Steps read it) calls
// Connect again for a producer already registered: Connect blocks, so it
// holds the plane as a wait does, and its contact READ's answer is read by
// the link's goroutine at once, not once the 20 ms cool-off hands the
// link back.
func TestReconnectOnHotLink(t *testing.T) {
	epA, _, stopA, err := startBenchProducer(4, 4096, "tcp", "", "")
	if err != nil {
		t.Fatal(err)
	}
	defer stopA()
	n := newNode(t, 64, "tcp", transport.TCPConfig{})
	pool, entries := n.pool, n.cache
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := pool.Connect(ctx, epA); err != nil {
		t.Fatal(err)
	}
	// The fastest of five: a link that must cool first holds every Connect
	// (20 ms), a loaded machine only some.
	best := time.Hour
	for i := 1; i <= 5; i++ {
		now := time.Now()
		if _, err := pool.FetchEntry(epA, benchHash(i), 4*4096, now.Add(10*time.Second), now); err != nil {
			t.Fatal(err)
		}
		for { // a loop that steps and never waits
			r := pool.Step(time.Now())
			if len(r.Failed) > 0 {
				t.Fatalf("failed %+v", r.Failed)
			}
			if len(r.Completed) > 0 {
				entries.Unpin(benchHash(i))
				break
			}
		}
		for range 20 { // a few more steps, 100 µs apart: the link stays hot
			pool.Step(time.Now())
			time.Sleep(100 * time.Microsecond)
		}
		start := time.Now()
		if err := pool.Connect(ctx, epA); err != nil {
			t.Fatal(err)
		}
		took := time.Since(start)
		best = min(best, took)
		t.Logf("Connect after stepping: %v", took)
	}
	if best > 15*time.Millisecond {
		t.Fatalf("Connect of a registered producer took %v at best: its contact READ's answer waited for the link to cool", best)
	}
}
