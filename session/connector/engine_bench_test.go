package connector_test

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ecxfer/ecxfer/cache"
	"github.com/ecxfer/ecxfer/internal/pybench"
	"github.com/ecxfer/ecxfer/internal/steal"
	"github.com/ecxfer/ecxfer/session/connector"
	"github.com/ecxfer/ecxfer/transport"
	"github.com/ecxfer/ecxfer/xfer"
)

var (
	engineFor    = flag.Duration("engine.for", 2*time.Second, "how long BenchmarkEngine measures each phase (pybench.Short under -benchtime 1x unless set)")
	engineWork   = flag.Duration("engine.work", 200*time.Microsecond, "BenchmarkEngine: CPU work of each engine goroutine per step")
	engineRounds = flag.Int("engine.rounds", 1, "BenchmarkEngine: rounds each load's phases are cut into, in turn with the other loads'")
)

// engineItems is how many entries the engine benchmark's producer holds.
const engineItems = 16

// engine is an inference engine's step loop, for the library to run
// beside: each step, its GOMAXPROCS goroutines do a fixed share of CPU
// work (a parallel forward pass), and the loop calls the library once.
// It counts its steps and the thread CPU time its shares took, so that
// what the process used beyond them can be told apart.
type engine struct {
	iters   int   // loop iterations of one share
	perNs   int64 // its thread CPU time, calibrated
	helpers []chan struct{}
	wg      sync.WaitGroup
	steps   atomic.Int64
	workNs  atomic.Int64
	sink    atomic.Uint64
}

// newEngine starts an engine's helpers (GOMAXPROCS-1 of them; the
// stepping goroutine takes a share too), with shares of about work each.
func newEngine(work time.Duration) *engine {
	e := &engine{}
	// Calibrated on thread CPU time, which a loaded machine does not
	// stretch, on one thread throughout.
	const probe = 1 << 20
	runtime.LockOSThread()
	t0 := threadCPU()
	e.spin(probe)
	per := float64(threadCPU()-t0) / probe
	runtime.UnlockOSThread()
	e.iters = max(int(float64(work.Nanoseconds())/per), 1)
	e.perNs = int64(float64(e.iters) * per)
	for range runtime.GOMAXPROCS(0) - 1 {
		c := make(chan struct{})
		e.helpers = append(e.helpers, c)
		go func() {
			for range c {
				e.share()
				e.wg.Done()
			}
		}()
	}
	return e
}

func threadCPU() int64 {
	var ts unix.Timespec
	unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts)
	return ts.Nano()
}

// spin is the work: n rounds of a xorshift, kept from the compiler.
func (e *engine) spin(n int) {
	x := uint64(n) | 1
	for range n {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
	}
	e.sink.Add(x)
}

// share does one goroutine's share of a step, timing its CPU on its
// thread; when it was moved to another (preempted for the garbage
// collector, say), the calibrated time stands in.
func (e *engine) share() {
	tid, t0 := gettid(), threadCPU()
	e.spin(e.iters)
	t1 := threadCPU()
	if gettid() != tid {
		t1 = t0 + e.perNs
	}
	e.workNs.Add(t1 - t0)
}

// step does one step's work on every goroutine and waits for all.
func (e *engine) step() {
	e.wg.Add(len(e.helpers))
	for _, c := range e.helpers {
		c <- struct{}{}
	}
	e.share()
	e.wg.Wait()
	e.steps.Add(1)
}

func (e *engine) close() {
	for _, c := range e.helpers {
		close(c)
	}
}

// engineSnap is a process's engine and CPU counters at one moment.
type engineSnap struct {
	at          time.Time
	steps       int64
	cpuNs, work int64 // the process's user+system time; the engine's shares'
}

func (e *engine) snap() engineSnap {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return engineSnap{at: time.Now(), steps: e.steps.Load(), cpuNs: ru.Utime.Nano() + ru.Stime.Nano(), work: e.workNs.Load()}
}

func (s engineSnap) String() string {
	return fmt.Sprintf("%d %d %d %d", s.at.UnixNano(), s.steps, s.cpuNs, s.work)
}

func parseSnap(line string) (engineSnap, error) {
	var at int64
	var s engineSnap
	_, err := fmt.Sscanf(line, "%d %d %d %d", &at, &s.steps, &s.cpuNs, &s.work)
	s.at = time.Unix(0, at)
	return s, err
}

