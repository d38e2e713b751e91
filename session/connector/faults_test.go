package connector_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync/atomic"
	"syscall"
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

// consumer is the consumer side of a fault test: a Pool on the real
// control and data planes, and the checks of its rounds.
type consumer struct {
	t                  *testing.T
	cdata              *transport.TCPData
	cregion            *cache.Region
	cli                *transport.Client
	pool               *connector.Pool
	endpoint           string
	next               int   // next free consumer block (never reused)
	canaries           []int // blocks handed back
	completed, failed  int
	completedThisRound int
	why                []string // reasons of the failures
	// Of the last round with a fault: how long after it the consumer
	// first reacted (a retry, an ack timeout, a quarantine, a producer
	// declared dead, or a failure; zero: never), and the retries.
	detect  time.Duration
	noticed bool
	retried uint64
}

// reactions counts what a consumer does about a fault.
func reactions(s connector.PoolStats) uint64 {
	return s.Retries + s.AckTimeouts + s.Quarantines + s.PeerDeaths + s.Failed
}

func newConsumer(t *testing.T, endpoint string) *consumer {
	c := &consumer{t: t, endpoint: endpoint}
	c.cregion = must(cache.NewRegion(cache.RegionConfig{Blocks: 8 * faultItems * faultBlocks, BlockSize: faultBS, NoLock: true}))
	t.Cleanup(func() { c.cregion.Close() })
	c.cdata = must(transport.NewTCPData(transport.TCPConfig{IOTimeout: 500 * time.Millisecond, DialTimeout: time.Second,
		Logger: benchQuiet}, c.cregion))
	c.cli = transport.NewClient(transport.ClientConfig{Logger: benchQuiet, PingInterval: 100 * time.Millisecond,
		PeerTimeout: 500 * time.Millisecond, ConnectTimeout: time.Second, HandshakeTimeout: time.Second})
	c.pool = must(connector.NewPool(connector.PoolConfig{CompatHash: "bench", BlockSize: faultBS, Logger: benchQuiet,
		AckTimeout: 500 * time.Millisecond}, c.cli, c.cdata))
	t.Cleanup(func() { c.pool.Close(); c.cdata.Close(); c.cli.Close() })
	return c
}

type faultWorld struct {
	*consumer
	ctl, data *faultproxy.Proxy
	srv       *transport.Server
	pdata     *transport.TCPData
	prod      *connector.Producer
	stopServe func()
}

func freeAddr(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// behindProxy makes a producer's data plane listening on an address a
// fault proxy forwards to, the plane advertising the proxy. The address is
// picked free and then bound, so another listener (the proxy's own, one
// of another test) may take it between the two: then it tries another.
func behindProxy(t *testing.T, mk func(listen, advertise string) (*transport.TCPData, error)) (*faultproxy.Proxy, *transport.TCPData) {
	t.Helper()
	for range 20 {
		addr := freeAddr(t)
		proxy, err := faultproxy.New(addr)
		if err != nil {
			t.Fatal(err)
		}
		d, err := mk(addr, proxy.Addr())
		if err == nil {
			t.Cleanup(func() { proxy.Close() })
			return proxy, d
		}
		proxy.Close()
		if !errors.Is(err, syscall.EADDRINUSE) {
			t.Fatal(err)
		}
	}
	t.Fatal("no free address for the data plane")
	return nil, nil
}

func newFaultWorld(t *testing.T) *faultWorld {
	w := &faultWorld{}
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
	var err error
	w.data, w.pdata = behindProxy(t, func(listen, advertise string) (*transport.TCPData, error) {
		return transport.NewTCPData(transport.TCPConfig{Listen: listen, Advertise: advertise,
			IOTimeout: 500 * time.Millisecond, Logger: benchQuiet}, pregion)
	})
	t.Cleanup(func() { w.pdata.Close() })
	w.srv = must(transport.Listen("tcp://127.0.0.1:0", transport.ServerConfig{Logger: benchQuiet,
		PingInterval: 100 * time.Millisecond, PeerTimeout: 500 * time.Millisecond}))
	t.Cleanup(func() { w.srv.Close() })
	if w.ctl, err = faultproxy.New(w.srv.Addr().String()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.ctl.Close() })
	endpoint := "tcp://" + w.ctl.Addr()
	w.prod = must(connector.NewProducer(connector.ProducerConfig{CompatHash: "bench", PinLease: faultLease,
		MaxPinnedShare: 1, Logger: benchQuiet}, w.srv, w.pdata, entries))
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan struct{})
	go func() { w.prod.Serve(ctx); close(served) }()
	w.stopServe = func() { cancel(); <-served; w.prod.Close() }
	t.Cleanup(func() { w.stopServe() })

	w.consumer = newConsumer(t, endpoint)
	return w
}

