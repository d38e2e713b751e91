package connector_test

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ecxfer/ecxfer/cache"
	"github.com/ecxfer/ecxfer/internal/pybench"
	"github.com/ecxfer/ecxfer/session/connector"
	"github.com/ecxfer/ecxfer/transport"
	"github.com/ecxfer/ecxfer/wire"
	"github.com/ecxfer/ecxfer/xfer"
)

// The latency benchmark's producer: items entries of blocks × bs bytes,
// served through a Producer over the real control plane and the TCP data
// plane (its region Shared for "shm"), next to a 200-byte TCP echo for the
// ping-pong anchor. In a second process it is this test binary again, with
// ECXFER_BENCH_PRODUCER=<items>x<blocks>x<bs>,<data>.
const benchItems = 64

var benchQuiet = slog.New(slog.NewTextHandler(io.Discard, nil))

func benchFill(b []byte, item, block int) {
	for i := range b {
		b[i] = byte(item*31 + block*7 + i)
	}
}

func benchHash(i int) string { return fmt.Sprintf("bench-%04d", i) }

// startBenchProducer serves the entries; it returns the control endpoint,
// the echo address and a function that stops it all. ctlAddr and dataAddr
// may name the addresses to bind ("" picks free ones).
func startBenchProducer(blocks, bs int, data, ctlAddr, dataAddr string) (string, string, func(), error) {
	if ctlAddr == "" {
		ctlAddr = "127.0.0.1:0"
	}
	if dataAddr == "" {
		dataAddr = "127.0.0.1:0"
	}
	region, err := cache.NewRegion(cache.RegionConfig{Blocks: benchItems * blocks, BlockSize: bs, NoLock: true, Shared: data == "shm"})
	if err != nil {
		return "", "", nil, err
	}
	entries := cache.NewEmbeddingCache(region.Blocks())
	for i := range benchItems {
		e, err := entries.Alloc(benchHash(i), blocks)
		if err != nil {
			return "", "", nil, err
		}
		for j, b := range e.Blocks {
			benchFill(region.Block(b), i, j)
		}
		entries.MarkReady(benchHash(i))
	}
	pdata, err := transport.NewTCPData(transport.TCPConfig{Listen: dataAddr, Logger: benchQuiet, NoSharedMemory: data != "shm",
		NoPush: data == "tcp-no-push"}, region)
	if err != nil {
		return "", "", nil, err
	}
	scfg := transport.ServerConfig{Logger: benchQuiet}
	if ctlAddr != "127.0.0.1:0" && !strings.HasPrefix(ctlAddr, "ipc://") {
		// The process-fault tests (fixed TCP addresses): notice dead peers fast.
		scfg.PingInterval, scfg.PeerTimeout = 100*time.Millisecond, 500*time.Millisecond
	}
	srv, err := transport.Listen(ctlAddr, scfg)
	if err != nil {
		return "", "", nil, err
	}
	prod, err := connector.NewProducer(connector.ProducerConfig{CompatHash: "bench", Logger: benchQuiet}, srv, pdata, entries)
	if err != nil {
		return "", "", nil, err
	}
	echo, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", "", nil, err
	}
	go serveEcho(echo)
	// Only BenchmarkRequestAck's anchor dials it: where it cannot be
	// made, that anchor fails, not everything that serves entries here.
	uecho, uerr := net.Listen("unix", unixEcho(echo.Addr().String()))
	if uerr == nil {
		go serveEcho(uecho)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan struct{})
	go func() { prod.Serve(ctx); close(served) }()
	stop := func() {
		cancel()
		<-served
		echo.Close()
		if uerr == nil {
			uecho.Close()
		}
		prod.Close()
		srv.Close()
		pdata.Close()
		region.Close()
	}
	lastProducer = prod
	return srv.Endpoint(), echo.Addr().String(), stop, nil
}

