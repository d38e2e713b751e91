package connector_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ecxfer/ecxfer/cache"
	"github.com/ecxfer/ecxfer/session/connector"
	"github.com/ecxfer/ecxfer/transport"
)

// A producer shutting down keeps what its READs bring after another
// producer attached to the same data plane: a READ of its grant served
// before the successor attached, its done held back until the successor
// granted and its fetch completed, ends that grant through its
// notification (not at the lease, a minute away), and the successor's
// grant ends through its own.
func TestDrainingProducerKeepsItsNotifications(t *testing.T) {
	const bs = 4096
	region := must(cache.NewRegion(cache.RegionConfig{Blocks: 4, BlockSize: bs, NoLock: true}))
	defer region.Close()
	entries := cache.NewEmbeddingCache(region.Blocks())
	for i := range 2 {
		h := benchHash(i)
		e := must(entries.Alloc(h, 2))
		for j, b := range e.Blocks {
			benchFill(region.Block(b), i, j)
		}
		entries.MarkReady(h)
	}
	// The data plane's own gate holds the first READ of blocks: its hold
	// ends (after the answer is written) only once the test says so, and
	// its connection reads nothing meanwhile, the consumer's done included.
	held, resume := make(chan struct{}), make(chan struct{})
	var first atomic.Bool
	pdata := must(transport.NewTCPData(transport.TCPConfig{Listen: "127.0.0.1:0", Logger: benchQuiet,
		Authorize: func(_ string, _ []byte, blocks []int) (func(), bool) {
			if len(blocks) == 0 || !first.CompareAndSwap(false, true) {
				return nil, true
			}
			return func() { close(held); <-resume }, true
		}}, region))
	defer pdata.Close()
	defer func() {
		select {
		case <-resume:
		default:
			close(resume)
		}
	}()

	serve := func(srv *transport.Server) (*connector.Producer, context.CancelFunc) {
		p := must(connector.NewProducer(connector.ProducerConfig{CompatHash: "bench", Logger: benchQuiet, PinLease: time.Minute},
			srv, pdata, entries))
		ctx, cancel := context.WithCancel(context.Background())
		go p.Serve(ctx)
		return p, cancel
	}
	consumer := func() (*connector.Pool, *cache.Region) {
		cregion := must(cache.NewRegion(cache.RegionConfig{Blocks: 2, BlockSize: bs, NoLock: true}))
		t.Cleanup(func() { cregion.Close() })
		// No pushes: the held READ is answered with its bytes.
		cdata := must(transport.NewTCPData(transport.TCPConfig{Logger: benchQuiet, PushBuffer: -1}, cregion))
		t.Cleanup(func() { cdata.Close() })
		cli := transport.NewClient(transport.ClientConfig{Logger: benchQuiet})
		t.Cleanup(func() { cli.Close() })
		pool := must(connector.NewPool(connector.PoolConfig{CompatHash: "bench", BlockSize: bs, Logger: benchQuiet}, cli, cdata))
		t.Cleanup(func() { pool.Close() })
		return pool, cregion
	}

	srvA := must(transport.Listen("tcp://127.0.0.1:0", transport.ServerConfig{Logger: benchQuiet}))
	defer srvA.Close()
	a, cancelA := serve(srvA)
	defer cancelA()
	defer a.Close()
	poolA, regionA := consumer()
	fetchInto(t, poolA, srvA.Endpoint(), benchHash(0), 0, regionA)
	<-held
	shut := make(chan error, 1)
	go func() { shut <- a.Shutdown(context.Background()) }()

	srvB := must(transport.Listen("tcp://127.0.0.1:0", transport.ServerConfig{Logger: benchQuiet}))
	defer srvB.Close()
	b, cancelB := serve(srvB)
	defer cancelB()
	defer b.Close()
	poolB, regionB := consumer()
	fetchInto(t, poolB, srvB.Endpoint(), benchHash(1), 1, regionB)
	until(t, "the successor's grant ends through its notification", func() bool { return b.Grants() == 0 })
	if a.Grants() != 1 {
		t.Fatalf("the draining producer holds %d grants, want its READ's", a.Grants())
	}

	close(resume)
	until(t, "the draining producer's grant ends through its notification", func() bool { return a.Grants() == 0 })
	select {
	case err := <-shut:
		if err != nil {
			t.Fatalf("Shutdown: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Shutdown did not return with its grants ended")
	}
	for name, p := range map[string]*connector.Producer{"draining": a, "successor": b} {
		if st := p.Stats(); st.Completions != 1 || st.Expired != 0 || st.UnknownNotifs != 0 {
			t.Fatalf("%s producer: %+v", name, st)
		}
	}
}
