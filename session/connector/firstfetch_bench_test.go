package connector_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/ecxfer/ecxfer/cache"
	"github.com/ecxfer/ecxfer/session/connector"
	"github.com/ecxfer/ecxfer/transport"
)

// idleFetches fetches, each after idleGap without any, make
// BenchmarkFirstFetch's after-idle anchor.
const (
	idleFetches = 3
	idleGap     = 50 * time.Millisecond
)

// BenchmarkFirstFetch measures fetches from a producer the consumer has
// never seen: each iteration starts a producer process (16 × 8 KiB
// entries, benchItems of them) and a new consumer (Pool, control client,
// TCP data plane; its region's pages already in) in this process, over the TCP data plane ("tcp") or the
// same-host copy ("shm"), with Pool.Connect first ("connect") or without
// ("cold"). "first": one fetch, then 100 one at a time for the steady
// state; it reports the first fetch's latency and, as medians over the
// iterations, the steady p50 and their ratio. "wave64": benchItems
// fetches at once; it reports when the first and the last ended. Connect's
// own time is connect-ms. after-idle is the first fetch's anchor: the
// median of fetches on the same warm connection after idleGap without
// any (idleFetches an iteration), what waking two idle processes costs,
// where the steady p50's fetches come back to back. Run with -benchtime
// Nx: each iteration starts a process.
func BenchmarkFirstFetch(b *testing.B) {
	const blocks, bs = 16, 8 << 10
	for _, data := range []string{"tcp", "shm"} {
		for _, connect := range []bool{false, true} {
			mode := map[bool]string{false: "cold", true: "connect"}[connect]
			b.Run(fmt.Sprintf("%s/%s/first", data, mode), func(b *testing.B) {
				var first, steady, idle, conn []time.Duration
				for b.Loop() {
					c := newFirstFetch(b, blocks, bs, data)
					conn = append(conn, c.connect(b, connect))
					first = append(first, c.fetch(b, 0))
					var lat []time.Duration
					for i := range 100 {
						lat = append(lat, c.fetch(b, 1+i%(benchItems-1)))
					}
					slices.Sort(lat)
					steady = append(steady, lat[len(lat)/2])
					for i := range idleFetches {
						time.Sleep(idleGap)
						idle = append(idle, c.fetch(b, 1+i))
					}
					c.close()
				}
				report(b, "first-µs", first, time.Microsecond)
				report(b, "steady-p50-µs", steady, time.Microsecond)
				report(b, "after-idle-µs", idle, time.Microsecond)
				report(b, "connect-ms", conn, time.Millisecond)
				b.ReportMetric(float64(median(first))/float64(median(steady)), "first/steady")
			})
			b.Run(fmt.Sprintf("%s/%s/wave64", data, mode), func(b *testing.B) {
				var firstDone, lastDone, conn []time.Duration
				for b.Loop() {
					c := newFirstFetch(b, blocks, bs, data)
					conn = append(conn, c.connect(b, connect))
					f, l := c.wave(b)
					firstDone, lastDone = append(firstDone, f), append(lastDone, l)
					c.close()
				}
				report(b, "first-done-ms", firstDone, time.Millisecond)
				report(b, "last-done-ms", lastDone, time.Millisecond)
				report(b, "connect-ms", conn, time.Millisecond)
			})
		}
	}
}

func median(d []time.Duration) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[len(s)/2]
}

// report reports the median of d in unit, and its range.
func report(b *testing.B, name string, d []time.Duration, unit time.Duration) {
	s := slices.Clone(d)
	slices.Sort(s)
	b.ReportMetric(float64(s[len(s)/2])/float64(unit), name)
	b.ReportMetric(float64(s[0])/float64(unit), name+"-min")
	b.ReportMetric(float64(s[len(s)-1])/float64(unit), name+"-max")
}

// firstFetch is one iteration's producer process and new consumer.
type firstFetch struct {
	prod   *proc
	ep     string
	blocks int
	region *cache.Region
	cdata  *transport.TCPData
	cli    *transport.Client
	pool   *connector.Pool
}

func newFirstFetch(b *testing.B, blocks, bs int, data string) *firstFetch {
	b.StopTimer()
	defer b.StartTimer()
	c := &firstFetch{blocks: blocks}
	c.prod = startProc(b, fmt.Sprintf("ECXFER_BENCH_PRODUCER=%dx%d,%s", blocks, bs, data))
	c.ep = c.prod.fields[0]
	c.region = must(cache.NewRegion(cache.RegionConfig{Blocks: benchItems * blocks, BlockSize: bs, NoLock: true}))
	// A running consumer's: its pages are in (an engine's region is locked
	// in memory), so that the first fetch pays for the new producer only,
	// not for the first touch of a huge page of its own.
	clear(c.region.Bytes())
	c.cdata = must(transport.NewTCPData(transport.TCPConfig{Logger: benchQuiet, NoSharedMemory: data != "shm"}, c.region))
	c.cli = transport.NewClient(transport.ClientConfig{Logger: benchQuiet, NoSameHost: *controlTCP})
	c.pool = must(connector.NewPool(connector.PoolConfig{CompatHash: "bench", BlockSize: bs, Logger: benchQuiet}, c.cli, c.cdata))
	return c
}

func (c *firstFetch) connect(b *testing.B, connect bool) time.Duration {
	if !connect {
		return 0
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	t := time.Now()
	if err := c.pool.Connect(ctx, c.ep); err != nil {
		b.Fatal(err)
	}
	return time.Since(t)
}

func (c *firstFetch) ids(item int) []int {
	ids := make([]int, c.blocks)
	for j := range ids {
		ids[j] = item*c.blocks + j
	}
	return ids
}

// fetch fetches item and returns its latency, checking its bytes.
func (c *firstFetch) fetch(b *testing.B, item int) time.Duration {
	t := time.Now()
	if !fetchOne(b, c.pool, c.ep, benchHash(item), c.ids(item)) {
		b.Fatalf("fetch of item %d failed", item)
	}
	d := time.Since(t)
	c.check(b, item)
	return d
}

func (c *firstFetch) check(b *testing.B, item int) {
	want := make([]byte, c.region.BlockSize())
	for j, blk := range c.ids(item) {
		benchFill(want, item, j)
		if string(c.region.Block(blk)) != string(want) {
			b.Fatalf("item %d block %d: bytes differ", item, j)
		}
	}
}

// wave fetches every item at once; it returns when the first and the
// last ended.
func (c *firstFetch) wave(b *testing.B) (first, last time.Duration) {
	t := time.Now()
	for i := range benchItems {
		if _, err := c.pool.Fetch(c.ep, benchHash(i), c.ids(i), t.Add(10*time.Second), t); err != nil {
			b.Fatal(err)
		}
	}
	done := 0
	for done < benchItems {
		r := c.pool.Step(time.Now())
		if len(r.Failed) > 0 {
			b.Fatalf("%s failed: %s", r.Failed[0].MMHash, r.Failed[0].Reason)
		}
		if len(r.Completed) > 0 && done == 0 {
			first = time.Since(t)
		}
		done += len(r.Completed)
		if done < benchItems {
			c.pool.Wait(context.Background())
		}
	}
	last = time.Since(t)
	for i := range benchItems {
		c.check(b, i)
	}
	return first, last
}

func (c *firstFetch) close() {
	c.pool.Close()
	c.cli.Close()
	c.cdata.Close()
	c.region.Close()
	c.prod.stop()
}