// unixEcho is the address of the echo's Unix-domain twin, named after the
// TCP echo's address, which is unique on the host while it is bound: an
// abstract socket on Linux, a file in the temporary directory elsewhere
// (removed when its listener closes).
func unixEcho(tcpEcho string) string {
	if runtime.GOOS == "linux" {
		return "@ecxfer-bench-echo-" + tcpEcho
	}
	return filepath.Join(os.TempDir(), "ecxfer-echo-"+strings.ReplaceAll(tcpEcho, ":", "-")+".sock")
}

// echoRoundTrip dials the echo at addr over network and returns one
// 200-byte round trip on that connection, which closes when b ends.
func echoRoundTrip(b *testing.B, network, addr string) func() {
	c, err := net.Dial(network, addr)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { c.Close() })
	buf := make([]byte, 200)
	return func() {
		c.Write(buf)
		if _, err := io.ReadFull(c, buf); err != nil {
			b.Fatal(err)
		}
	}
}

// lastProducer is the producer startBenchProducer made last in this
// process, for BenchmarkUnpin.
var lastProducer *connector.Producer

// benchProducerMain is the second process: it prints the two addresses
// and serves until its stdin closes.
func benchProducerMain(spec string) int {
	var blocks, bs int
	f := strings.Split(spec, ",") // <blocks>x<bs>,<data>[,<control addr>,<data addr>]
	if _, err := fmt.Sscanf(f[0], "%dx%d", &blocks, &bs); err != nil || len(f) < 2 {
		fmt.Fprintln(os.Stderr, "bad spec", spec, err)
		return 2
	}
	f = append(f, "", "")
	ep, echo, stop, err := startBenchProducer(blocks, bs, f[1], f[2], f[3])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	fmt.Println(ep, echo)
	io.Copy(io.Discard, os.Stdin)
	stop()
	return 0
}

// benchProducer starts the producer in this process or in a second one.
func benchProducer(b *testing.B, blocks, bs int, data string, twoProcs bool) (string, string) {
	if !twoProcs {
		ep, echo, stop, err := startBenchProducer(blocks, bs, data, "", "")
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(stop)
		return ep, echo
	}
	p := startProc(b, fmt.Sprintf("ECXFER_BENCH_PRODUCER=%dx%d,%s", blocks, bs, data))
	return p.fields[0], p.fields[1]
}

// proc is a second process: this test binary again, in the role its
// environment names. It prints one line of fields when ready, and ends
// when its stdin closes (or it is killed).
type proc struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	fields []string
}

func startProc(tb testing.TB, env string) *proc {
	tb.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), env)
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	p := &proc{cmd: cmd, stdin: stdin}
	tb.Cleanup(p.stop)
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		tb.Fatalf("second process: %v", err)
	}
	p.fields = strings.Fields(line)
	return p
}

// stop ends the process: gracefully, or by SIGKILL after 10 s.
func (p *proc) stop() {
	p.stdin.Close()
	done := make(chan struct{})
	go func() { p.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		p.cmd.Process.Kill()
		<-done
	}
}

// latencies runs once per iteration after a warm-up and reports the
// median and the 99th percentile.
func latencies(b *testing.B, once func()) {
	lat, _ := timeEach(b, once)
	b.ReportMetric(float64(lat[len(lat)/2].Nanoseconds())/1e3, "p50-µs")
	b.ReportMetric(float64(lat[len(lat)*99/100].Nanoseconds())/1e3, "p99-µs")
}

// timeEach runs once per iteration after a warm-up; it returns each run's
// time, sorted, and the runs per second.
func timeEach(b *testing.B, once func()) ([]time.Duration, float64) {
	for range 100 {
		once()
	}
	lat := make([]time.Duration, 0, b.N)
	start := time.Now()
	b.ResetTimer()
	for b.Loop() {
		t := time.Now()
		once()
		lat = append(lat, time.Since(t))
	}
	b.StopTimer()
	perSec := float64(len(lat)) / time.Since(start).Seconds()
	slices.Sort(lat)
	return lat, perSec
}

