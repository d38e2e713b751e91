package connector_test

import (
	"context"
	"encoding/binary"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ecxfer/ecxfer/cache"
	"github.com/ecxfer/ecxfer/internal/cachex"
	"github.com/ecxfer/ecxfer/internal/pybench"
	"github.com/ecxfer/ecxfer/internal/shm"
	"github.com/ecxfer/ecxfer/session/connector"
	"github.com/ecxfer/ecxfer/transport"
)

var (
	entriesFor  = flag.Duration("entries.for", time.Second, "how long BenchmarkEntrySizes measures the library and each anchor (100 ms and a few entries under -benchtime 1x unless set)")
	entriesSpan = flag.Int64("entries.span", 0, "bytes BenchmarkEntrySizes rotates over on each side; 0: four times the last-level cache")
	// Not the default configuration: for finding where a fetch's time goes.
	entriesWorkers = flag.Int("entries.copyworkers", 0, "BenchmarkEntrySizes: the consumer's TCPConfig.CopyWorkers (0: the default)")
	entriesSmall   = flag.Bool("entries.smallpages", false, "BenchmarkEntrySizes: the consumer's slots without huge pages, as the producer's shared region is")
	entriesLibOnly = flag.Bool("entries.libonly", false, "BenchmarkEntrySizes: the anchors' phases cut to 1 ms, for profiling the library's (their ratios then mean little)")
	entriesRegion  = flag.Bool("entries.regioncopy", false, "BenchmarkEntrySizes: one more anchor in the shm rows, a memmove out of the producer's region mapped here a second time (on in the short run, which checks it works)")
)

// The second process of BenchmarkEntrySizes is this test binary again,
// started with ECXFER_ENTRY_PRODUCER=<items>x<blocks>x<bs>. It is taken
// here rather than in TestMain so that the benchmark stays in one file.
func init() {
	if spec := os.Getenv("ECXFER_ENTRY_PRODUCER"); spec != "" {
		os.Exit(entryProducerMain(spec))
	}
}

// entryCPU is the request on a plain connection that asks for the
// producer process's CPU time instead of an entry.
const entryCPU = ^uint32(0)

// BenchmarkEntrySizes fetches entries the size of a vision encoder's output
// for one image, one at a time, between two processes: 576 tokens of a
// 4,096-wide bf16 model (4.5 MiB, LLaVA-1.5-7B) and 1,024 tokens of a
// 3,584-wide one (7 MiB). Each comes in two layouts: one block per token's
// row (8 KiB and 7 KiB: vLLM's encoder cache keeps an embedding row per
// block), and 512 KiB blocks (a coarse cache; 512 KiB divides both sizes).
// Both sides rotate over -entries.span bytes (by default four times the
// last-level cache), the producer's entries and the consumer's slots, so
// that every fetch reads and writes memory the cache does not hold.
//
// Each row measures, in the same run, with the default configuration:
//
//   - cpu-µs/fetch: both processes' CPU (getrusage) per fetch, fetches back
//     to back (Pool.Wait between steps); p50-µs and p99-µs of those fetches;
//   - copy-cpu-µs and copy-p50-µs: a memmove of the same bytes on one
//     thread, from the consumer's slots to slots half the span away, both
//     rotating: the cost of moving the bytes through cold memory;
//   - plain-cpu-µs and plain-p50-µs: a plain Go TCP transfer of the same
//     bytes between the same two processes: a 4-byte request, one
//     net.Conn Write of the entry out of the producer's region, read into
//     the consumer's rotating slots;
//   - rtt-p50-µs: a 200-byte TCP round trip between the two processes;
//   - the ratios the goals are stated in: cpu/copy, cpu/plain, p50/plain
//     and p50/copy+rtt;
//   - in the shm rows, with -entries.regioncopy (and in the short run,
//     which checks that it works), region-copy-cpu-µs and
//     region-copy-p50-µs: a memmove on one thread of what a same-host
//     fetch copies, out of the file it copies it from (the producer's
//     region, mapped here a second time: small pages where the system
//     gives shared memory none) into the slot the fetch writes. Every
//     entry is copied once first, as the library's warm-up fetches each:
//     on the development VM the first touch of a page of that mapping
//     cost several times what later ones did (the row logs both). Not a
//     default anchor: it maps the producer's whole region once more.
//
// b.N is ignored.
//
//	go test -run '^$' -bench EntrySizes -benchtime 1x ./session/connector -entries.for 1s
func BenchmarkEntrySizes(b *testing.B) {
	for _, sh := range []struct {
		name       string
		blocks, bs int
	}{
		{"4.5MiB/576x8KiB", 576, 8 << 10},
		{"7MiB/1024x7KiB", 1024, 7 << 10},
		{"4.5MiB/9x512KiB", 9, 512 << 10},
		{"7MiB/14x512KiB", 14, 512 << 10},
	} {
		b.Run(sh.name, func(b *testing.B) { entryRows(b, sh.blocks, sh.bs) })
	}
}

