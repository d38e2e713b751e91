// Package demo is the workload the examples run: a producer holding
// deterministic embeddings and a consumer that fetches and verifies every
// byte of them.
package demo

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/ecxfer/ecxfer/cache"
	"github.com/ecxfer/ecxfer/internal/steal"
	"github.com/ecxfer/ecxfer/nixl"
	"github.com/ecxfer/ecxfer/session/connector"
	"github.com/ecxfer/ecxfer/session/connector/metrics"
	"github.com/ecxfer/ecxfer/transport"
	"github.com/ecxfer/ecxfer/wire"
	"github.com/ecxfer/ecxfer/xfer"
)

// Config is the workload's shape; both sides must agree on it.
type Config struct {
	Items         int // embeddings
	BlocksPerItem int
	BlockSize     int
	Concurrency   int // fetches in flight at most
	Fetches       int // fetches in all, cycling over the items; 0: Items
	// InflightBytes bounds a consumer's bytes in flight, and so its region:
	// it keeps as many fetches in flight as whole items fit (at most
	// Concurrency). 0: DefaultInflightBytes.
	InflightBytes Bytes
	// Lock locks the regions in RAM (mlock); a refusal fails the run. Off,
	// the kernel may page them out like any memory.
	Lock bool
	// ProgressEvery is how often a single consumer reports how far along
	// it is, and StartProducer how far its fill (0: never).
	ProgressEvery time.Duration
	// Progress is where StartProducer reports its fill (nil: nowhere).
	Progress io.Writer
	// Rate makes a consumer open loop: a fetch falls due every 1/Rate s,
	// whatever is in flight (within Concurrency), and its latency counts
	// from when it fell due, so that a backlog shows. 0: closed loop, as
	// many in flight as Concurrency allows.
	Rate float64
	// Warmup leaves the fetches asked for (or due) in the first Warmup of
	// a consumer's run out of its latencies: connections, mappings and
	// first touches of the producer's pages are paid then.
	Warmup time.Duration

	Metrics string // serve Prometheus metrics on this address ("" none)
	// MetricsAlso are collected with a consumer's metrics (the loopback's
	// producer).
	MetricsAlso  []prometheus.Collector
	Data         string // data plane: "shm" (default: TCP with the same-host copy), "tcp" (TCP only) or "nixl"
	NIXLParams   string // NIXL backend parameters, "k=v,k=v"
	NIXLProgress string // who drives NIXL agents: goroutine, thread or caller
	NIXLPost     string // NIXL: where READs are posted: auto (the default), sync (nixl.Config.SyncPost) or async (InlinePost -1)
	NoPush       bool   // TCP plane: no pushes (a producer sends blocks only when a READ asks)
}

