package connector_test

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/ecxfer/ecxfer/cache"
	"github.com/ecxfer/ecxfer/internal/faultproxy"
	"github.com/ecxfer/ecxfer/session/connector"
	"github.com/ecxfer/ecxfer/transport"
)

// Faults on real sockets: a producer (Producer, the real control plane and
// the TCP data plane) and a consumer (Pool) talk through a fault proxy on
// the control connection and another on the data connection. Each case
// starts a round of fetches, injects its fault while they run, lifts it,
// and checks:
//   - every fetch ended exactly once;
//   - every completed fetch holds the producer's bytes (by content);
//   - no block handed back (failed and not held, or Released) is written
//     after: each gets canary bytes when handed back, checked after Close;
//   - a second round, fault lifted, completes in full;
//   - after the pin lease the producer holds no pins.
//
// goleak (TestMain) checks the goroutines at the end.

const (
	faultItems  = 48
	faultBlocks = 4
	faultBS     = 4096
	faultLease  = time.Second
)

type faultWorld struct {
	t                  *testing.T
	ctl, data          *faultproxy.Proxy
	srv                *transport.Server
	pdata, cdata       *transport.TCPData
	prod               *connector.Producer
	cregion            *cache.Region
	cli                *transport.Client
	pool               *connector.Pool
	endpoint           string
	next               int // next free consumer block (never reused)
	stopServe          func()
	canaries           []int // blocks handed back
	completed, failed  int
	completedThisRound int
	why                []string // reasons of the failures
}

func freeAddr(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

func newFaultWorld(t *testing.T) *faultWorld {
	w := &faultWorld{t: t}
	pregion := must(cache.NewRegion(cache.RegionConfig{Blocks: faultItems * faultBlocks, BlockSize: faultBS, NoLock: true}))
	t.Cleanup(func() { pregion.Close() })
	entries := cache.NewEmbeddingCache(pregion.Blocks())
	for i := range faultItems {
		e := must(entries.Alloc(benchHash(i), faultBlocks))
		for j, b := range e.Blocks {
			benchFill(pregion.Block(b), i, j)
		}
		entries.MarkReady(benchHash(i))
	}
	dataAddr := freeAddr(t)
	var err error
	if w.data, err = faultproxy.New(dataAddr); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.data.Close() })
	w.pdata = must(transport.NewTCPData(transport.TCPConfig{Listen: dataAddr, Advertise: w.data.Addr(),
		IOTimeout: 500 * time.Millisecond, Logger: benchQuiet}, pregion))
	t.Cleanup(func() { w.pdata.Close() })
	w.srv = must(transport.Listen("tcp://127.0.0.1:0", transport.ServerConfig{Logger: benchQuiet,
		PingInterval: 100 * time.Millisecond, PeerTimeout: 500 * time.Millisecond}))
	t.Cleanup(func() { w.srv.Close() })
	if w.ctl, err = faultproxy.New(w.srv.Addr().String()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.ctl.Close() })
	w.endpoint = "tcp://" + w.ctl.Addr()
	w.prod = must(connector.NewProducer(connector.ProducerConfig{CompatHash: "bench", PinLease: faultLease,
		MaxPinnedShare: 1, Logger: benchQuiet}, w.srv, w.pdata, entries))
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan struct{})
	go func() { w.prod.Serve(ctx, nil); close(served) }()
	w.stopServe = func() { cancel(); <-served; w.prod.Close() }
	t.Cleanup(func() { w.stopServe() })

	w.cregion = must(cache.NewRegion(cache.RegionConfig{Blocks: 8 * faultItems * faultBlocks, BlockSize: faultBS, NoLock: true}))
	t.Cleanup(func() { w.cregion.Close() })
	w.cdata = must(transport.NewTCPData(transport.TCPConfig{IOTimeout: 500 * time.Millisecond, DialTimeout: time.Second,
		Logger: benchQuiet}, w.cregion))
	w.cli = transport.NewClient(transport.ClientConfig{Logger: benchQuiet, PingInterval: 100 * time.Millisecond,
		PeerTimeout: 500 * time.Millisecond, ConnectTimeout: time.Second, HandshakeTimeout: time.Second})
	w.pool = must(connector.NewPool(connector.PoolConfig{CompatHash: "bench", BlockSize: faultBS, Logger: benchQuiet,
		AckTimeout: 500 * time.Millisecond}, w.cli, w.cdata))
	return w
}