// entryShort: the run takes each benchmark once to check it works, and
// no -entries.for asks for figures.
func entryShort() bool {
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == "entries.for" })
	return pybench.Once() && !set
}

// lastLevelCache returns the size of the largest data cache of CPU 0: from
// sysfs, else from getconf (some VMs have no cache directory in sysfs),
// else a guess of 32 MiB.
func lastLevelCache() int64 {
	var size int64
	dirs, _ := filepath.Glob("/sys/devices/system/cpu/cpu0/cache/index*")
	for _, d := range dirs {
		typ, _ := os.ReadFile(filepath.Join(d, "type"))
		text, _ := os.ReadFile(filepath.Join(d, "size"))
		if strings.TrimSpace(string(typ)) == "Instruction" {
			continue
		}
		s := strings.TrimSpace(string(text))
		mult := int64(1)
		switch {
		case strings.HasSuffix(s, "K"):
			mult, s = 1<<10, strings.TrimSuffix(s, "K")
		case strings.HasSuffix(s, "M"):
			mult, s = 1<<20, strings.TrimSuffix(s, "M")
		}
		if v, err := strconv.ParseInt(s, 10, 64); err == nil {
			size = max(size, v*mult)
		}
	}
	if size > 0 {
		return size
	}
	if out, err := exec.Command("getconf", "LEVEL3_CACHE_SIZE").Output(); err == nil {
		if v, err := strconv.ParseInt(strings.TrimSpace(string(out)), 10, 64); err == nil && v > 0 {
			return v
		}
	}
	return 32 << 20
}

// entryTemplate is the bytes every block starts from; entryFill stamps
// the entry and the block in its first 8.
func entryTemplate(bs int) []byte {
	t := make([]byte, bs)
	benchFill(t, 1, 1)
	return t
}

func entryFill(block, tmpl []byte, item, j int) {
	copy(block, tmpl)
	binary.LittleEndian.PutUint32(block, uint32(item))
	binary.LittleEndian.PutUint32(block[4:], uint32(j))
}

// entryProducerMain serves items entries of blocks × bs from a shared
// region, through a Producer (its data plane offering the same-host path;
// a consumer that does not map it reads over TCP), and, beside it, a
// 200-byte TCP echo and the plain transfer's server. It prints the three
// addresses and the path its region's file opens at, and serves until its
// stdin closes.
func entryProducerMain(spec string) int {
	var items, blocks, bs int
	if _, err := fmt.Sscanf(spec, "%dx%dx%d", &items, &blocks, &bs); err != nil {
		fmt.Fprintln(os.Stderr, "bad spec", spec, err)
		return 2
	}
	region := must(cache.NewRegion(cache.RegionConfig{Blocks: items * blocks, BlockSize: bs, NoLock: true, Shared: true}))
	entries := cache.NewEmbeddingCache(region.Blocks())
	tmpl := entryTemplate(bs)
	first := make([]int, items)
	for i := range items {
		e := must(entries.Alloc(benchHash(i), blocks))
		for j, blk := range e.Blocks {
			if blk != e.Blocks[0]+j { // the plain transfer writes an entry at once
				fmt.Fprintln(os.Stderr, benchHash(i), "is not contiguous")
				return 2
			}
			entryFill(region.Block(blk), tmpl, i, j)
		}
		first[i] = e.Blocks[0]
		entries.MarkReady(benchHash(i))
	}
	pdata := must(transport.NewTCPData(transport.TCPConfig{Listen: "127.0.0.1:0", Logger: benchQuiet}, region))
	srv := must(transport.Listen("tcp://127.0.0.1:0", transport.ServerConfig{Logger: benchQuiet}))
	prod := must(connector.NewProducer(connector.ProducerConfig{CompatHash: "bench", Logger: benchQuiet}, srv, pdata, entries))
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan struct{})
	go func() { prod.Serve(ctx); close(served) }()
	echo := must(net.Listen("tcp", "127.0.0.1:0"))
	go serveEcho(echo)
	plain := must(net.Listen("tcp", "127.0.0.1:0"))
	go servePlain(plain, region, first, blocks*bs)
	fmt.Println(srv.Endpoint(), echo.Addr(), plain.Addr(), cachex.SharedPath(region))
	io.Copy(io.Discard, os.Stdin)
	cancel()
	<-served
	echo.Close()
	plain.Close()
	prod.Close()
	srv.Close()
	pdata.Close()
	region.Close()
	return 0
}