// enginePhase is what one process did between two snapshots.
type enginePhase struct {
	secs, steps, cpu, work float64 // cpu and work in seconds
}

func phaseOf(a, b engineSnap) enginePhase {
	return enginePhase{secs: b.at.Sub(a.at).Seconds(), steps: float64(b.steps - a.steps),
		cpu: float64(b.cpuNs-a.cpuNs) / 1e9, work: float64(b.work-a.work) / 1e9}
}

func (p enginePhase) add(q enginePhase) enginePhase {
	return enginePhase{p.secs + q.secs, p.steps + q.steps, p.cpu + q.cpu, p.work + q.work}
}

// own is the CPU the engine itself used in phase f, judged by base (a phase
// without fetches): its shares' time as measured, and per step what the
// process used beyond its shares in base (the loop's hand-offs, the
// library idling).
func (base enginePhase) own(f enginePhase) float64 {
	return f.work + f.steps*(base.cpu-base.work)/base.steps
}

// enginePhaseLen is how long each phase of BenchmarkEngine lasts.
func enginePhaseLen() time.Duration { return pybench.For(*engineFor, "engine.for") }

// engineProducerMain is the second process of BenchmarkEngine: a Producer
// stepped by an engine, with spec <blocks>x<bs>,<data>,<work ns>: it
// serves engineItems entries; it prints its control endpoint, then a snapshot for each
// line it reads, until its stdin closes.
func engineProducerMain(spec string) int {
	var blocks, bs int
	var data string
	var work time.Duration
	if _, err := fmt.Sscanf(strings.ReplaceAll(spec, ",", " "), "%dx%d %s %d", &blocks, &bs, &data, &work); err != nil {
		fmt.Fprintln(os.Stderr, "bad spec", spec, err)
		return 2
	}
	region := must(cache.NewRegion(cache.RegionConfig{Blocks: engineItems * blocks, BlockSize: bs, NoLock: true, Shared: data == "shm"}))
	entries := cache.NewEmbeddingCache(region.Blocks())
	for i := range engineItems {
		e := must(entries.Alloc(benchHash(i), blocks))
		for j, b := range e.Blocks {
			benchFill(region.Block(b), i, j)
		}
		entries.MarkReady(benchHash(i))
	}
	pdata := must(transport.NewTCPData(transport.TCPConfig{Listen: "127.0.0.1:0", Logger: benchQuiet, NoSharedMemory: data != "shm"}, region))
	srv := must(transport.Listen("tcp://127.0.0.1:0", transport.ServerConfig{Logger: benchQuiet}))
	prod := must(connector.NewProducer(connector.ProducerConfig{CompatHash: "bench", Logger: benchQuiet}, srv, pdata, entries))
	e := newEngine(work)
	floor := newFloorServer(blocks * bs)
	defer floor.close()
	var stop atomic.Bool
	done := make(chan struct{})
	ctx, cancel := context.WithCancel(context.Background())
	go func() { // the engine: one Producer.Step per step
		defer close(done)
		if work == 0 { // an idle engine: the README's Serve
			prod.Serve(ctx)
			return
		}
		for !stop.Load() {
			prod.Step(time.Now())
			floor.step()
			e.step()
		}
	}()
	echo := must(net.Listen("tcp", "127.0.0.1:0"))
	go serveEcho(echo)
	defer echo.Close()
	fmt.Println(srv.Endpoint(), echo.Addr(), floor.addrs())
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		fmt.Println(e.snap())
	}
	stop.Store(true)
	cancel()
	<-done
	e.close()
	prod.Close()
	srv.Close()
	pdata.Close()
	region.Close()
	return 0
}