// round fetches every item once; fault runs when the first third has
// completed (or at once if after is 0). It returns once every fetch ended.
func (w *consumer) round(after int, fault func()) { w.roundOf(faultItems, after, fault) }

// roundOf is round with at most window fetches in flight: with one or two,
// the producer pushes each entry with its ack.
func (w *consumer) roundOf(window, after int, fault func()) {
	t := w.t
	t.Helper()
	item := map[string]int{}
	started := 0
	start := func() {
		now := time.Now()
		for ; started < faultItems && w.pool.InFlight() < window; started++ {
			ids := make([]int, faultBlocks)
			for j := range ids {
				ids[j] = w.next
				w.next++
			}
			h := benchHash(started)
			if _, err := w.pool.Fetch(w.endpoint, h, ids, now.Add(20*time.Second), now); err != nil {
				t.Fatal(err)
			}
			item[h] = started
		}
	}
	start()
	ended := map[string]bool{}
	w.completedThisRound, w.why = 0, nil
	injected := fault == nil
	var injectedAt time.Time
	var before connector.PoolStats
	inject := func() {
		before, injectedAt = w.pool.Stats(), time.Now()
		w.detect, w.noticed = 0, false
		fault()
		injected = true
	}
	if !injected && after == 0 {
		inject()
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
		if !injectedAt.IsZero() && !w.noticed && reactions(w.pool.Stats()) > reactions(before) {
			w.detect, w.noticed = time.Since(injectedAt), true
		}
		if !injected && w.completedThisRound >= after {
			inject()
		}
		start()
	}
	if !injectedAt.IsZero() {
		w.retried = w.pool.Stats().Retries - before.Retries
	}
}

// costs says what the last fault cost: when the consumer noticed it and
// the fetches retried.
func (w *consumer) costs() string {
	d := "not noticed"
	if w.noticed {
		d = "noticed after " + w.detect.Round(10*time.Microsecond).String()
	}
	return fmt.Sprintf("%s, %d retries", d, w.retried)
}

func (w *consumer) canary(blocks []int) {
	for _, b := range blocks {
		blk := w.cregion.Block(b)
		for i := range blk {
			blk[i] = 0xa5
		}
		w.canaries = append(w.canaries, b)
	}
}

// closeAndCheck closes the consumer and checks the canaries: no READ
// wrote into a block after it was handed back.
func (w *consumer) closeAndCheck() {
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
}

// finish checks the consumer, then waits out the pin lease and checks the
// producer holds no pins.
func (w *faultWorld) finish() {
	w.closeAndCheck()
	noPins(w.t, w.prod)
}

