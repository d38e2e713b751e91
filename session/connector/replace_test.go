package connector_test

import (
	"context"
	"testing"
	"time"

	"github.com/ecxfer/ecxfer/cache"
	"github.com/ecxfer/ecxfer/session/connector"
	"github.com/ecxfer/ecxfer/transport"
)

// A producer closed and replaced on the same data plane, again and again
// (an engine restarting its serving loop), serves its own grants, and only
// them: the replacement's fetches complete with its entries' bytes, its
// grants end through their notifications, and a closed producer's Serve,
// returning, takes nothing of the one that replaced it. Over a Shared
// region, the consumer copies under the board of whichever producer is
// attached.
func TestProducerReplacedOnTheSameDataPlane(t *testing.T) {
	for _, shm := range []bool{false, true} {
		t.Run(map[bool]string{false: "tcp", true: "shm"}[shm], func(t *testing.T) { replaced(t, shm) })
	}
}

func replaced(t *testing.T, shm bool) {
	const bs, items = 4096, 4
	region := must(cache.NewRegion(cache.RegionConfig{Blocks: 2 * items, BlockSize: bs, NoLock: true, Shared: shm}))
	defer region.Close()
	entries := cache.NewEmbeddingCache(region.Blocks())
	pdata := must(transport.NewTCPData(transport.TCPConfig{Listen: "127.0.0.1:0", Logger: benchQuiet, NoSharedMemory: !shm}, region))
	defer pdata.Close()
	srv := must(transport.Listen("tcp://127.0.0.1:0", transport.ServerConfig{Logger: benchQuiet}))
	defer srv.Close()

	cregion := must(cache.NewRegion(cache.RegionConfig{Blocks: 2, BlockSize: bs, NoLock: true}))
	defer cregion.Close()
	cdata := must(transport.NewTCPData(transport.TCPConfig{Logger: benchQuiet}, cregion))
	defer cdata.Close()
	cli := transport.NewClient(transport.ClientConfig{Logger: benchQuiet})
	defer cli.Close()
	pool := must(connector.NewPool(connector.PoolConfig{CompatHash: "bench", BlockSize: bs, Logger: benchQuiet}, cli, cdata))
	defer pool.Close()

	var prev *connector.Producer
	var prevServe chan error
	for gen := range 4 {
		// This generation's entries, in blocks the last one's used.
		for i := range items {
			h := benchHash(100*gen + i)
			e, err := entries.Alloc(h, 2)
			if err != nil {
				t.Fatal(err)
			}
			for j, b := range e.Blocks {
				benchFill(region.Block(b), 100*gen+i, j)
			}
			entries.MarkReady(h)
		}
		prod := must(connector.NewProducer(connector.ProducerConfig{CompatHash: "bench", Logger: benchQuiet}, srv, pdata, entries))
		ctx, cancel := context.WithCancel(context.Background())
		serve := make(chan error, 1)
		go func() { serve <- prod.Serve(ctx) }()
		if prev != nil {
			// The last one closes while this one serves.
			prev.Close()
			if err := <-prevServe; err == nil {
				t.Fatal("a closed producer's Serve returned nil")
			}
		}
		for i := range items {
			fetchInto(t, pool, srv.Endpoint(), benchHash(100*gen+i), 100*gen+i, cregion)
		}
		until(t, "this producer's grants end through their notifications", func() bool { return prod.Grants() == 0 })
		// Every grant ended through its notification. (A fetch may take
		// two grants: under the race detector a pushed READ now and then
		// fails and is asked for anew, its first grant completed too.)
		if st := prod.Stats(); st.Completions < items || st.Completions != st.Grants || st.Expired != 0 {
			t.Fatalf("generation %d: %+v\npool: %+v", gen, st, pool.Stats())
		}
		prev, prevServe = prod, serve
		defer cancel()
	}
	prev.Close()
	<-prevServe
}

// fetchInto fetches h into the consumer's two blocks and checks them.
func fetchInto(t *testing.T, pool *connector.Pool, ep, h string, item int, region *cache.Region) {
	t.Helper()
	now := time.Now()
	if _, err := pool.Fetch(ep, h, []int{0, 1}, now.Add(10*time.Second), now); err != nil {
		t.Fatal(err)
	}
	for {
		r := pool.Step(time.Now())
		if len(r.Failed) > 0 {
			t.Fatalf("%s: %+v", h, r.Failed[0])
		}
		if len(r.Completed) > 0 {
			break
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		pool.Wait(ctx)
		cancel()
	}
	want := make([]byte, region.BlockSize())
	for j := range 2 {
		benchFill(want, item, j)
		if string(region.Block(j)) != string(want) {
			t.Fatalf("%s block %d: another entry's bytes", h, j)
		}
	}
}

func until(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(10 * time.Second); !cond(); time.Sleep(100 * time.Microsecond) {
		if time.Now().After(end) {
			t.Fatalf("timed out waiting until %s", what)
		}
	}
}
