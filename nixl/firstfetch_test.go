//go:build nixl

package nixl

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ecxfer/ecxfer/cache"
	"github.com/ecxfer/ecxfer/session/connector"
	"github.com/ecxfer/ecxfer/transport"
)

// The first-fetch benchmark's producer process: manyItems entries of
// manyBlocks blocks, served by a connector.Producer over NIXL.
const manyItems, manyBlocks = 64, 16

func manyFill(b []byte, item, block int) {
	for i := range b {
		b[i] = byte(item*31 + block*7 + i)
	}
}

func runManyChild(bs int) error {
	region, err := cache.NewRegion(cache.RegionConfig{Blocks: manyItems * manyBlocks, BlockSize: bs})
	if err != nil {
		return err
	}
	defer region.Close()
	entries := cache.NewEmbeddingCache(region.Blocks())
	for i := range manyItems {
		e, err := entries.Alloc(fmt.Sprint(i), manyBlocks)
		if err != nil {
			return err
		}
		for j, b := range e.Blocks {
			manyFill(region.Block(b), i, j)
		}
		entries.MarkReady(fmt.Sprint(i))
	}
	var params map[string]string
	if p := os.Getenv("ECXFER_NIXL_PARAMS"); p != "" {
		k, v, _ := strings.Cut(p, "=")
		params = map[string]string{k: v}
	}
	data, err := New(Config{Name: fmt.Sprintf("many-%d", os.Getpid()), Params: params}, region)
	if err != nil {
		return err
	}
	defer data.Close()
	srv, err := transport.Listen("127.0.0.1:0", transport.ServerConfig{Logger: quiet})
	if err != nil {
		return err
	}
	defer srv.Close()
	prod := must(connector.NewProducer(connector.ProducerConfig{CompatHash: compat(bs), Logger: quiet}, srv, data, entries))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { prod.Serve(ctx); close(done) }()
	fmt.Println(srv.Endpoint())
	io.Copy(io.Discard, os.Stdin)
	cancel()
	<-done
	prod.Close()
	return nil
}

// idleFetches fetches, each after idleGap without any, make
// BenchmarkFirstFetch's after-idle anchor.
const (
	idleFetches = 3
	idleGap     = 50 * time.Millisecond
)

// BenchmarkFirstFetch measures, over NIXL between two processes, fetches
// from a producer the consumer has never seen: each iteration starts a
// producer process (manyItems entries of 16 × 8 KiB) and a new consumer
// (its region's pages in, as a running engine's are), with Pool.Connect
// first or without. "first": one fetch, then 100 one at a time; it
// reports the first's latency and the steady p50 (medians over the
// iterations) and their ratio, and, as the first's anchor, after-idle: the
// median of fetches on the same warm connection after idleGap without any
// (idleFetches an iteration). "wave64": every entry at once; when the
// first and the last ended. Run with -benchtime Nx.
func BenchmarkFirstFetch(b *testing.B) {
	const bs = 8 << 10
	// UCX_TLS unset too: what a deployment gets by default (cma between
	// processes here).
	for _, v := range append(variants, variant{name: "default"}) {
		for _, connect := range []bool{false, true} {
			mode := map[bool]string{false: "cold", true: "connect"}[connect]
			b.Run(fmt.Sprintf("%s/%s/first", v.name, mode), func(b *testing.B) {
				if v.tls != "" {
					b.Setenv("UCX_TLS", v.tls)
				}
				var first, steady, idle, conn []time.Duration
				for b.Loop() {
					c := newManyConsumer(b, v, bs)
					conn = append(conn, c.connect(b, connect))
					first = append(first, c.fetch(b, 0))
					var lat []time.Duration
					for i := range 100 {
						lat = append(lat, c.fetch(b, 1+i%(manyItems-1)))
					}
					slices.Sort(lat)
					steady = append(steady, lat[len(lat)/2])
					for i := range idleFetches {
						time.Sleep(idleGap)
						idle = append(idle, c.fetch(b, 1+i))
					}
					c.close()
				}
				reportMed(b, "first-µs", first, time.Microsecond)
				reportMed(b, "steady-p50-µs", steady, time.Microsecond)
				reportMed(b, "after-idle-µs", idle, time.Microsecond)
				reportMed(b, "connect-ms", conn, time.Millisecond)
				b.ReportMetric(float64(med(first))/float64(med(steady)), "first/steady")
			})
			b.Run(fmt.Sprintf("%s/%s/wave64", v.name, mode), func(b *testing.B) {
				if v.tls != "" {
					b.Setenv("UCX_TLS", v.tls)
				}
				var firstDone, lastDone, conn []time.Duration
				for b.Loop() {
					c := newManyConsumer(b, v, bs)
					conn = append(conn, c.connect(b, connect))
					f, l := c.wave(b)
					firstDone, lastDone = append(firstDone, f), append(lastDone, l)
					c.close()
				}
				reportMed(b, "first-done-ms", firstDone, time.Millisecond)
				reportMed(b, "last-done-ms", lastDone, time.Millisecond)
				reportMed(b, "connect-ms", conn, time.Millisecond)
			})
		}
	}
}