// BenchmarkEngine runs the library beside an engine, as an engine embeds
// it: in each of two processes an engine of GOMAXPROCS goroutines does
// -engine.work of CPU work per goroutine per step, and its loop calls
// Pool.Step (this process) or Producer.Step (the second) once per step,
// never waiting. Fetches of 16 × 8 KiB (1,000/s) and of 1 × 4 MiB
// (100/s) fall due at a fixed rate and are asked for at the next step;
// over the TCP data plane (tcp) and the same-host copy (shm). Each runs
// three phases of -engine.for (no fetches, fetches, no fetches) and
// reports:
//
//   - steps/s-idle and steps/s: both engines' steps a second without and
//     with the fetches;
//   - cpu-µs/fetch: the CPU both processes used (getrusage) less the
//     engines' own (their shares' thread CPU time, and per step the rest
//     of what a step used without fetches), per fetch;
//   - lost-µs/fetch: the engine steps lost to the fetches, at what a step
//     cost without them, per fetch: above cpu-µs/fetch when the library
//     costs the engines more than its CPU;
//   - p50-µs, p99-µs: from when a fetch fell due to the step that saw it
//     complete;
//   - skipped: fetches that fell due while the previous fetch of the same
//     entry was still in flight (each entry comes round every 16 ms), so
//     were not asked for;
//   - steal-ms: the CPU time the hypervisor took from the machine during
//     the phase with fetches (Linux's steal time): on a shared VM, a CPU
//     taken for 100 ms stalls an engine's step, and the fetches behind it,
//     as long.
//
// The 16 × 8 KiB rows carry their floors, measured between the same two
// engines in phases of their own after the library's (each followed by
// one without fetches): floor-polled-*, floor-registered-* and
// floor-netpoller-* are the same figures for a fetch's three messages
// with no library, read once per step off the runtime's poller, once per
// step on descriptors the poller still watches, or by goroutines it wakes;
// beside tcp, floor-polled-bytes-* is the polled floor whose answer
// carries the fetch's bytes, as the TCP plane's does (see
// floor_bench_test.go). The library's row over the same-host copy can be
// read against them run by run.
//
// waiting/<plane> is the same with idle engines: the consumer's loop
// waits between steps (Pool.WaitFor until the next fetch is due, the
// README's loop) and the producer runs Serve, so all the CPU beyond the
// idle library's is the fetches'.
//
// Anchors, in the same run: memmove (the CPU of copying the same bytes,
// cycling over the same number of entries); messages (16 × 8 KiB only:
// the system calls of a fetch's three messages, one thread, caches warm,
// a lower bound for any fetch whose messages cross TCP); tcp-ping-pong (both
// processes' CPU per 200-byte TCP round trip at 1,000/s, sleeping
// between: what waking each side once costs on this machine); and
// request → answer, one outstanding, back to back: sessions (a Pool
// asking a Producer, idle engines, for an entry it does not hold) and
// python-sessions (the reference's sessions doing the same, as
// BenchmarkRequestAck's; it needs msgspec). b.N is ignored.
//
//	go test -run '^$' -bench Engine ./session/connector [-engine.for=2s]
func BenchmarkEngine(b *testing.B) {
	shapes := []struct {
		name       string
		blocks, bs int
		rate       float64
	}{{"16x8KiB", 16, 8 << 10, 1000}, {"1x4MiB", 1, 4 << 20, 100}}
	for _, sh := range shapes {
		for _, data := range []string{"tcp", "shm"} {
			b.Run(sh.name+"/"+data, func(b *testing.B) {
				engineRun(b, sh.blocks, sh.bs, data, sh.rate, *engineWork)
			})
			b.Run(sh.name+"/waiting/"+data, func(b *testing.B) {
				engineRun(b, sh.blocks, sh.bs, data, sh.rate, 0)
			})
		}
		b.Run(sh.name+"/memmove", func(b *testing.B) {
			engineMemmove(b, sh.blocks, sh.bs)
		})
		if sh.blocks*sh.bs <= 128<<10 {
			b.Run(sh.name+"/messages", engineMessages)
		}
	}
	b.Run("tcp-ping-pong", func(b *testing.B) { enginePingPong(b, shapes[0].rate) })
	b.Run("request-answer/sessions", func(b *testing.B) { engineRun(b, 1, 4096, "missing", 0, 0) })
	b.Run("request-answer/python-sessions", pySessions)
}

// engineProc is BenchmarkEngine's second process.
type engineProc struct {
	ctl, echo string             // its control endpoint; its echo server's address
	floors    [floorModes]string // its floor servers' addresses (floorServer)
	remote    func() engineSnap
}

