package connector_test

import (
	"context"
	"testing"
	"time"

	"github.com/ecxfer/ecxfer/cache"
	"github.com/ecxfer/ecxfer/session/connector"
	"github.com/ecxfer/ecxfer/transport"
)

// tierNode is a process that fetches entries into its own cache
// (FetchEntry) and, if it serves, runs a Producer over the same cache and
// data plane: what it fetched, it serves.
type tierNode struct {
	region *cache.Region
	cache  *cache.EmbeddingCache
	data   *transport.TCPData
	pool   *connector.Pool
	prod   *connector.Producer
	ep     string // its control endpoint, if it serves
}

func newTierNode(t *testing.T, blocks int, plane string, serve bool) *tierNode {
	t.Helper()
	n := newNode(t, blocks, plane, transport.TCPConfig{})
	if serve {
		n.producer(t)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { n.prod.Serve(ctx); close(done) }()
		t.Cleanup(func() { cancel(); <-done })
	}
	return n
}

// newNode is a tierNode with a Pool alone, its data plane configured as
// cfg (its listener, logger and same-host setting are the node's).
func newNode(t *testing.T, blocks int, plane string, cfg transport.TCPConfig) *tierNode {
	t.Helper()
	n := &tierNode{}
	n.region = must(cache.NewRegion(cache.RegionConfig{Blocks: blocks, BlockSize: 4096, NoLock: true, Shared: plane == "shm"}))
	t.Cleanup(func() { n.region.Close() })
	n.cache = cache.NewEmbeddingCache(blocks)
	cfg.Listen, cfg.Logger, cfg.NoSharedMemory = "127.0.0.1:0", benchQuiet, plane != "shm"
	n.data = must(transport.NewTCPData(cfg, n.region))
	t.Cleanup(func() { n.data.Close() })
	cli := transport.NewClient(transport.ClientConfig{Logger: benchQuiet})
	n.pool = must(connector.NewPool(connector.PoolConfig{CompatHash: "bench", BlockSize: 4096, Logger: benchQuiet, Cache: n.cache}, cli, n.data))
	t.Cleanup(func() { n.pool.Close(); cli.Close() })
	return n
}

// producer gives the node a Producer over its cache and data plane, which
// the caller steps or serves.
func (n *tierNode) producer(t *testing.T) {
	srv := must(transport.Listen("tcp://127.0.0.1:0", transport.ServerConfig{Logger: benchQuiet}))
	n.ep = srv.Endpoint()
	n.prod = must(connector.NewProducer(connector.ProducerConfig{CompatHash: "bench", Logger: benchQuiet}, srv, n.data, n.cache))
	t.Cleanup(func() { n.prod.Close(); srv.Close() })
}

// fetch fetches item i (4 blocks) from ep into the node's cache, checks
// its bytes, and returns the entry's blocks, held.
func (n *tierNode) fetch(t *testing.T, ep string, i int) []int {
	t.Helper()
	now := time.Now()
	if _, err := n.pool.FetchEntry(ep, benchHash(i), 4*4096, now.Add(10*time.Second), now); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for {
		r := n.pool.Step(time.Now())
		for _, f := range r.Failed {
			t.Fatalf("fetch of %s: %v", f.MMHash, f.Err)
		}
		for _, d := range r.Completed {
			if !d.Held {
				t.Fatalf("%+v not held", d)
			}
			want := make([]byte, 4096)
			for j, b := range d.Blocks {
				benchFill(want, i, j)
				if string(n.region.Block(b)) != string(want) {
					t.Fatalf("%s block %d: bytes differ", d.MMHash, j)
				}
			}
			return d.Blocks
		}
		if !n.pool.Wait(ctx) {
			t.Fatal("no outcome in 10 s")
		}
	}
}

// A produces; B fetches from A into its cache and serves what it fetched;
// C fetches the same entries from B. The bytes are checked at every hop,
// and the entry B holds is never evicted while B's other fetches fill its
// cache and C reads it, over and over.
func TestFetchedEntriesAreServed(t *testing.T) {
	for _, plane := range []string{"tcp", "shm"} {
		t.Run(plane, func(t *testing.T) {
			epA, _, stopA, err := startBenchProducer(4, 4096, plane, "", "")
			if err != nil {
				t.Fatal(err)
			}
			defer stopA()
			b := newTierNode(t, 16, plane, true) // room for 4 entries
			c := newTierNode(t, 8, plane, false)
			kept := b.fetch(t, epA, 0) // B holds entry 0 throughout
			for i := 1; i <= 12; i++ {
				b.fetch(t, epA, i) // fills B's cache: evicts its older entries
				b.cache.Unpin(benchHash(i))
				c.fetch(t, b.ep, 0) // C reads B's held entry
				c.cache.Unpin(benchHash(0))
				if err := c.cache.Remove(benchHash(0)); err != nil { // asked for anew next time
					t.Fatal(err)
				}
				e, ok := b.cache.Get(benchHash(0))
				if !ok || !e.Ready || e.Pins < 1 || len(e.Blocks) != 4 || e.Blocks[0] != kept[0] {
					t.Fatalf("B's held entry moved or went: %+v", e)
				}
			}
			// C also reads an entry B fetched and let go, while B still has it.
			c.fetch(t, b.ep, 12)
			if st := b.cache.Stats(); st.Evictions == 0 {
				t.Fatalf("B's cache never evicted: the test did not fill it (%+v)", st)
			}
			if ps := b.prod.Stats(); ps.Grants < 13 {
				t.Fatalf("B served %d grants, want 13", ps.Grants)
			}
		})
	}
}