// BenchmarkFetchLatency measures one fetch at a time through Pool and
// Producer (Pool.Wait between steps, as an engine's loop does), for
// 16 × 8 KiB and 1 × 1 MiB entries, over the TCP data plane and the
// same-host copy, with the producer in this process and in a second one.
// In the same run: a 200-byte Go TCP ping-pong to the same process, and a
// copy of the same bytes between two regions. Each reports p50 and p99.
func BenchmarkFetchLatency(b *testing.B) {
	for _, shape := range []struct {
		name       string
		blocks, bs int
	}{{"16x8KiB", 16, 8 << 10}, {"1x1MiB", 1, 1 << 20}} {
		for _, twoProcs := range []bool{false, true} {
			procs := map[bool]string{false: "one-process", true: "two-processes"}[twoProcs]
			for _, data := range []string{"tcp", "tcp-no-push", "shm"} {
				b.Run(fmt.Sprintf("%s/%s/%s", shape.name, procs, data), func(b *testing.B) {
					ep, _ := benchProducer(b, shape.blocks, shape.bs, data, twoProcs)
					benchFetches(b, ep, shape.blocks, shape.bs, data)
				})
			}
			b.Run(fmt.Sprintf("%s/%s/tcp-ping-pong", shape.name, procs), func(b *testing.B) {
				_, echo := benchProducer(b, shape.blocks, shape.bs, "tcp", twoProcs)
				latencies(b, echoRoundTrip(b, "tcp", echo))
			})
		}
		b.Run(shape.name+"/memcpy", func(b *testing.B) {
			src := must(cache.NewRegion(cache.RegionConfig{Blocks: shape.blocks, BlockSize: shape.bs, NoLock: true}))
			dst := must(cache.NewRegion(cache.RegionConfig{Blocks: shape.blocks, BlockSize: shape.bs, NoLock: true}))
			defer src.Close()
			defer dst.Close()
			latencies(b, func() { copy(dst.Bytes(), src.Bytes()) })
		})
	}
}

// benchPool is a consumer for a benchmark: a Pool over a region of blocks
// × bs, on the real control plane and the TCP data plane (which maps a
// shared region for "shm"). It closes with the benchmark.
func benchPool(b *testing.B, blocks, bs int, data string, opts ...func(*connector.PoolConfig)) (*connector.Pool, *cache.Region) {
	pool, region, _ := benchPoolWith(b, blocks, bs, data, transport.ClientConfig{NoSameHost: *controlTCP}, opts...)
	return pool, region
}

var controlTCP = flag.Bool("control.tcp", false, "keep benchmarks' control planes on TCP between Go peers on one host (ClientConfig.NoSameHost), for comparison")

// benchPoolWith is benchPool with a control plane configured by ccfg,
// which it returns too.
func benchPoolWith(b *testing.B, blocks, bs int, data string, ccfg transport.ClientConfig, opts ...func(*connector.PoolConfig)) (*connector.Pool, *cache.Region, *transport.Client) {
	region := must(cache.NewRegion(cache.RegionConfig{Blocks: blocks, BlockSize: bs, NoLock: true}))
	cdata := must(transport.NewTCPData(transport.TCPConfig{Logger: benchQuiet, NoSharedMemory: data != "shm",
		PushBuffer: map[bool]int{true: -1}[data == "tcp-no-push"]}, region))
	ccfg.Logger = benchQuiet
	cli := transport.NewClient(ccfg)
	cfg := connector.PoolConfig{CompatHash: "bench", BlockSize: bs, Logger: benchQuiet}
	for _, o := range opts {
		o(&cfg)
	}
	pool := must(connector.NewPool(cfg, cli, cdata))
	b.Cleanup(func() { pool.Close(); cli.Close(); cdata.Close(); region.Close() })
	return pool, region, cli
}

// fetchOne fetches mmHash into ids and steps until it ends, as an
// engine's loop does (Pool.Wait between steps); it returns the outcome.
func fetchOne(b *testing.B, pool *connector.Pool, ep, mmHash string, ids []int) (completed bool) {
	now := time.Now()
	if _, err := pool.Fetch(ep, mmHash, ids, now.Add(10*time.Second), now); err != nil {
		b.Fatal(err)
	}
	for {
		r := pool.Step(time.Now())
		if len(r.Completed) > 0 {
			return true
		}
		if len(r.Failed) > 0 {
			return false
		}
		pool.Wait(context.Background())
	}
}