// servePlain answers each 4-byte request i with entry i's n bytes, written
// at once out of the region, and entryCPU with this process's CPU time in
// nanoseconds.
func servePlain(ln net.Listener, region *cache.Region, first []int, n int) {
	bs := region.BlockSize()
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			var req [4]byte
			var cpu [8]byte
			for {
				if _, err := io.ReadFull(c, req[:]); err != nil {
					return
				}
				i := binary.LittleEndian.Uint32(req[:])
				out := cpu[:]
				if i == entryCPU {
					binary.LittleEndian.PutUint64(cpu[:], uint64(cpuTime()))
				} else if int(i) < len(first) {
					out = region.Bytes()[first[i]*bs:][:n]
				} else {
					return
				}
				if _, err := c.Write(out); err != nil {
					return
				}
			}
		}()
	}
}

// regionTouch copies the first k entries out of the second mapping twice
// over, and says how long each pass took and how many page faults this
// process took meanwhile: what touching those pages first costs, page
// faults apart.
func regionTouch(regionCopy func(int), k int) string {
	pass := func() (time.Duration, int64) {
		var r0, r1 unix.Rusage
		unix.Getrusage(unix.RUSAGE_SELF, &r0)
		t := time.Now()
		for i := range k {
			regionCopy(i)
		}
		d := time.Since(t)
		unix.Getrusage(unix.RUSAGE_SELF, &r1)
		return d / time.Duration(k), r1.Minflt - r0.Minflt + r1.Majflt - r0.Majflt
	}
	d1, f1 := pass()
	d2, f2 := pass()
	return fmt.Sprintf("region copy of %d entries, first pass after mapping: %v each, %d page faults; again: %v each, %d page faults", k, d1, f1, d2, f2)
}

// mapProducerRegion maps the producer's region read-only, its pages
// faulted in where the kernel can (Linux 5.14), as the same-host data
// plane maps it: size bytes of blocks after the header.
func mapProducerRegion(b *testing.B, path string, size int) []byte {
	f := must(os.Open(path))
	defer f.Close()
	mem, err := unix.Mmap(int(f.Fd()), 0, shm.HeaderSize()+size, unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		b.Fatal(err)
	}
	if err := shm.PopulateRead(mem); err != nil {
		b.Logf("region copy: pages not faulted in ahead (%v): the first copies fault them", err)
	}
	return mem
}

// entryPhase is what one way of moving the entry did.
type entryPhase struct {
	lat []time.Duration
	cpu time.Duration // in all
}

func (p *entryPhase) add(q entryPhase) { p.lat = append(p.lat, q.lat...); p.cpu += q.cpu }

func (p entryPhase) perOp() float64 { return float64(p.cpu.Nanoseconds()) / float64(len(p.lat)) / 1e3 }

func (p entryPhase) at(q float64) float64 {
	lat := slices.Sorted(slices.Values(p.lat))
	return float64(lat[int(q*float64(len(lat)))].Nanoseconds()) / 1e3
}