// Flags registers the shape flags on fs (the default set when nil), with
// the defaults the examples share; concurrency only for consumers.
func (c *Config) Flags(fs *flag.FlagSet, concurrency bool) {
	if fs == nil {
		fs = flag.CommandLine
	}
	fs.IntVar(&c.Items, "items", 1000, "embeddings")
	fs.IntVar(&c.BlocksPerItem, "blocks-per-item", 16, "blocks per embedding")
	fs.IntVar(&c.BlockSize, "block-size", 8192, "bytes per block")
	if concurrency {
		fs.IntVar(&c.Concurrency, "concurrency", 64, "fetches in flight at most (fewer when -inflight-bytes holds fewer items)")
		c.InflightBytes = DefaultInflightBytes
		fs.Var(&c.InflightBytes, "inflight-bytes", "bytes in flight per consumer, and so the size of its region: as many fetches in flight as whole items fit, at most -concurrency (K, M, G or T: 256M, 1GiB)")
		fs.IntVar(&c.Fetches, "fetches", 0, "fetches in all, cycling over the items (0: one per item); more than -items re-fetches entries in one session")
		fs.DurationVar(&c.Warmup, "warmup", 0, "leave fetches asked for in the first this long out of the latencies")
		fs.Float64Var(&c.Rate, "rate", 0, "fetches per second per consumer, due at fixed intervals whatever is in flight (open loop; latency from when each fell due); 0: keep -concurrency in flight")
	}
	fs.BoolVar(&c.Lock, "mlock", false, "lock the regions in RAM (mlock): they then take their full size at once, and a refusal (ulimit -l) fails the run")
	fs.DurationVar(&c.ProgressEvery, "progress-every", 2*time.Second, "how often to report how far along a fetch run (or a producer's fill) is; 0: never")
	fs.StringVar(&c.Metrics, "metrics", "", "serve Prometheus metrics at http://ADDR/metrics, e.g. :9100")
	fs.StringVar(&c.Data, "data", "shm", "data plane: shm (pure Go: same-host copies out of the producer's shared region, TCP otherwise), tcp (pure Go, TCP only) or nixl (a build with -tags nixl)")
	fs.StringVar(&c.NIXLParams, "nixl-params", "", "NIXL backend parameters, k=v,k=v (UCX shared memory needs ucx_error_handling_mode=none)")
	fs.StringVar(&c.NIXLProgress, "nixl-progress", "goroutine", "who drives NIXL agents: goroutine, thread or caller")
	fs.StringVar(&c.NIXLPost, "nixl-post", "auto", "NIXL with -nixl-progress goroutine, where READs are posted: auto (in the step when no call into NIXL is under way and the READ is at most 256 KiB, else by the progress goroutine), sync (in the step, waiting for NIXL) or async (always by the goroutine)")
	fs.BoolFunc("nixl-async-post", "the same as -nixl-post async (an earlier name)", func(v string) error {
		on, err := strconv.ParseBool(v)
		if on {
			c.NIXLPost = "async"
		}
		return err
	})
	fs.BoolVar(&c.NoPush, "no-push", false, "TCP plane between processes that share no memory: producers send an entry's blocks only when a READ asks, not with the ack")
}

// Args returns the flags that give another process this shape.
func (c Config) Args() []string {
	return []string{"-items", fmt.Sprint(c.Items), "-blocks-per-item", fmt.Sprint(c.BlocksPerItem),
		"-block-size", fmt.Sprint(c.BlockSize), "-concurrency", fmt.Sprint(c.Concurrency), "-inflight-bytes", fmt.Sprint(int64(cmp.Or(c.InflightBytes, DefaultInflightBytes))),
		fmt.Sprintf("-mlock=%v", c.Lock), "-progress-every", c.ProgressEvery.String(), "-rate", fmt.Sprint(c.Rate), "-warmup", c.Warmup.String(),
		"-fetches", fmt.Sprint(c.Fetches), "-data", c.Data, "-nixl-params", c.NIXLParams,
		"-nixl-progress", c.NIXLProgress, "-nixl-post", c.NIXLPost, fmt.Sprintf("-no-push=%v", c.NoPush)}
}

// Check reports a shape that cannot run, in one line naming the flag.
func (c Config) Check(concurrency bool) error {
	for _, f := range []struct {
		name string
		v    int
	}{{"items", c.Items}, {"blocks-per-item", c.BlocksPerItem}, {"block-size", c.BlockSize}, {"concurrency", map[bool]int{true: c.Concurrency, false: 1}[concurrency]}} {
		if f.v <= 0 {
			return fmt.Errorf("-%s %d: want a positive number", f.name, f.v)
		}
	}
	switch {
	case c.Fetches < 0:
		return fmt.Errorf("-fetches %d: want 0 (one per item) or more", c.Fetches)
	case c.Rate < 0:
		return fmt.Errorf("-rate %v: want 0 (closed loop) or more", c.Rate)
	case c.Warmup < 0:
		return fmt.Errorf("-warmup %v: want 0 or more", c.Warmup)
	case c.ProgressEvery < 0:
		return fmt.Errorf("-progress-every %v: want 0 (never) or more", c.ProgressEvery)
	case c.InflightBytes < 0:
		return fmt.Errorf("-inflight-bytes %d: want a positive size such as 1GiB", c.InflightBytes)
	case c.ItemBytes() < 0 || c.Items > (1<<62)/(c.BlocksPerItem):
		return fmt.Errorf("-blocks-per-item %d of -block-size %d: too large a region", c.BlocksPerItem, c.BlockSize)
	}
	if concurrency {
		if _, err := c.InFlight(); err != nil {
			return err
		}
	}
	if c.Data != "" && c.Data != "shm" && c.Data != "tcp" && c.Data != "nixl" {
		return fmt.Errorf("-data %q: want shm, tcp or nixl", c.Data)
	}
	_, err := c.nixlConfig("x")
	return err
}