func benchFetches(b *testing.B, ep string, blocks, bs int, data string) {
	pool, region := benchPool(b, blocks, bs, data)
	ids := make([]int, blocks)
	for i := range ids {
		ids[i] = i
	}
	want := make([]byte, bs)
	n := 0
	latencies(b, func() {
		item := n % benchItems
		n++
		if !fetchOne(b, pool, ep, benchHash(item), ids) {
			b.Fatal("fetch failed")
		}
		if n <= benchItems { // every entry's bytes, checked during the warm-up
			for j := range blocks {
				benchFill(want, item, j)
				if string(region.Block(j)) != string(want) {
					b.Fatalf("item %d block %d: bytes differ", item, j)
				}
			}
		}
	})
}

// BenchmarkRequestAck measures request → answer round trips through the
// sessions on both ends, one outstanding, between two processes: a Pool
// asks a Producer (in a second process) for an entry it does not hold and
// waits for the NACK, next to a 200-byte Go TCP ping-pong to that same
// process, and to the reference's Python sessions doing the same over
// pyzmq (python-sessions: they need msgspec, e.g. on PYTHONPATH, and the
// seed in ../shared), and to the same ping-pong over a Unix-domain socket
// (what a same-host control channel off TCP would start from). Each
// reports rtt/s and p50.
func BenchmarkRequestAck(b *testing.B) {
	b.Run("python-sessions", pySessions)
	ep, echo := benchProducer(b, 1, 4096, "tcp", true)
	// The sessions as configured by default (between Go peers on one
	// host the control plane moves to the producer's Unix-domain socket),
	// and kept on TCP.
	for _, tcpOnly := range []bool{false, true} {
		b.Run(map[bool]string{false: "sessions", true: "sessions-tcp"}[tcpOnly], func(b *testing.B) {
			pool, _, cli := benchPoolWith(b, 1, 4096, "tcp", transport.ClientConfig{NoSameHost: tcpOnly})
			rtt(b, func() {
				if fetchOne(b, pool, ep, "not-held", []int{0}) {
					b.Fatal("an entry the producer does not hold was fetched")
				}
			})
			if moved := cli.Stats().SameHost == 1; moved == tcpOnly {
				b.Fatalf("moved to the same-host socket: %v", moved)
			}
		})
	}
	// The same 200 bytes over TCP and over a Unix-domain socket, between
	// the same two processes.
	for _, nw := range []string{"tcp", "unix"} {
		b.Run(nw+"-ping-pong", func(b *testing.B) {
			addr := echo
			if nw == "unix" {
				addr = unixEcho(echo)
			}
			rtt(b, echoRoundTrip(b, nw, addr))
		})
	}
}

// rtt runs once per iteration after a warm-up and reports the rate and the
// median.
func rtt(b *testing.B, once func()) {
	lat, perSec := timeEach(b, once)
	b.ReportMetric(perSec, "rtt/s")
	b.ReportMetric(float64(lat[len(lat)/2].Nanoseconds())/1e3, "p50-µs")
}

var idleFor = flag.Duration("idle.for", 2*time.Second, "how long BenchmarkIdleCPU measures each case (put it after the package: -bench IdleCPU ./session/connector -idle.for=10s); pybench.Short under -benchtime 1x unless set")