// startEngineProducer starts BenchmarkEngine's second process.
func startEngineProducer(b *testing.B, blocks, bs int, data string, work time.Duration) engineProc {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), fmt.Sprintf("ECXFER_ENGINE_PRODUCER=%dx%d,%s,%d", blocks, bs, data, work.Nanoseconds()))
	cmd.Stderr = os.Stderr
	stdin := must(cmd.StdinPipe())
	stdout := must(cmd.StdoutPipe())
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { stdin.Close(); cmd.Wait() })
	out := bufio.NewReader(stdout)
	line := func() string {
		l, err := out.ReadString('\n')
		if err != nil {
			b.Fatalf("engine producer: %v", err)
		}
		return strings.TrimSpace(l)
	}
	addrs := strings.Fields(line())
	remote := func() engineSnap {
		io.WriteString(stdin, "snap\n")
		s, err := parseSnap(line())
		if err != nil {
			b.Fatal(err)
		}
		return s
	}
	p := engineProc{ctl: addrs[0], echo: addrs[1], remote: remote}
	copy(p.floors[:], addrs[2:])
	return p
}

// serveEcho answers each 200 bytes with themselves: the ping-pong anchor.
func serveEcho(ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			buf := make([]byte, 200)
			for {
				if _, err := io.ReadFull(c, buf); err != nil {
					return
				}
				if _, err := c.Write(buf); err != nil {
					return
				}
			}
		}()
	}
}

// enginePingPong reports the CPU both processes use per 200-byte TCP round
// trip at rate, sleeping between (a Go timer): what waking each side once
// costs here.
func enginePingPong(b *testing.B, rate float64) {
	proc := startEngineProducer(b, 1, 4096, "tcp", 0)
	remote := proc.remote
	roundTrip := echoRoundTrip(b, "tcp", proc.echo)
	e := newEngine(0)
	defer e.close()
	interval := time.Duration(float64(time.Second) / rate)
	n := 0
	run := func(d time.Duration) {
		until := time.Now().Add(d)
		for next := time.Now(); time.Now().Before(until); next = next.Add(interval) {
			time.Sleep(time.Until(next))
			roundTrip()
			n++
		}
	}
	phase := enginePhaseLen()
	run(phase / 4)
	r0, l0 := remote(), e.snap()
	time.Sleep(phase)
	l1, r1, r2, l2 := e.snap(), remote(), remote(), e.snap()
	n = 0
	run(phase)
	l3, r3 := e.snap(), remote()
	cb, pb, cf, pf := phaseOf(l0, l1), phaseOf(r0, r1), phaseOf(l2, l3), phaseOf(r2, r3)
	lib := cf.cpu - cb.cpu*cf.secs/cb.secs + pf.cpu - pb.cpu*pf.secs/pb.secs
	b.ReportMetric(0, "ns/op")
	b.ReportMetric(float64(n)/cf.secs, "rtt/s")
	b.ReportMetric(lib/float64(n)*1e6, "cpu-µs/rtt")
}

// engineMemmove reports the CPU of copying an entry's bytes between two
// regions, cycling over engineItems sources as the fetches do.
func engineMemmove(b *testing.B, blocks, bs int) {
	src := must(cache.NewRegion(cache.RegionConfig{Blocks: engineItems * blocks, BlockSize: bs, NoLock: true}))
	dst := must(cache.NewRegion(cache.RegionConfig{Blocks: blocks, BlockSize: bs, NoLock: true}))
	defer src.Close()
	defer dst.Close()
	n := blocks * bs
	for i := range engineItems {
		copy(dst.Bytes(), src.Bytes()[i*n:(i+1)*n])
	}
	const copies = 2000
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	t0 := threadCPU()
	for i := range copies {
		copy(dst.Bytes(), src.Bytes()[i%engineItems*n:][:n])
	}
	b.ReportMetric(0, "ns/op")
	b.ReportMetric(float64(threadCPU()-t0)/copies/1e3, "cpu-µs/fetch")
}

