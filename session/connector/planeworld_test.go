package connector_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/ecxfer/ecxfer/cache"
	"github.com/ecxfer/ecxfer/internal/faultproxy"
	"github.com/ecxfer/ecxfer/session/connector"
	"github.com/ecxfer/ecxfer/transport"
)

// planeWorld is a Go producer (Producer over the real control plane and the
// TCP data plane, its region Shared or not) behind a fault proxy on each
// connection, and a consumer Pool: the world of the deadline and
// unread-grant tests.
type planeWorld struct {
	*consumer
	ctl, data *faultproxy.Proxy
	prod      *connector.Producer
	kill      func() // closes the producer and its planes, once
}

type worldConfig struct {
	shared bool          // the producer's region is Shared: same-host copies
	lease  time.Duration // the producer's pin lease
	pool   connector.PoolConfig
	tcpCtl bool // the consumer's control plane stays on TCP, through the proxy (ClientConfig.NoSameHost)
}

func newPlaneWorld(t *testing.T, cfg worldConfig) *planeWorld {
	w := &planeWorld{}
	pregion := must(cache.NewRegion(cache.RegionConfig{Blocks: faultItems * faultBlocks, BlockSize: faultBS, NoLock: true,
		Shared: cfg.shared}))
	t.Cleanup(func() { pregion.Close() })
	entries := cache.NewEmbeddingCache(pregion.Blocks())
	for i := range faultItems {
		e := must(entries.Alloc(benchHash(i), faultBlocks))
		for j, b := range e.Blocks {
			benchFill(pregion.Block(b), i, j)
		}
		entries.MarkReady(benchHash(i))
	}
	var pdata *transport.TCPData
	w.data, pdata = behindProxy(t, func(listen, advertise string) (*transport.TCPData, error) {
		return transport.NewTCPData(transport.TCPConfig{Listen: listen, Advertise: advertise, IOTimeout: 5 * time.Second,
			NoSharedMemory: !cfg.shared, Logger: benchQuiet}, pregion)
	})
	srv := must(transport.Listen("tcp://127.0.0.1:0", transport.ServerConfig{Logger: benchQuiet,
		PingInterval: 100 * time.Millisecond, PeerTimeout: 500 * time.Millisecond}))
	var err error
	if w.ctl, err = faultproxy.New(srv.Addr().String()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.ctl.Close() })
	w.prod = must(connector.NewProducer(connector.ProducerConfig{CompatHash: "bench", PinLease: cfg.lease,
		MaxPinnedShare: 1, Logger: benchQuiet}, srv, pdata, entries))
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan struct{})
	go func() { w.prod.Serve(ctx); close(served) }()
	w.kill = sync.OnceFunc(func() {
		cancel()
		<-served
		w.prod.Close()
		srv.Close()
		pdata.Close()
	})
	t.Cleanup(w.kill)

	c := &consumer{t: t, endpoint: "tcp://" + w.ctl.Addr()}
	c.cregion = must(cache.NewRegion(cache.RegionConfig{Blocks: 8 * faultItems * faultBlocks, BlockSize: faultBS, NoLock: true}))
	t.Cleanup(func() { c.cregion.Close() })
	// The data plane's own timeout is long, so that only the deadline (or
	// the control plane's peer timeout) ends a stalled READ.
	c.cdata = must(transport.NewTCPData(transport.TCPConfig{IOTimeout: 5 * time.Second, DialTimeout: time.Second,
		Logger: benchQuiet}, c.cregion))
	c.cli = transport.NewClient(transport.ClientConfig{Logger: benchQuiet, PingInterval: 100 * time.Millisecond,
		PeerTimeout: 500 * time.Millisecond, ConnectTimeout: time.Second, HandshakeTimeout: time.Second, NoSameHost: cfg.tcpCtl})
	pc := cfg.pool
	pc.CompatHash, pc.BlockSize, pc.Logger = "bench", faultBS, benchQuiet
	if pc.AckTimeout == 0 {
		pc.AckTimeout = 500 * time.Millisecond
	}
	if pc.Retry.MaxAttempts == 0 {
		// Retries never run out first: the deadline is what ends a fetch.
		pc.Retry.MaxAttempts, pc.Retry.MaxElapsed = 1000, time.Minute
	}
	c.pool = must(connector.NewPool(pc, c.cli, c.cdata))
	t.Cleanup(func() { c.pool.Close(); c.cdata.Close(); c.cli.Close() })
	w.consumer = c
	return w
}

// blocks returns n consumer blocks never used before.
func (w *consumer) blocks(n int) []int {
	ids := make([]int, n)
	for j := range ids {
		ids[j] = w.next
		w.next++
	}
	return ids
}

// outcome is how one fetch ended, and the clock of the Step that said so.
type outcome struct {
	done *connector.Done
	fail *connector.Failure
	at   time.Time
}

// await steps the pool on the real clock until the fetch of item ends.
// each, if not nil, runs before every wait. A completion must hold the
// producer's bytes; every block handed back (failed and not held, or
// released) gets canaries.
func (w *planeWorld) await(item int, each func()) outcome {
	t := w.t
	t.Helper()
	h := benchHash(item)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	want := make([]byte, faultBS)
	for {
		if each != nil {
			each()
		}
		if !w.pool.Wait(ctx) {
			t.Fatalf("the fetch of %s still runs after 30 s", h)
		}
		now := time.Now()
		r := w.pool.Step(now)
		var out outcome
		for _, d := range r.Completed {
			for j, b := range d.Blocks {
				benchFill(want, item, j)
				if d.MMHash == h && string(w.cregion.Block(b)) != string(want) {
					t.Fatalf("%s block %d: bytes differ", h, j)
				}
			}
			if d.MMHash == h {
				out.done = &d
			}
		}
		for _, f := range r.Failed {
			if !f.BlocksHeld {
				w.canary(f.Blocks)
			}
			if f.MMHash == h {
				out.fail = &f
			}
		}
		for _, rel := range r.Released {
			w.canary(rel.Blocks)
		}
		if out.done != nil || out.fail != nil {
			out.at = now
			return out
		}
	}
}

// fetchOK fetches item and fails the test unless it completes.
func (w *planeWorld) fetchOK(item int) {
	w.t.Helper()
	now := time.Now()
	if _, err := w.pool.Fetch(w.endpoint, benchHash(item), w.blocks(faultBlocks), now.Add(10*time.Second), now); err != nil {
		w.t.Fatal(err)
	}
	if o := w.await(item, nil); o.fail != nil {
		w.t.Fatalf("fetch of %s failed: %v", benchHash(item), o.fail.Err)
	}
}
