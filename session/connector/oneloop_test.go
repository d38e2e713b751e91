package connector_test

import (
	"context"
	"testing"
	"time"

	"github.com/ecxfer/ecxfer/transport"
)

// One loop steps a Pool and a Producer on one TCP plane and sleeps in the
// Producer's WaitFor: the end of its Pool's READ wakes it (each role's wait
// hears every event of the plane), rather than the wait running out. (One
// wait does run out: the ack comes on the Pool's control plane, which a
// Producer's wait does not watch.)
func TestOneLoopProducerWaitWokenByReadEnd(t *testing.T) {
	epA, _, stopA, err := startBenchProducer(4, 4096, "tcp-no-push", "", "")
	if err != nil {
		t.Fatal(err)
	}
	defer stopA()
	n := newNode(t, 16, "tcp", transport.TCPConfig{})
	n.producer(t)
	pool, prod := n.pool, n.prod

	// Warm up: Connect, so that the fetch is a request, an ack and a READ.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := pool.Connect(ctx, epA); err != nil {
		t.Fatal(err)
	}
	const d = 300 * time.Millisecond
	now := time.Now()
	if _, err := pool.FetchEntry(epA, benchHash(1), 4*4096, now.Add(10*time.Second), now); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	full := 0
	for {
		r := pool.Step(time.Now())
		prod.Step(time.Now())
		if len(r.Failed) > 0 {
			t.Fatalf("failed %+v", r.Failed)
		}
		if len(r.Completed) > 0 {
			break
		}
		w := time.Now()
		prod.WaitFor(ctx, d)
		if time.Since(w) >= d {
			full++
		}
		if ctx.Err() != nil {
			t.Fatal("no outcome")
		}
	}
	t.Logf("fetch took %v, %d full waits of %v", time.Since(start), full, d)
	if full > 1 {
		t.Fatalf("%d waits slept their whole %v: the READ's end did not wake the loop", full, d)
	}
}

// The same loop sleeping in the Pool's WaitFor: a remote consumer's
// notification, which ends the grant it fetched under, wakes it, and the
// grant ends at once rather than when the wait runs out.
func TestOneLoopPoolWaitWokenByNotification(t *testing.T) {
	n := newNode(t, 16, "tcp", transport.TCPConfig{NoPush: true})
	n.producer(t)
	pool, prod := n.pool, n.prod
	e := must(n.cache.Alloc(benchHash(1), 4))
	for j, b := range e.Blocks {
		benchFill(n.region.Block(b), 1, j)
	}
	n.cache.MarkReady(benchHash(1))
	const d = 300 * time.Millisecond
	ctx, cancel := context.WithCancel(context.Background())
	looped := make(chan struct{})
	go func() { // the one loop
		defer close(looped)
		for ctx.Err() == nil {
			pool.Step(time.Now())
			prod.Step(time.Now())
			pool.WaitFor(ctx, d)
		}
	}()
	defer func() { cancel(); <-looped }()
	c := newTierNode(t, 8, "tcp", false)
	c.fetch(t, n.ep, 1)
	done := time.Now()
	for prod.Grants() > 0 {
		if time.Since(done) > 5*time.Second {
			t.Fatal("grant never ended")
		}
		time.Sleep(time.Millisecond)
	}
	took := time.Since(done)
	t.Logf("grant ended %v after the fetch completed", took)
	if took > d/2 {
		t.Fatalf("the notification did not wake the loop: grant ended %v after the fetch", took)
	}
}