func noPins(t *testing.T, prod *connector.Producer) {
	t.Helper()
	end := time.Now().Add(faultLease + 3*time.Second)
	for prod.Grants() > 0 {
		if time.Now().After(end) {
			t.Fatalf("%d grants still pinned %v after the consumer left", prod.Grants(), faultLease+3*time.Second)
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
		after int  // completions before the fault
		seen  bool // the fault must be noticed: it holds what fetches need
		fault func(w *faultWorld) (lift func())
	}{
		{"latency", 0, false, func(w *faultWorld) func() {
			w.ctl.SetDelay(2 * time.Millisecond)
			w.data.SetDelay(2 * time.Millisecond)
			return func() { w.ctl.SetDelay(0); w.data.SetDelay(0) }
		}},
		{"bandwidth", 0, false, func(w *faultWorld) func() {
			w.data.SetRate(4 << 20)
			return func() { w.data.SetRate(0) }
		}},
		{"reset-control", faultItems / 3, false, func(w *faultWorld) func() { w.ctl.Reset(); return func() {} }},
		{"reset-data", faultItems / 3, false, func(w *faultWorld) func() { w.data.Reset(); return func() {} }},
		{"blackhole-control", faultItems / 3, true, func(w *faultWorld) func() {
			w.ctl.Blackhole(true)
			return after(time.Second, func() { w.ctl.Blackhole(false) })
		}},
		{"blackhole-data", faultItems / 3, true, func(w *faultWorld) func() {
			w.data.Blackhole(true)
			return after(time.Second, func() { w.data.Blackhole(false) })
		}},
		{"refused-then-back", 0, false, func(w *faultWorld) func() {
			w.ctl.Refuse(true)
			w.ctl.Reset()
			return after(300*time.Millisecond, func() { w.ctl.Refuse(false) })
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			w := newFaultWorld(t)
			var lift func()
			// A fault that comes mid-round keeps a window in flight, so
			// that the last third start under it.
			window := faultItems
			if c.after > 0 {
				window = faultItems / 3
			}
			w.roundOf(window, c.after, func() { lift = c.fault(w) })
			lift()
			faulted, costs, why := w.completedThisRound, w.costs(), w.why
			if c.seen && !w.noticed {
				t.Fatalf("the fault went unseen: %d of %d completed", faulted, faultItems)
			}
			// Lifted: a new round completes in full, on new connections
			// if the old ones died.
			w.round(0, nil)
			if w.completedThisRound != faultItems {
				t.Fatalf("after the fault, %d of %d fetches completed; failed: %v", w.completedThisRound, faultItems, w.why)
			}
			t.Logf("%s: during the fault %d of %d completed; %d failed in all; %s; failures %v", c.name, faulted, faultItems, w.failed, costs, why)
			w.finish()
		})
	}
}

// The data-connection faults again with one fetch at a time, so that every
// entry is pushed with its ack: a push cut by a reset, held by a black
// hole or slowed ends its fetch once, with the producer's bytes or a
// failure, and writes no block handed back.
func TestFaultsOnPushes(t *testing.T) {
	if testing.Short() {
		t.Skip("seconds of real-socket faults")
	}
	cases := []struct {
		name  string
		fault func(w *faultWorld) (lift func())
	}{
		{"latency", func(w *faultWorld) func() {
			w.data.SetDelay(2 * time.Millisecond)
			return func() { w.data.SetDelay(0) }
		}},
		{"reset-data", func(w *faultWorld) func() { w.data.Reset(); return func() {} }},
		{"blackhole-data", func(w *faultWorld) func() {
			w.data.Blackhole(true)
			done := make(chan struct{})
			time.AfterFunc(time.Second, func() { w.data.Blackhole(false); close(done) })
			return func() { <-done }
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			w := newFaultWorld(t)
			var lift func()
			w.roundOf(1, faultItems/3, func() { lift = c.fault(w) })
			lift()
			w.roundOf(1, 0, nil)
			if w.completedThisRound != faultItems {
				t.Fatalf("after the fault, %d of %d fetches completed; failed: %v", w.completedThisRound, faultItems, w.why)
			}
			if s := w.cdata.Stats(); s.Pushed == 0 {
				t.Fatalf("nothing was pushed: %+v", s)
			}
			t.Logf("%s: %d failed in all; %s; %+v", c.name, w.failed, w.costs(), w.cdata.Stats())
			w.finish()
		})
	}
}

// consumerMain is a consumer process for TestProcessFaults: it fetches
// every item from endpoint, round after round, until it is killed or its
// stdin closes; it prints "ready" once a fetch completed.
func consumerMain(endpoint string) int {
	region, err := cache.NewRegion(cache.RegionConfig{Blocks: faultItems * faultBlocks, BlockSize: faultBS, NoLock: true})
	if err != nil {
		return 2
	}
	cdata, _ := transport.NewTCPData(transport.TCPConfig{Logger: benchQuiet}, region)
	cli := transport.NewClient(transport.ClientConfig{Logger: benchQuiet})
	pool, err := connector.NewPool(connector.PoolConfig{CompatHash: "bench", BlockSize: faultBS, Logger: benchQuiet}, cli, cdata)
	if err != nil {
		return 2
	}
	ctx, cancel := context.WithCancel(context.Background())
	go func() { io.Copy(io.Discard, os.Stdin); cancel() }()
	ready := false
	for ctx.Err() == nil {
		now := time.Now()
		for i := range faultItems {
			ids := make([]int, faultBlocks)
			for j := range ids {
				ids[j] = i*faultBlocks + j
			}
			pool.Fetch(endpoint, benchHash(i), ids, now.Add(10*time.Second), now)
		}
		for pool.InFlight() > 0 && pool.Wait(ctx) {
			if r := pool.Step(time.Now()); len(r.Completed) > 0 && !ready {
				fmt.Println("ready")
				ready = true
			}
		}
	}
	pool.Close()
	cdata.Close()
	cli.Close()
	return 0
}

// Real process faults: a producer process killed (SIGKILL) or stopped
// (SIGSTOP) while fetches run, then a new one on the same addresses; and a
// consumer process killed while it fetches from a producer here. Every
// fetch ends once with the right bytes, the restarted producer serves a
// full round, and a dead consumer's pins go with the pin lease.
func TestProcessFaults(t *testing.T) {
	if testing.Short() {
		t.Skip("starts and kills processes")
	}
	for _, tc := range []struct {
		sig  syscall.Signal
		data string // the producer's: "shm" lets this consumer copy under its published grants
	}{{syscall.SIGKILL, "tcp"}, {syscall.SIGSTOP, "tcp"}, {syscall.SIGKILL, "shm"}, {syscall.SIGSTOP, "shm"}} {
		sig := tc.sig
		t.Run("producer-"+sig.String()+"-"+tc.data, func(t *testing.T) {
			ctlAddr, dataAddr := freeAddr(t), freeAddr(t)
			spec := fmt.Sprintf("ECXFER_BENCH_PRODUCER=%dx%d,%s,%s,%s", faultBlocks, faultBS, tc.data, ctlAddr, dataAddr)
			p1 := startProc(t, spec)
			c := newConsumer(t, p1.fields[0])
			// A window, so that the last third start after the signal
			// took: the fault meets fetches that need the producer.
			c.roundOf(faultItems/3, faultItems/3, func() {
				p1.cmd.Process.Signal(sig)
				waitProcState(t, p1.cmd.Process.Pid, map[syscall.Signal]byte{syscall.SIGKILL: 'Z', syscall.SIGSTOP: 'T'}[sig])
			})
			faulted, costs := c.completedThisRound, c.costs()
			if faulted == faultItems || !c.noticed {
				t.Fatalf("the fault went unseen: %d of %d completed, %s", faulted, faultItems, costs)
			}
			p1.cmd.Process.Kill() // a stopped process holds its ports
			p1.cmd.Wait()
			startProc(t, spec) // the same addresses
			c.round(0, nil)
			if c.completedThisRound != faultItems {
				t.Fatalf("after the restart, %d of %d fetches completed; failed: %v", c.completedThisRound, faultItems, c.why)
			}
			t.Logf("during the fault %d of %d completed; %d failed in all; %s", faulted, faultItems, c.failed, costs)
			c.closeAndCheck()
		})
	}
	t.Run("consumer-killed", func(t *testing.T) {
		w := newFaultWorld(t) // the producer, here; its proxies pass everything
		cp := startProc(t, "ECXFER_FAULT_CONSUMER="+w.endpoint)
		if cp.fields[0] != "ready" {
			t.Fatalf("consumer process said %q", cp.fields)
		}
		cp.cmd.Process.Kill()
		cp.cmd.Wait()
		w.closeAndCheck() // this test's own consumer did nothing
		noPins(t, w.prod)
	})
}

// waitProcState waits until process pid is in state (/proc/<pid>/stat:
// 'T' stopped, 'Z' dead and not yet reaped), where /proc tells.
func waitProcState(t *testing.T, pid int, state byte) {
	t.Helper()
	for end := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			return // no /proc here
		}
		if i := bytes.LastIndexByte(b, ')'); i >= 0 && i+2 < len(b) && b[i+2] == state {
			return
		}
		if time.Now().After(end) {
			t.Fatalf("process %d not in state %c after 5 s: %s", pid, state, b)
		}
	}
}

