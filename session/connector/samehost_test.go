package connector_test

import (
	"context"
	"testing"
	"time"

	"github.com/ecxfer/ecxfer/cache"
	"github.com/ecxfer/ecxfer/session/connector"
	"github.com/ecxfer/ecxfer/transport"
)

// Between a Pool and a Producer on one host, over the real control plane
// and a Shared region, every fetch but the first (whose connection proves
// the producer owns the region) copies under the grant the producer
// published (no READ is sent), holds the producer's bytes, and ends its
// grant through the notification, not the lease.
func TestSameHostFetchesUnasked(t *testing.T) {
	const blocks, bs = 4, 4096
	ep, _, stop, err := startBenchProducer(blocks, bs, "shm", "", "")
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	prod := lastProducer
	region := must(cache.NewRegion(cache.RegionConfig{Blocks: blocks, BlockSize: bs, NoLock: true}))
	defer region.Close()
	cdata := must(transport.NewTCPData(transport.TCPConfig{Logger: benchQuiet}, region))
	defer cdata.Close()
	cli := transport.NewClient(transport.ClientConfig{Logger: benchQuiet})
	defer cli.Close()
	pool := must(connector.NewPool(connector.PoolConfig{CompatHash: "bench", BlockSize: bs, Logger: benchQuiet}, cli, cdata))
	defer pool.Close()
	ids := []int{0, 1, 2, 3}
	want := make([]byte, bs)
	const n = 20
	for i := range n {
		now := time.Now()
		if _, err := pool.Fetch(ep, benchHash(i), ids, now.Add(10*time.Second), now); err != nil {
			t.Fatal(err)
		}
		for done := false; !done; {
			r := pool.Step(time.Now())
			if len(r.Failed) > 0 {
				t.Fatalf("fetch %d failed: %+v", i, r.Failed[0])
			}
			done = len(r.Completed) > 0
			if !done {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				pool.Wait(ctx)
				cancel()
			}
		}
		for j := range blocks {
			benchFill(want, i, j)
			if string(region.Block(j)) != string(want) {
				t.Fatalf("item %d block %d: bytes differ", i, j)
			}
		}
	}
	if s := cdata.Stats(); s.BoardCopies != n-1 {
		t.Fatalf("stats %+v: want all but the first of %d copied unasked", s, n)
	}
	deadline := time.Now().Add(5 * time.Second)
	for prod.Grants() > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d grants still held: notifications lost", prod.Grants())
		}
		time.Sleep(time.Millisecond)
	}
	if st := prod.Stats(); st.Completions != n || st.Expired != 0 {
		t.Fatalf("producer %+v", st)
	}
}