func (c Config) nixlConfig(name string) (nixl.Config, error) {
	nc := nixl.Config{Name: name, Params: map[string]string{}}
	switch c.NIXLPost {
	case "", "auto":
	case "sync":
		nc.SyncPost = true
	case "async":
		nc.InlinePost = -1
	default:
		return nc, fmt.Errorf("-nixl-post %q: want auto, sync or async", c.NIXLPost)
	}
	for _, kv := range strings.Split(c.NIXLParams, ",") {
		if kv == "" {
			continue
		}
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return nc, fmt.Errorf("-nixl-params: %q is not k=v", kv)
		}
		nc.Params[k] = v
	}
	switch c.NIXLProgress {
	case "", "goroutine":
		nc.Progress = nixl.ProgressGoroutine
	case "thread":
		nc.Progress = nixl.ProgressThread
	case "caller":
		nc.Progress = nixl.ProgressCaller
	default:
		return nc, fmt.Errorf("-nixl-progress %q: want goroutine, thread or caller", c.NIXLProgress)
	}
	return nc, nil
}

// dataPlane makes cfg's data plane over region; listen is the TCP plane's
// address to serve on ("" for a consumer). addr is what it serves on, if
// anything.
// DataPlane makes a consumer's data plane of the configured kind over
// region (no listener).
func (c Config) DataPlane(region *cache.Region, log *slog.Logger) (xfer.DataTransport, error) {
	d, _, err := c.dataPlane("probe", "", region, log)
	return d, err
}

func (c Config) dataPlane(role, listen string, region *cache.Region, log *slog.Logger) (d xfer.DataTransport, addr string, err error) {
	// Agent names must be unique among peers: two producers with one name
	// would be taken for one.
	name := "demo-" + role + "-" + uuid.NewString()
	if c.Data == "nixl" {
		nc, err := c.nixlConfig(name)
		if err != nil {
			return nil, "", err
		}
		a, err := nixl.New(nc, region)
		if err != nil {
			return nil, "", err
		}
		return a, "nixl:" + name, nil
	}
	t, err := transport.NewTCPData(transport.TCPConfig{Name: name, Listen: listen, Logger: log,
		NoSharedMemory: c.Data == "tcp", NoPush: c.NoPush, PushBuffer: map[bool]int{true: -1}[c.NoPush]}, region)
	if err != nil {
		return nil, "", err
	}
	if listen == "" {
		return t, "", nil
	}
	return t, t.Addr().String(), nil
}

// CompatHash is the compatibility hash both sides compute for cfg.
func (c Config) CompatHash() string {
	return wire.CompatHash("ecxfer-demo", "demo/model", "torch.bfloat16", c.BlockSize)
}

// regionError names -mlock in a region's error when it was given: a
// refused lock is undone by leaving it out.
func (c Config) regionError(err error) error {
	if c.Lock {
		return fmt.Errorf("-mlock: %w", err)
	}
	return err
}

// Hash is item i's mm_hash.
func Hash(i int) string {
	s := sha256.Sum256(fmt.Appendf(nil, "ecxfer demo item %d", i))
	return hex.EncodeToString(s[:])
}

// Fill writes the content of block j of item i into b.
func Fill(b []byte, item, j int) { fillFrom(b, seed(item, j)) }

func seed(item, j int) uint64 { return (uint64(item)<<20|uint64(j))*0x9e3779b97f4a7c15 + 1 }

// fillFrom writes the content that follows state x into b, 8 bytes at a
// time (a shorter tail is left as it is), and returns the state after it:
// a block can be made a piece at a time.
func fillFrom(b []byte, x uint64) uint64 {
	for k := 0; k+8 <= len(b); k += 8 {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		binary.LittleEndian.PutUint64(b[k:], x)
	}
	return x
}