// cpuTime is the process's user and system time.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkIdleCPU measures, with getrusage over -idle.for, the share of
// one core this process uses while: a Producer serves and nothing comes
// ("producer"); a Pool waits with nothing in flight, its connections up
// ("consumer"); a Producer holds a grant whose consumer never READs
// ("producer-grant-outstanding": it should wake only for the lease). b.N
// is ignored.
func BenchmarkIdleCPU(b *testing.B) {
	measure := func(b *testing.B) {
		for b.Loop() {
		}
		runtime.GC()
		start, t0 := cpuTime(), time.Now()
		time.Sleep(pybench.For(*idleFor, "idle.for"))
		b.ReportMetric(100*float64(cpuTime()-start)/float64(time.Since(t0)), "%-core")
	}
	b.Run("producer", func(b *testing.B) {
		benchProducer(b, 1, 4096, "tcp", false)
		measure(b)
	})
	b.Run("consumer", func(b *testing.B) {
		ep, _ := benchProducer(b, 1, 4096, "tcp", true) // the producer in another process
		pool, _ := benchPool(b, 1, 4096, "tcp")
		now := time.Now()
		if _, err := pool.Fetch(ep, benchHash(0), []int{0}, now.Add(10*time.Second), now); err != nil {
			b.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { // the engine's loop
			defer close(done)
			for pool.Wait(ctx) {
				pool.Step(time.Now())
			}
		}()
		measure(b)
		cancel()
		<-done
	})
	b.Run("producer-grant-outstanding", func(b *testing.B) {
		ep, _ := benchProducer(b, 1, 4096, "tcp", false)
		cli := transport.NewClient(transport.ClientConfig{Logger: benchQuiet})
		defer cli.Close()
		req := wire.AppendReq(nil, &wire.XferReq{MMHash: benchHash(0), CompatibilityHash: "bench", SessionID: "3f2b8c1e-9a4d-4e7b-8c2f-1d5e6a7b8c9d"})
		if err := cli.Send(ep, req); err != nil {
			b.Fatal(err)
		}
		var in []xfer.Inbound
		for len(in) == 0 {
			cli.Wait(context.Background())
			in = cli.Drain(in)
		}
		var ack wire.XferAck
		if err := wire.DecodeAck(in[0].Payload, &ack); err != nil || ack.Status != wire.OK {
			b.Fatalf("ack %+v, %v", ack, err)
		}
		measure(b)
	})
}

// BenchmarkUnpin measures, one fetch at a time in one process, how long
// after the Pool reports a fetch completed the producer has unpinned its
// entry (its Serve woke for the READ's notification and stepped). The
// notification left the consumer just before the Pool saw the completion,
// so this is close to notification-to-unpin. The benchmark's own polling
// competes for the two cores with the goroutines it waits for: its tail
// is an upper bound. (Timed from inside, the slow cases were all the
// producer's data-plane goroutine reading the done frame 1–4 ms after it
// was written, waiting for a CPU; from the notification's arrival to the
// unpin took 5–25 µs.)
func BenchmarkUnpin(b *testing.B) {
	for _, data := range []string{"tcp", "shm"} {
		b.Run(data, func(b *testing.B) {
			ep, _ := benchProducer(b, 16, 8<<10, data, false)
			prod := lastProducer
			pool, _ := benchPool(b, 16, 8<<10, data)
			ids := make([]int, 16)
			for i := range ids {
				ids[i] = i
			}
			var lat []time.Duration
			n := 0
			for b.Loop() {
				if !fetchOne(b, pool, ep, benchHash(n%benchItems), ids) {
					b.Fatal("fetch failed")
				}
				n++
				t := time.Now()
				for prod.Grants() > 0 {
					// Between looks, leave the producer's lock alone.
					for range 64 {
						runtime.Gosched()
					}
					if time.Since(t) > 5*time.Second {
						b.Fatal("still pinned after 5 s")
					}
				}
				lat = append(lat, time.Since(t))
			}
			slices.Sort(lat)
			b.ReportMetric(float64(lat[len(lat)/2].Nanoseconds())/1e3, "p50-µs")
			b.ReportMetric(float64(lat[len(lat)*99/100].Nanoseconds())/1e3, "p99-µs")
		})
	}
}

// pySessions runs testdata/py_sessions_bench.py for 2 s (pybench.Short
// under -benchtime 1x) and reports its numbers.
func pySessions(b *testing.B) {
	seeds, _ := filepath.Glob("../../../shared/seed/*.txt")
	seed := ""
	for _, f := range seeds {
		if text, err := os.ReadFile(f); err == nil && strings.Contains(string(text), "class ConsumerSession") {
			seed = f
		}
	}
	if seed == "" {
		b.Skip("the reference's session module (../shared/seed) is not here")
	}
	pybench.Run(b, "/usr/bin/python3", "testdata/py_sessions_bench.py", seed, pybench.Seconds(2*time.Second))
}