// A control connection reset while READs run on a healthy data
// connection: the READs run on to their end, and every one that completes
// is a completed fetch. The data connection is slowed so that most of the
// round's READs are under way when the control connection goes.
func TestControlResetLetsReadsFinish(t *testing.T) {
	if testing.Short() {
		t.Skip("a second of real-socket faults")
	}
	w := newFaultWorld(t)
	w.data.SetRate(1 << 20)
	var deathAt int
	w.round(1, func() {
		deathAt = w.completedThisRound
		w.ctl.Reset()
	})
	if w.pool.Stats().PeerDeaths == 0 {
		t.Fatal("the reset was not noticed: the test did not exercise the case")
	}
	if w.failed != 0 || w.completedThisRound != faultItems {
		t.Fatalf("%d of %d completed, %d failed (%v); %d had completed at the reset",
			w.completedThisRound, faultItems, w.failed, w.why, deathAt)
	}
	if deathAt > faultItems/2 {
		t.Fatalf("%d of %d had completed at the reset: too few READs under way", deathAt, faultItems)
	}
	t.Logf("%d completed at the reset; %s", deathAt, w.costs())
	w.data.SetRate(0)
	w.round(0, nil)
	w.finish()
}

// A data connection reset while the producer has served READs whose
// consumer has not yet confirmed them: those READs cannot complete, and
// the producer ends their grants as its data plane sees the connection
// close, not at the lease (30 s here). The consumer asks anew for what
// failed; every pin is gone within a few seconds of the round.
func TestBrokenReadsEndTheirGrants(t *testing.T) {
	if testing.Short() {
		t.Skip("real-socket faults")
	}
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
	var served atomic.Int64 // READ frames the producer took
	proxy, pdata := behindProxy(t, func(listen, advertise string) (*transport.TCPData, error) {
		return transport.NewTCPData(transport.TCPConfig{Listen: listen, Advertise: advertise, NoPush: true,
			IOTimeout: 5 * time.Second, Logger: benchQuiet,
			Authorize: func(string, []byte, []int) (func(), bool) { served.Add(1); return func() {}, true }}, pregion)
	})
	t.Cleanup(func() { pdata.Close() })
	srv := must(transport.Listen("tcp://127.0.0.1:0", transport.ServerConfig{Logger: benchQuiet}))
	t.Cleanup(func() { srv.Close() })
	prod := must(connector.NewProducer(connector.ProducerConfig{CompatHash: "bench", PinLease: 30 * time.Second,
		MaxPinnedShare: 1, Logger: benchQuiet}, srv, pdata, entries))
	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan struct{})
	go func() { prod.Serve(ctx); close(stopped) }()
	t.Cleanup(func() { cancel(); <-stopped; prod.Close() })

	c := newConsumer(t, srv.Endpoint())
	proxy.SetRate(64 << 10) // the answers crawl: READs stay unconfirmed
	reset := make(chan struct{})
	c.round(0, func() {
		go func() {
			defer close(reset)
			for served.Load() < faultItems {
				time.Sleep(time.Millisecond)
			}
			proxy.Reset()
			proxy.SetRate(0)
		}()
	})
	<-reset
	if c.completed == faultItems && c.pool.Stats().Retries == 0 {
		t.Fatal("every READ completed: the reset broke none")
	}
	if c.failed != 0 {
		t.Fatalf("%d fetches failed (%v)", c.failed, c.why)
	}
	end := time.Now().Add(5 * time.Second)
	for prod.Grants() > 0 {
		if time.Now().After(end) {
			t.Fatalf("%d grants still pinned 5 s after the round (lease 30 s); stats %+v", prod.Grants(), prod.Stats())
		}
		time.Sleep(10 * time.Millisecond)
	}
	st := prod.Stats()
	if st.BrokenReads == 0 || st.Expired != 0 || st.Grants != st.Completions+st.BrokenReads {
		t.Fatalf("stats %+v", st)
	}
	t.Logf("%d grants: %d completed, %d ended by their broken READ; %d fetches retried", st.Grants, st.Completions, st.BrokenReads, c.pool.Stats().Retries)
	c.closeAndCheck()
}