// pacer says when a progress line is due: every `every` (0: never).
type pacer struct {
	every time.Duration
	next  time.Time
}

func newPacer(start time.Time, every time.Duration) pacer { return pacer{every, start.Add(every)} }

func (p *pacer) due(now time.Time) bool {
	if p.every <= 0 || now.Before(p.next) {
		return false
	}
	p.next = now.Add(p.every)
	return true
}

// until is the wait for the next line, -1 when there is none.
func (p *pacer) until(now time.Time) time.Duration {
	if p.every <= 0 {
		return -1
	}
	return max(0, p.next.Sub(now))
}

// progressLine says how far along a consumer's run is: of fetches, when
// it is not timed.
func progressLine(w io.Writer, verified, fetches int, timed bool, bytes, item int64, inFlight int, elapsed time.Duration) {
	if timed {
		fmt.Fprintf(w, "  %d verified (%s), %d in flight, %.1fs\n", verified, FormatBytes(bytes), inFlight, elapsed.Seconds())
		return
	}
	fmt.Fprintf(w, "  %d of %d verified (%s of %s), %d in flight (%s), %.1fs\n", verified, fetches,
		FormatBytes(bytes), FormatBytes(int64(fetches)*item), inFlight, FormatBytes(int64(inFlight)*item), elapsed.Seconds())
}

// Producer is a running demo producer.
type Producer struct {
	Control string // "tcp://host:port" consumers connect to
	Data    string // the data plane's address ("nixl:<agent>" for NIXL)
	metrics *http.Server
	srv     *transport.Server
	data    xfer.DataTransport
	region  *cache.Region
	prod    *connector.Producer
	cancel  context.CancelFunc
	done    chan struct{}
}