// engineMessages reports the CPU of a fetch's three messages' system calls
// alone: a request, its answer and a notification, floorMsg bytes each,
// written and read at once by one thread over a loopback TCP connection,
// caches warm, nothing woken. No design that sends those messages over
// TCP costs less on this machine.
func engineMessages(b *testing.B) {
	ln := must(net.Listen("tcp", "127.0.0.1:0"))
	defer ln.Close()
	dialed := must(net.Dial("tcp", ln.Addr().String()))
	accepted := must(ln.Accept())
	c := must(newFloorConn(dialed, floorPolled)) // the consumer's end
	p := must(newFloorConn(accepted, floorPolled))
	defer c.close()
	defer p.close()
	var kinds []byte
	message := func(from, to *floorConn, kind byte) {
		if err := from.send(kind); err != nil {
			b.Fatal(err)
		}
		for kinds = kinds[:0]; len(kinds) == 0; {
			var err error
			if kinds, err = to.poll(kinds); err != nil {
				b.Fatal(err)
			}
		}
	}
	fetch := func() {
		message(c, p, floorRequest)
		message(p, c, floorAnswer)
		message(c, p, floorDone)
	}
	for range 1000 {
		fetch()
	}
	const fetches = 20000
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	t0 := threadCPU()
	for range fetches {
		fetch()
	}
	b.ReportMetric(0, "ns/op")
	b.ReportMetric(float64(threadCPU()-t0)/fetches/1e3, "cpu-µs/fetch")
}

// engineLoad is what an engine's loop fetches through, for engineDrive: the
// library (a Pool), or a floor anchor's bare connection.
type engineLoad interface {
	// ask starts a fetch that fell due at due; false: none could start
	// now (it is counted as skipped).
	ask(due, now time.Time) bool
	// step is the library's part of an engine step: it returns when each
	// fetch that ended fell due, and counts those that failed.
	step(now time.Time) (ended []time.Time)
	inFlight() int
	failed() int
	// wait waits, an idle engine, for the library, or at most d when d
	// is not negative.
	wait(ctx context.Context, d time.Duration)
}

// engineRun is one shape over one data plane: see BenchmarkEngine.
func engineRun(b *testing.B, blocks, bs int, data string, rate float64, work time.Duration) {
	// "missing": request → answer, one outstanding, back to back: the
	// producer holds no such entry and NACKs it.
	missing := data == "missing"
	if missing {
		data = "tcp"
	}
	proc := startEngineProducer(b, blocks, bs, data, work)
	names := []string{data}
	loads := []engineLoad{newPoolLoad(b, proc.ctl, blocks, bs, data, missing)}
	if work > 0 && blocks*bs <= 128<<10 { // the floors beside small fetches
		for mode := range floorModes {
			if mode == floorPolledBytes && data != "tcp" {
				continue // the floor of fetches whose bytes cross TCP
			}
			f := newFloorLoad(b, proc, mode, blocks*bs)
			names = append(names, f.name)
			loads = append(loads, f)
		}
	}
	engineDrive(b, proc.remote, work, rate, names, loads...)
}

// poolLoad is a Pool fetching engineItems entries in turn from the engine
// producer at ep, into 64 slots of blocks each.
type poolLoad struct {
	b              *testing.B
	pool           *connector.Pool
	region         *cache.Region
	ep             string
	blocks, bs     int
	missing        bool
	free           []int
	slotOf         map[string]int
	dueOf          map[string]time.Time
	item, failures int
	want           []byte
}

func newPoolLoad(b *testing.B, ep string, blocks, bs int, data string, missing bool) *poolLoad {
	const slots = 64
	pool, region := benchPool(b, slots*blocks, bs, data)
	l := &poolLoad{b: b, pool: pool, region: region, ep: ep, blocks: blocks, bs: bs, missing: missing,
		slotOf: map[string]int{}, dueOf: map[string]time.Time{}, want: make([]byte, bs)}
	for i := range slots {
		l.free = append(l.free, i)
	}
	return l
}

func (l *poolLoad) ask(due, now time.Time) bool {
	h := benchHash(l.item % engineItems)
	if l.missing {
		h = "missing"
	}
	if _, busy := l.slotOf[h]; busy || len(l.free) == 0 {
		return false
	}
	s := l.free[len(l.free)-1]
	ids := make([]int, l.blocks)
	for j := range ids {
		ids[j] = s*l.blocks + j
	}
	if _, err := l.pool.Fetch(l.ep, h, ids, now.Add(10*time.Second), now); err != nil {
		l.b.Fatal(err)
	}
	l.item++
	l.free = l.free[:len(l.free)-1]
	l.slotOf[h], l.dueOf[h] = s, due
	return true
}