// entryRows measures one shape over both planes (a sub-benchmark each),
// between one producer process and one set of slots: touching a few GiB
// for the first time is slow on a VM, so it is done once.
func entryRows(b *testing.B, blocks, bs int) {
	n := blocks * bs
	phase := *entriesFor
	span := *entriesSpan
	if span <= 0 {
		span = 4 * lastLevelCache()
	}
	rounds := 5
	if entryShort() {
		phase, span, rounds = 50*time.Millisecond, 4*int64(n), 1
	}
	items := max(4, int((span+int64(n)-1)/int64(n)))
	p := startProc(b, fmt.Sprintf("ECXFER_ENTRY_PRODUCER=%dx%dx%d", items, blocks, bs))
	if len(p.fields) < 4 {
		b.Fatalf("entry producer printed %q", p.fields)
	}
	ep, echoAddr, plainAddr, regionPath := p.fields[0], p.fields[1], p.fields[2], p.fields[3]

	// The consumer's slots, one per entry: slot i takes entry i. Touched
	// first, so that no phase pays for the first write of a page.
	region := must(cache.NewRegion(cache.RegionConfig{Blocks: items * blocks, BlockSize: bs, NoLock: true, NoHugePages: *entriesSmall}))
	defer region.Close()
	clear(region.Bytes())
	plain := must(net.Dial("tcp", plainAddr))
	defer plain.Close()
	echo := must(net.Dial("tcp", echoAddr))
	defer echo.Close()
	var req [4]byte
	remoteCPU := func() time.Duration {
		binary.LittleEndian.PutUint32(req[:], entryCPU)
		var out [8]byte
		if _, err := plain.Write(req[:]); err != nil {
			b.Fatal(err)
		}
		if _, err := io.ReadFull(plain, out[:]); err != nil {
			b.Fatal(err)
		}
		return time.Duration(binary.LittleEndian.Uint64(out[:]))
	}
	slot := func(i int) []byte { return region.Bytes()[i*n:][:n] }
	transfer := func(k int) {
		i := k % items
		binary.LittleEndian.PutUint32(req[:], uint32(i))
		if _, err := plain.Write(req[:]); err != nil {
			b.Fatal(err)
		}
		if _, err := io.ReadFull(plain, slot(i)); err != nil {
			b.Fatal(err)
		}
	}
	coldCopy := func(k int) {
		i := k % items
		copy(slot((i+items/2)%items), slot(i))
	}
	// -entries.regioncopy, in the shm rows: the bytes a same-host fetch
	// copies, from the file it copies them from (the producer's region,
	// mapped here a second time), into the slot the fetch writes. Mapped
	// for those rows alone, and every entry copied once before the rounds,
	// as the library's warm-up fetches each.
	regionAnchor := func(b *testing.B) (regionCopy func(int)) {
		src := mapProducerRegion(b, regionPath, items*n)
		b.Cleanup(func() { unix.Munmap(src) })
		for i := range items { // the producer allocated the entries in order
			if got := binary.LittleEndian.Uint64(src[shm.HeaderSize()+i*n:]); got != uint64(i) {
				b.Fatalf("entry %d is not where the region copy reads it (its stamp %#x)", i, got)
			}
		}
		regionCopy = func(k int) {
			i := k % items
			copy(slot(i), src[shm.HeaderSize()+i*n:][:n])
		}
		b.Log(regionTouch(regionCopy, min(items, 20)))
		for i := range items {
			regionCopy(i)
		}
		return regionCopy
	}
	ping := make([]byte, 200)
	roundTrip := func(int) {
		echo.Write(ping)
		if _, err := io.ReadFull(echo, ping); err != nil {
			b.Fatal(err)
		}
	}
	// measure runs once back to back for d, from the k-th time on;
	// withRemote: the CPU is both processes', else this thread's (locked
	// to it). It returns what it measured and the next k.
	measure := func(d time.Duration, k int, withRemote bool, once func(int)) (entryPhase, int) {
		var ph entryPhase
		var r0 time.Duration
		if withRemote {
			r0 = remoteCPU()
		} else {
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
		}
		c0 := cpuTime()
		if !withRemote {
			c0 = time.Duration(threadCPU())
		}
		for until := time.Now().Add(d); time.Now().Before(until); k++ {
			t := time.Now()
			once(k)
			ph.lat = append(ph.lat, time.Since(t))
		}
		if withRemote {
			ph.cpu = cpuTime() - c0 + remoteCPU() - r0
		} else {
			ph.cpu = time.Duration(threadCPU()) - c0
		}
		return ph, k
	}
	for k := range min(items, 8) {
		transfer(k)
		coldCopy(k)
	}
	for k := range 100 {
		roundTrip(k)
	}
	tmpl := entryTemplate(bs)
	want := make([]byte, bs)
	for _, data := range []string{"shm", "tcp"} {
		b.Run(data, func(b *testing.B) {
			b.Logf("%d entries of %d bytes on each side (%d MiB), %d rounds, %v in all for each", items, n, int64(items)*int64(n)>>20, rounds, phase)
			var regionCopy func(int)
			if data == "shm" && (*entriesRegion || entryShort()) { // the short run checks that it works
				regionCopy = regionAnchor(b)
			}
			cdata := must(transport.NewTCPData(transport.TCPConfig{Logger: benchQuiet, NoSharedMemory: data != "shm", CopyWorkers: *entriesWorkers}, region))
			cli := transport.NewClient(transport.ClientConfig{Logger: benchQuiet, NoSameHost: *controlTCP})
			pool := must(connector.NewPool(connector.PoolConfig{CompatHash: "bench", BlockSize: bs, Logger: benchQuiet}, cli, cdata))
			defer func() { pool.Close(); cli.Close(); cdata.Close() }()
			ids := make([]int, blocks)
			fetch := func(k int) {
				i := k % items
				for j := range ids {
					ids[j] = i*blocks + j
				}
				if !fetchOne(b, pool, ep, benchHash(i), ids) {
					b.Fatalf("fetch of %s failed", benchHash(i))
				}
			}
			// Warm-up: every entry once, the bytes checked.
			for i := range items {
				fetch(i)
				for j := range blocks {
					entryFill(want, tmpl, i, j)
					if got := region.Block(i*blocks + j); string(got) != string(want) {
						b.Fatalf("%s block %d: bytes differ", benchHash(i), j)
					}
				}
			}
			// Rounds of each in turn, so that a machine that drifts moves
			// the library's figures and the anchors' alike.
			var lib, cp, rc, pl, rt entryPhase
			kl, kc, kg, kp, kr := 0, 0, 0, 0, 0
			for r := range rounds {
				var l, c, g, p, t entryPhase
				l, kl = measure(phase/time.Duration(rounds), kl, true, fetch)
				anchors := phase
				if *entriesLibOnly {
					anchors = time.Millisecond
				}
				c, kc = measure(anchors/time.Duration(rounds), kc, false, coldCopy)
				p, kp = measure(anchors/time.Duration(rounds), kp, true, transfer)
				t, kr = measure(anchors/time.Duration(4*rounds), kr, true, roundTrip)
				b.Logf("round %d, p50 / CPU (µs): library %.0f / %.0f, copy %.0f / %.0f, plain %.0f / %.0f, rtt %.0f", r,
					l.at(0.5), l.perOp(), c.at(0.5), c.perOp(), p.at(0.5), p.perOp(), t.at(0.5))
				if regionCopy != nil {
					g, kg = measure(anchors/time.Duration(rounds), kg, false, regionCopy)
					b.Logf("round %d, region copy p50 / CPU (µs): %.0f / %.0f", r, g.at(0.5), g.perOp())
					rc.add(g)
				}
				lib.add(l)
				cp.add(c)
				pl.add(p)
				rt.add(t)
			}
			b.ReportMetric(0, "ns/op")
			b.ReportMetric(float64(len(lib.lat)), "fetches")
			b.ReportMetric(lib.perOp(), "cpu-µs/fetch")
			b.ReportMetric(lib.at(0.5), "p50-µs")
			b.ReportMetric(lib.at(0.99), "p99-µs")
			b.ReportMetric(cp.perOp(), "copy-cpu-µs")
			b.ReportMetric(cp.at(0.5), "copy-p50-µs")
			if regionCopy != nil {
				b.ReportMetric(rc.perOp(), "region-copy-cpu-µs")
				b.ReportMetric(rc.at(0.5), "region-copy-p50-µs")
			}
			b.ReportMetric(pl.perOp(), "plain-cpu-µs")
			b.ReportMetric(pl.at(0.5), "plain-p50-µs")
			b.ReportMetric(rt.at(0.5), "rtt-p50-µs")
			b.ReportMetric(lib.perOp()/cp.perOp(), "cpu/copy")
			b.ReportMetric(lib.perOp()/pl.perOp(), "cpu/plain")
			b.ReportMetric(lib.at(0.5)/pl.at(0.5), "p50/plain")
			b.ReportMetric(lib.at(0.5)/(cp.at(0.5)+rt.at(0.5)), "p50/copy+rtt")
		})
	}
}