// StartProducer fills a region with cfg.Items entries and serves them on
// controlAddr and dataAddr ("host:port"; port 0 picks one).
func StartProducer(cfg Config, controlAddr, dataAddr string, log *slog.Logger) (*Producer, error) {
	blocks := cfg.Items * cfg.BlocksPerItem
	// Shared: a same-host consumer copies straight out of it (-data shm).
	region, err := cache.NewRegion(cache.RegionConfig{Blocks: blocks, BlockSize: cfg.BlockSize,
		Shared: cfg.Data == "" || cfg.Data == "shm", NoLock: !cfg.Lock, RequireLock: cfg.Lock})
	if err != nil {
		return nil, cfg.regionError(err)
	}
	c := cache.NewEmbeddingCache(blocks)
	total := int64(blocks) * int64(cfg.BlockSize)
	report := newPacer(time.Now(), cfg.ProgressEvery)
	var filled int64
	for i := range cfg.Items {
		e, err := c.Alloc(Hash(i), cfg.BlocksPerItem)
		if err != nil {
			region.Close()
			return nil, err
		}
		for j, b := range e.Blocks {
			// A piece at a time, so that a large block's fill reports too.
			blk, x := region.Block(b), seed(i, j)
			for off := 0; off < len(blk); off += sumChunk {
				x = fillFrom(blk[off:min(off+sumChunk, len(blk))], x)
				filled += int64(min(sumChunk, len(blk)-off))
				if cfg.Progress != nil && report.due(time.Now()) {
					fmt.Fprintf(cfg.Progress, "  producer: filled %s of %s\n", FormatBytes(filled), FormatBytes(total))
				}
			}
		}
		c.MarkReady(Hash(i))
	}
	data, addr, err := cfg.dataPlane("producer", dataAddr, region, log)
	if err != nil {
		region.Close()
		return nil, err
	}
	srv, err := transport.Listen(controlAddr, transport.ServerConfig{Logger: log})
	if err != nil {
		data.Close()
		region.Close()
		return nil, err
	}
	p := &Producer{Control: srv.Endpoint(), Data: addr, srv: srv, data: data, region: region, done: make(chan struct{})}
	// The whole cache may be pinned: nothing is saved into it while it
	// serves, and a consumer with a few large items in flight would
	// otherwise be refused past half of it until its earlier READs end.
	p.prod, err = connector.NewProducer(connector.ProducerConfig{CompatHash: cfg.CompatHash(), Logger: log, MaxPinnedShare: 1}, srv, data, c)
	if err != nil {
		srv.Close()
		data.Close()
		region.Close()
		return nil, err
	}
	if cfg.Metrics != "" {
		if p.metrics, err = serveMetrics(cfg.Metrics, metrics.NewProducerCollector(p.prod, nil)); err != nil {
			p.prod.Close()
			srv.Close()
			data.Close()
			region.Close()
			return nil, err
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	p.cancel = cancel
	go func() {
		defer close(p.done)
		p.prod.Serve(ctx)
	}()
	return p, nil
}

// Collector returns the producer's metrics collector.
func (p *Producer) Collector() prometheus.Collector { return metrics.NewProducerCollector(p.prod, nil) }

// Stats returns the producer session's counters.
func (p *Producer) Stats() string {
	s := p.prod.Stats()
	return fmt.Sprintf("requests %d, grants %d, completions %d, NACKs: %v, lease expiries %d, malformed %d",
		s.Requests, s.Grants, s.Completions, s.Nacks, s.Expired, s.Malformed)
}

// Shutdown stops granting and waits, while Serve goes on, for the live
// grants to end: a consumer's last notifications may still be on their
// way when its run ends, and counters read before them would miss them.
// If ctx ends first, the grants left are ended and the error says how
// many.
func (p *Producer) Shutdown(ctx context.Context) error { return p.prod.Shutdown(ctx) }

// Close stops serving and frees everything.
func (p *Producer) Close() {
	p.cancel()
	<-p.done
	if p.metrics != nil {
		p.metrics.Close()
	}
	p.prod.Close()
	p.srv.Close()
	p.data.Close()
	p.region.Close()
}

// Summary is what a consumer run measured.
type Summary struct {
	Verified int
	Failed   int
	Elapsed  time.Duration
	// Start is when the first fetch was asked for: after the region, the
	// data plane and the pool were set up (a NIXL agent takes
	// milliseconds), which Elapsed leaves out.
	Start    time.Time
	Bytes    uint64
	P50, P99 time.Duration
	// MaxInFlight is the most fetches that were in flight at once.
	MaxInFlight int
	Stats       connector.PoolStats
	FailedWhy   map[string]int
	// Quarantined counts blocks given back forced (a READ not confirmed
	// stopped): kept out of use for the rest of the run.
	Quarantined int
	// Steal is the CPU time the hypervisor took from this machine's CPUs
	// during the run, all CPUs together (-1: unknown). On a shared VM a
	// latency tail comes with it: a CPU taken for 10 ms holds whatever ran
	// on it.
	Steal time.Duration
}

// Print writes the summary for a person.
func (s Summary) Print(w io.Writer) {
	secs := s.Elapsed.Seconds()
	fmt.Fprintf(w, "verified %d transfers (%d failed) in %.2fs\n", s.Verified, s.Failed, secs)
	if secs > 0 && s.Verified > 0 { // else there is no rate to speak of
		fmt.Fprintf(w, "  %.0f transfers/s, %.2f GB/s\n", float64(s.Verified)/secs, float64(s.Bytes)/secs/1e9)
		fmt.Fprintf(w, "  request-to-completed latency p50 %v, p99 %v\n", s.P50.Round(time.Microsecond), s.P99.Round(time.Microsecond))
	}
	fmt.Fprintf(w, "  NACKs: %v; retries %d; ack timeouts %d; quarantines %d; peer deaths %d\n",
		s.Stats.Nacks, s.Stats.Retries, s.Stats.AckTimeouts, s.Stats.Quarantines, s.Stats.PeerDeaths)
	if s.Steal >= 0 {
		fmt.Fprintf(w, "  CPU time the hypervisor took from this machine meanwhile (steal): %v\n", s.Steal)
	}
	if len(s.FailedWhy) > 0 {
		var why []string
		for _, r := range slices.Sorted(maps.Keys(s.FailedWhy)) {
			why = append(why, fmt.Sprintf("%s %d", r, s.FailedWhy[r]))
		}
		fmt.Fprintf(w, "  failures by reason: %s\n", strings.Join(why, ", "))
	}
}

// RunConsumer fetches every item from the producer at control (cfg.Fetches
// fetches in all, cycling over the items) and verifies every block by content,
// printing progress to progress (nil: none).
func RunConsumer(ctx context.Context, cfg Config, control string, progress io.Writer, log *slog.Logger) (Summary, error) {
	return consume(ctx, cfg, []string{control}, 0, progress, nil, log)
}

// consume fetches items from producers (item i from producers[i % n]):
// cfg.Fetches fetches in all, or asks for fetches for d after its set-up
// when d is set (the set-up's time, under load, is not the run's), and
// verifies every block by content (see sums). Progress goes to progress (nil: none) and each
// completed fetch to live (nil: none).
func consume(ctx context.Context, cfg Config, producers []string, d time.Duration, progress io.Writer, live *Live, log *slog.Logger) (Summary, error) {
	inFlight, err := cfg.InFlight()
	if err != nil {
		return Summary{}, err
	}
	region, err := cache.NewRegion(cache.RegionConfig{Blocks: inFlight * cfg.BlocksPerItem, BlockSize: cfg.BlockSize,
		NoLock: !cfg.Lock, RequireLock: cfg.Lock})
	if err != nil {
		return Summary{}, cfg.regionError(err)
	}
	defer region.Close()
	// Touched before the clock starts, as mlock would: the first fetches
	// would otherwise pay the region's page faults.
	touch := newPacer(time.Now(), cfg.ProgressEvery)
	page, mem := os.Getpagesize(), region.Bytes()
	for off := 0; off < len(mem); off += page {
		mem[off] = 0
		if progress != nil && off%sumChunk == 0 && touch.due(time.Now()) {
			fmt.Fprintf(progress, "  consumer: touched %s of its %s region\n", FormatBytes(int64(off)), FormatBytes(int64(len(mem))))
		}
	}
	data, _, err := cfg.dataPlane("consumer", "", region, log)
	if err != nil {
		return Summary{}, err
	}
	defer data.Close()
	ctl := transport.NewClient(transport.ClientConfig{Logger: log})
	defer ctl.Close()
	pool, err := connector.NewPool(connector.PoolConfig{CompatHash: cfg.CompatHash(), BlockSize: cfg.BlockSize, Logger: log}, ctl, data)
	if err != nil {
		return Summary{}, err
	}
	if live != nil {
		live.watch(pool)
	}
	if cfg.Metrics != "" {
		ms, err := serveMetrics(cfg.Metrics, append(cfg.MetricsAlso, metrics.NewPoolCollector(pool, nil))...)
		if err != nil {
			return Summary{}, err
		}
		defer ms.Close()
	}

	free := make([]int, region.Blocks())
	for i := range free {
		free[i] = len(free) - 1 - i
	}
	want := expected(cfg, progress)
	hashes := make([]string, cfg.Items)
	for i := range hashes {
		hashes[i] = Hash(i)
	}
	// Connected before the clock starts (the control connection and the
	// data plane's contact), as an engine connects to the producers it
	// knows of at start-up.
	for _, addr := range producers {
		if err := pool.Connect(ctx, addr); err != nil {
			return Summary{}, fmt.Errorf("connect to %s: %w", addr, err)
		}
	}
	// The set-up's garbage (the producer's fill, the sums) is collected
	// before the clock starts, as testing.B does before a benchmark.
	runtime.GC()
	item := map[string]int{} // mm_hash -> item in flight
	sum := Summary{FailedWhy: map[string]int{}, Steal: -1}
	var lat latencies
	next := 0
	steal0, stealOK := steal.Machine()
	start := time.Now()
	report := newPacer(start, cfg.ProgressEvery)
	if progress == nil {
		report = newPacer(start, 0)
	}
	var verifiedBytes int64
	fetches := cfg.Fetches
	if fetches == 0 {
		fetches = cfg.Items
	}
	var interval time.Duration // open loop: one falls due each interval
	if cfg.Rate > 0 {
		interval = max(time.Duration(float64(time.Second)/cfg.Rate), 1)
	}
	due := start
	dueOf := map[string]time.Time{}
	timed, stopAt := d > 0, start.Add(d)
	more := func(now time.Time) bool {
		if timed {
			return now.Before(stopAt)
		}
		return next < fetches
	}
	for {
		if err := ctx.Err(); err != nil {
			pool.Close()
			return sum, err
		}
		now := time.Now()
		if !more(now) && len(item) == 0 {
			break
		}
		for more(now) && (interval == 0 || !now.Before(due)) && len(item) < inFlight && len(free) >= cfg.BlocksPerItem {
			i := next % cfg.Items
			h := hashes[i]
			if _, busy := item[h]; busy {
				break // its previous fetch is still in flight
			}
			blocks := slices.Clone(free[len(free)-cfg.BlocksPerItem:])
			slices.Sort(blocks)
			if _, err := pool.Fetch(producers[i%len(producers)], h, blocks, now.Add(30*time.Second), now); err != nil {
				return sum, fmt.Errorf("fetch item %d: %w", i, err)
			}
			free = free[:len(free)-cfg.BlocksPerItem]
			item[h] = i
			sum.MaxInFlight = max(sum.MaxInFlight, len(item))
			next++
			if interval > 0 {
				dueOf[h] = due
				due = due.Add(interval)
			}
		}
		r := pool.Step(now)
		for _, d := range r.Completed {
			i := item[d.MMHash]
			delete(item, d.MMHash)
			for j, b := range d.Blocks {
				if !want.ok(region.Block(b), i, j) {
					pool.Close()
					return sum, fmt.Errorf("item %d block %d: bytes differ", i, j)
				}
			}
			sum.Verified++
			verifiedBytes += int64(len(d.Blocks)) * int64(cfg.BlockSize)
			l := d.Latency
			if t, ok := dueOf[d.MMHash]; ok {
				l = now.Sub(t)
				delete(dueOf, d.MMHash)
			}
			if now.Add(-l).Sub(start) >= cfg.Warmup {
				lat.add(l)
			}
			if live != nil {
				live.completed(l, uint64(len(d.Blocks)*cfg.BlockSize))
			}
			free = append(free, d.Blocks...)
		}
		for _, f := range r.Failed {
			delete(item, f.MMHash)
			delete(dueOf, f.MMHash)
			sum.Failed++
			sum.FailedWhy[f.Reason.String()]++
			if live != nil {
				live.failed()
			}
			if !f.BlocksHeld {
				free = append(free, f.Blocks...)
			}
		}
		for _, rel := range r.Released {
			if rel.Forced {
				// Nothing confirmed the READ stopped: its blocks may still
				// be written. Keep them out of use.
				sum.Quarantined += len(rel.Blocks)
				continue
			}
			free = append(free, rel.Blocks...)
		}
		if report.due(now) {
			progressLine(progress, sum.Verified, fetches, timed, verifiedBytes, cfg.ItemBytes(), len(item), now.Sub(start))
		}
		switch {
		case interval > 0 && more(now):
			// Until the next one falls due, or something ends first.
			wait := max(0, time.Until(due))
			if u := report.until(now); u >= 0 {
				wait = min(wait, u)
			}
			pool.WaitFor(ctx, wait)
		case len(item) > 0:
			// Until a reply, a READ's end, a retry or the next report.
			pool.WaitFor(ctx, report.until(now))
		}
	}
	sum.Start, sum.Elapsed = start, time.Since(start)
	if steal1, ok := steal.Machine(); ok && stealOK {
		sum.Steal = steal1 - steal0
	}
	sum.Stats = pool.Stats()
	sum.Bytes = sum.Stats.BytesMoved
	sum.P50, sum.P99 = lat.quantile(0.5), lat.quantile(0.99)
	pool.Close()
	if sum.Failed > 0 {
		return sum, errors.New("some fetches failed")
	}
	return sum, nil
}

// serveMetrics serves the collectors, and the Go runtime's metrics, at
// http://addr/metrics.
func serveMetrics(addr string, cs ...prometheus.Collector) (*http.Server, error) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	reg.MustRegister(cs...)
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	hs := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go hs.Serve(ln)
	return hs, nil
}