func (l *poolLoad) step(now time.Time) []time.Time {
	var ended []time.Time
	end := func(h string) {
		ended = append(ended, l.dueOf[h])
		l.free = append(l.free, l.slotOf[h])
		delete(l.slotOf, h)
		delete(l.dueOf, h)
	}
	r := l.pool.Step(now)
	for _, d := range r.Completed {
		if l.item <= engineItems { // every entry's bytes, in the warm-up
			var i int
			fmt.Sscanf(d.MMHash, "bench-%d", &i)
			for j, blk := range d.Blocks {
				benchFill(l.want, i, j)
				if string(l.region.Block(blk)) != string(l.want) {
					l.b.Fatalf("%s block %d: bytes differ", d.MMHash, j)
				}
			}
		}
		end(d.MMHash)
	}
	for _, f := range r.Failed {
		if l.missing && f.Reason == xfer.Nacked {
			end(f.MMHash)
			continue
		}
		l.failures++
		if f.BlocksHeld {
			l.b.Fatalf("%s failed with its blocks held: %v", f.MMHash, f.Reason)
		}
		end(f.MMHash)
		ended = ended[:len(ended)-1]
	}
	return ended
}

func (l *poolLoad) inFlight() int { return len(l.slotOf) }
func (l *poolLoad) failed() int   { return l.failures }

func (l *poolLoad) wait(ctx context.Context, d time.Duration) {
	if d < 0 {
		l.pool.Wait(ctx)
		return
	}
	l.pool.WaitFor(ctx, d)
}