// round fetches every item once; fault runs when the first third has
// completed (or at once if after is 0). It returns once every fetch ended.
func (w *faultWorld) round(after int, fault func()) {
	t := w.t
	t.Helper()
	item := map[string]int{}
	blocks := map[string][]int{}
	now := time.Now()
	for i := range faultItems {
		ids := make([]int, faultBlocks)
		for j := range ids {
			ids[j] = w.next
			w.next++
		}
		h := benchHash(i)
		if _, err := w.pool.Fetch(w.endpoint, h, ids, now.Add(20*time.Second), now); err != nil {
			t.Fatal(err)
		}
		item[h], blocks[h] = i, ids
	}
	ended := map[string]bool{}
	w.completedThisRound, w.why = 0, nil
	injected := fault == nil
	if !injected && after == 0 {
		fault()
		injected = true
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	want := make([]byte, faultBS)
	for len(ended) < faultItems || w.pool.InFlight() > 0 {
		if !w.pool.Wait(ctx) {
			t.Fatalf("fetches still running after 60 s: %d of %d ended", len(ended), faultItems)
		}
		r := w.pool.Step(time.Now())
		for _, d := range r.Completed {
			if ended[d.MMHash] {
				t.Fatalf("%s ended twice", d.MMHash)
			}
			ended[d.MMHash] = true
			w.completed++
			w.completedThisRound++
			for j, b := range d.Blocks {
				benchFill(want, item[d.MMHash], j)
				if string(w.cregion.Block(b)) != string(want) {
					t.Fatalf("%s block %d: bytes differ", d.MMHash, j)
				}
			}
		}
		for _, f := range r.Failed {
			if ended[f.MMHash] {
				t.Fatalf("%s ended twice", f.MMHash)
			}
			ended[f.MMHash] = true
			w.failed++
			w.why = append(w.why, f.Reason.String())
			if !f.BlocksHeld {
				w.canary(f.Blocks)
			}
		}
		for _, rel := range r.Released {
			w.canary(rel.Blocks)
		}
		if !injected && w.completedThisRound >= after {
			fault()
			injected = true
		}
	}
}

func (w *faultWorld) canary(blocks []int) {
	for _, b := range blocks {
		blk := w.cregion.Block(b)
		for i := range blk {
			blk[i] = 0xa5
		}
		w.canaries = append(w.canaries, b)
	}
}

// finish closes the consumer and checks the canaries, then waits out the
// pin lease and checks the producer holds no pins.
func (w *faultWorld) finish() {
	t := w.t
	t.Helper()
	w.pool.Close()
	w.cdata.Close() // every READ has ended: nothing writes after this
	w.cli.Close()
	for _, b := range w.canaries {
		for _, v := range w.cregion.Block(b) {
			if v != 0xa5 {
				t.Fatalf("block %d was written after it was handed back", b)
			}
		}
	}
	end := time.Now().Add(faultLease + 3*time.Second)
	for w.prod.Grants() > 0 {
		if time.Now().After(end) {
			t.Fatalf("%d grants still pinned %v after the consumer left", w.prod.Grants(), faultLease+3*time.Second)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestFaultsOnRealSockets(t *testing.T) {
	if testing.Short() {
		t.Skip("seconds of real-socket faults")
	}
	// Each fault returns what lifts it; the black holes and the refusal
	// lift themselves while the round runs, and lift waits for that.
	after := func(d time.Duration, f func()) func() {
		done := make(chan struct{})
		time.AfterFunc(d, func() { f(); close(done) })
		return func() { <-done }
	}
	cases := []struct {
		name  string
		after int // completions before the fault
		fault func(w *faultWorld) (lift func())
	}{
		{"latency", 0, func(w *faultWorld) func() {
			w.ctl.SetDelay(2 * time.Millisecond)
			w.data.SetDelay(2 * time.Millisecond)
			return func() { w.ctl.SetDelay(0); w.data.SetDelay(0) }
		}},
		{"bandwidth", 0, func(w *faultWorld) func() {
			w.data.SetRate(4 << 20)
			return func() { w.data.SetRate(0) }
		}},
		{"reset-control", faultItems / 3, func(w *faultWorld) func() { w.ctl.Reset(); return func() {} }},
		{"reset-data", faultItems / 3, func(w *faultWorld) func() { w.data.Reset(); return func() {} }},
		{"blackhole-control", faultItems / 3, func(w *faultWorld) func() {
			w.ctl.Blackhole(true)
			return after(time.Second, func() { w.ctl.Blackhole(false) })
		}},
		{"blackhole-data", faultItems / 3, func(w *faultWorld) func() {
			w.data.Blackhole(true)
			return after(time.Second, func() { w.data.Blackhole(false) })
		}},
		{"refused-then-back", 0, func(w *faultWorld) func() {
			w.ctl.Refuse(true)
			w.ctl.Reset()
			return after(300*time.Millisecond, func() { w.ctl.Refuse(false) })
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			w := newFaultWorld(t)
			var lift func()
			w.round(c.after, func() { lift = c.fault(w) })
			lift()
			faulted := w.completedThisRound
			// Lifted: a new round completes in full, on new connections
			// if the old ones died.
			w.round(0, nil)
			if w.completedThisRound != faultItems {
				t.Fatalf("after the fault, %d of %d fetches completed; failed: %v", w.completedThisRound, faultItems, w.why)
			}
			t.Logf("%s: during the fault %d of %d completed; %d failed in all", c.name, faulted, faultItems, w.failed)
			w.finish()
		})
	}
}