func med(d []time.Duration) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[len(s)/2]
}

func reportMed(b *testing.B, name string, d []time.Duration, unit time.Duration) {
	s := slices.Clone(d)
	slices.Sort(s)
	b.ReportMetric(float64(s[len(s)/2])/float64(unit), name)
	b.ReportMetric(float64(s[0])/float64(unit), name+"-min")
	b.ReportMetric(float64(s[len(s)-1])/float64(unit), name+"-max")
}

type manyConsumer struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	ep     string
	bs     int
	region *cache.Region
	data   *Agent
	cli    *transport.Client
	pool   *connector.Pool
}

func newManyConsumer(b *testing.B, v variant, bs int) *manyConsumer {
	b.StopTimer()
	defer b.StartTimer()
	c := &manyConsumer{bs: bs}
	c.cmd = exec.Command(os.Args[0], "-test.run=^$")
	c.cmd.Env = append(os.Environ(), "ECXFER_NIXL_CHILD=many", fmt.Sprint("ECXFER_NIXL_BLOCK=", bs))
	if v.tls != "" {
		c.cmd.Env = append(c.cmd.Env, "UCX_TLS="+v.tls)
	}
	for k, val := range v.params {
		c.cmd.Env = append(c.cmd.Env, "ECXFER_NIXL_PARAMS="+k+"="+val)
	}
	c.cmd.Stderr = os.Stderr
	c.stdin, _ = c.cmd.StdinPipe()
	out, _ := c.cmd.StdoutPipe()
	if err := c.cmd.Start(); err != nil {
		b.Fatal(err)
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		b.Fatalf("producer process: %v", err)
	}
	c.ep = strings.TrimSpace(line)
	c.region = must(cache.NewRegion(cache.RegionConfig{Blocks: manyItems * manyBlocks, BlockSize: bs}))
	clear(c.region.Bytes())
	c.data = must(New(Config{Name: fmt.Sprintf("first-%d-%d", os.Getpid(), seq.Add(1)), Params: v.params}, c.region))
	c.cli = transport.NewClient(transport.ClientConfig{Logger: quiet})
	c.pool = must(connector.NewPool(connector.PoolConfig{CompatHash: compat(bs), BlockSize: bs, Logger: quiet}, c.cli, c.data))
	return c
}

func (c *manyConsumer) connect(b *testing.B, connect bool) time.Duration {
	if !connect {
		return 0
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	t := time.Now()
	if err := c.pool.Connect(ctx, c.ep); err != nil {
		b.Fatal(err)
	}
	return time.Since(t)
}

func (c *manyConsumer) ids(item int) []int {
	ids := make([]int, manyBlocks)
	for j := range ids {
		ids[j] = item*manyBlocks + j
	}
	return ids
}

func (c *manyConsumer) check(b *testing.B, item int) {
	want := make([]byte, c.bs)
	for j, blk := range c.ids(item) {
		manyFill(want, item, j)
		if string(c.region.Block(blk)) != string(want) {
			b.Fatalf("item %d block %d: bytes differ", item, j)
		}
	}
}

func (c *manyConsumer) fetch(b *testing.B, item int) time.Duration {
	t := time.Now()
	if _, err := c.pool.Fetch(c.ep, fmt.Sprint(item), c.ids(item), t.Add(30*time.Second), t); err != nil {
		b.Fatal(err)
	}
	for {
		r := c.pool.Step(time.Now())
		if len(r.Failed) > 0 {
			b.Fatalf("fetch %d failed: %+v", item, r.Failed[0])
		}
		if len(r.Completed) > 0 {
			break
		}
		c.pool.Wait(context.Background())
	}
	d := time.Since(t)
	c.check(b, item)
	return d
}

func (c *manyConsumer) wave(b *testing.B) (first, last time.Duration) {
	t := time.Now()
	for i := range manyItems {
		if _, err := c.pool.Fetch(c.ep, fmt.Sprint(i), c.ids(i), t.Add(30*time.Second), t); err != nil {
			b.Fatal(err)
		}
	}
	done := 0
	for done < manyItems {
		r := c.pool.Step(time.Now())
		if len(r.Failed) > 0 {
			b.Fatalf("%s failed: %s", r.Failed[0].MMHash, r.Failed[0].Reason)
		}
		if len(r.Completed) > 0 && done == 0 {
			first = time.Since(t)
		}
		done += len(r.Completed)
		if done < manyItems {
			c.pool.Wait(context.Background())
		}
	}
	last = time.Since(t)
	for i := range manyItems {
		c.check(b, i)
	}
	return first, last
}

func (c *manyConsumer) close() {
	c.pool.Close()
	c.cli.Close()
	c.data.Close()
	c.region.Close()
	c.stdin.Close()
	c.cmd.Wait()
}