// engineDrive runs an engine of -engine.work per goroutine per step beside
// the engine producer (remote takes its snapshot), fetching through each
// of loads in turn at rate (0: one at a time, back to back), and reports
// what BenchmarkEngine says: the first load's figures under their plain
// names, the others' prefixed with their names. Every load steps at every
// step, so that the phases without fetches (one before each load's, and
// one after the last) cost each the same. With work 0 the engine is idle:
// it waits on the first load between steps, the only one it may have.
func engineDrive(b *testing.B, remote func() engineSnap, work time.Duration, rate float64, names []string, loads ...engineLoad) {
	waiting := work == 0
	if waiting && len(loads) > 1 {
		b.Fatal("idle engines wait on one load")
	}
	e := newEngine(work)
	defer e.close()
	var interval time.Duration
	if rate > 0 {
		interval = time.Duration(float64(time.Second) / rate)
	}
	type tally struct {
		lat              []time.Duration
		fetches, skipped int
	}
	tallies := make([]tally, len(loads))
	var due, until time.Time
	ctx := context.Background()
	inFlight := func() int {
		n := 0
		for _, l := range loads {
			n += l.inFlight()
		}
		return n
	}
	// step is one engine step: the fetches due of the asking load (-1:
	// none), every load's step, the work. record counts what it asks for
	// and sees.
	step := func(asking int, record bool) {
		now := time.Now()
		for asking >= 0 && !now.Before(due) && (rate > 0 || loads[asking].inFlight() == 0) {
			d := due
			due = due.Add(interval)
			if rate == 0 {
				d = now
			}
			t := &tallies[asking]
			if !loads[asking].ask(d, now) {
				if record {
					t.skipped++
				}
				continue
			}
			if record {
				t.fetches++
			}
		}
		for i, l := range loads {
			for _, d := range l.step(now) {
				if record {
					tallies[i].lat = append(tallies[i].lat, now.Sub(d))
				}
			}
		}
		if !waiting {
			e.step()
			return
		}
		// An idle engine waits for the library, or the next fetch due.
		load := loads[0]
		e.steps.Add(1)
		switch {
		case asking >= 0 && rate > 0:
			load.wait(ctx, max(0, time.Until(due)))
		case load.inFlight() > 0:
			load.wait(ctx, -1)
		case asking >= 0: // back to back: the next one at once
		default:
			load.wait(ctx, max(0, time.Until(until)))
		}
	}
	// run steps for d, asking for fetches of load asking; settle steps
	// until none is in flight.
	run := func(d time.Duration, asking int) {
		until = time.Now().Add(d)
		due = time.Now()
		for time.Now().Before(until) {
			step(asking, asking >= 0)
		}
	}
	settle := func() {
		for inFlight() > 0 {
			step(-1, false)
		}
	}
	phase := enginePhaseLen()
	rounds := max(*engineRounds, 1)
	// Warm-up: connections, mappings, first touches; not recorded.
	for i := range loads {
		until = time.Now().Add(phase / 4)
		due = time.Now()
		for time.Now().Before(until) {
			step(i, false)
		}
		settle()
	}
	// stolen is the CPU time the hypervisor took from the machine in each
	// load's phase with fetches: a stolen CPU stalls whatever ran on it
	// (10 ms at a time), a fetch's latency and an engine's step alike.
	stolen := make([]time.Duration, len(loads))
	measure := func(asking int) (enginePhase, enginePhase) {
		s0, _ := steal.Machine()
		r0, l0 := remote(), e.snap()
		run(phase/time.Duration(rounds), asking)
		l1, r1 := e.snap(), remote()
		if s1, _ := steal.Machine(); asking >= 0 {
			stolen[asking] += s1 - s0
		}
		settle()
		return phaseOf(l0, l1), phaseOf(r0, r1)
	}
	// Each load's phase with fetches sits between two without. With
	// -engine.rounds above 1 the loads take turns in shorter phases, so
	// that a slow spell of the machine weighs on the library and its
	// floors alike (docs/performance.md, "Beside a busy engine").
	cbs, pbs := make([]enginePhase, len(loads)), make([]enginePhase, len(loads))
	cfs, pfs := make([]enginePhase, len(loads)), make([]enginePhase, len(loads))
	for range rounds {
		bc, bp := measure(-1)
		for i := range loads {
			fc, fp := measure(i)
			cfs[i], pfs[i] = cfs[i].add(fc), pfs[i].add(fp)
			nc, np := measure(-1)
			cbs[i], pbs[i] = cbs[i].add(bc).add(nc), pbs[i].add(bp).add(np)
			bc, bp = nc, np
		}
	}
	b.ReportMetric(0, "ns/op")
	for i, load := range loads {
		t := tallies[i]
		cb, pb := cbs[i], pbs[i]
		cf, pf := cfs[i], pfs[i]
		if load.failed() > 0 || t.fetches == 0 {
			b.Fatalf("%s: %d fetches, %d failed", names[i], t.fetches, load.failed())
		}
		if len(t.lat) == 0 {
			b.Fatalf("%s: no fetch ended within its phase of %v", names[i], phase)
		}
		b.Logf("%s: consumer: without fetches %+v, with %+v; producer: %+v, %+v", names[i], cb, cf, pb, pf)
		lib := (cf.cpu - cb.own(cf)) + (pf.cpu - pb.own(pf))
		if waiting { // all but the idle library's CPU is the fetches'
			lib = cf.cpu - cb.cpu*cf.secs/cb.secs + pf.cpu - pb.cpu*pf.secs/pb.secs
		}
		lost := (cb.steps/cb.secs-cf.steps/cf.secs)*cb.cpu/cb.steps + (pb.steps/pb.secs-pf.steps/pf.secs)*pb.cpu/pb.steps
		perSec := float64(t.fetches) / cf.secs
		slices.Sort(t.lat)
		metric := func(v float64, unit string) {
			if i > 0 {
				unit = names[i] + "-" + unit
			}
			b.ReportMetric(v, unit)
		}
		if !waiting {
			if i == 0 {
				metric(cb.steps/cb.secs+pb.steps/pb.secs, "steps/s-idle")
				metric(cf.steps/cf.secs+pf.steps/pf.secs, "steps/s")
			}
			metric(lost/perSec*1e6, "lost-µs/fetch")
		}
		if i == 0 {
			metric(perSec, "fetches/s")
		}
		metric(lib/float64(t.fetches)*1e6, "cpu-µs/fetch")
		metric(float64(t.lat[len(t.lat)/2].Nanoseconds())/1e3, "p50-µs")
		if i == 0 {
			metric(float64(t.lat[len(t.lat)*99/100].Nanoseconds())/1e3, "p99-µs")
		}
		if t.skipped > 0 {
			metric(float64(t.skipped), "skipped")
		}
		metric(float64(stolen[i].Microseconds())/1e3, "steal-ms")
	}
}
