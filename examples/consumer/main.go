// Command consumer fetches every embedding from a running examples/producer
// (the same -items, -blocks-per-item and -block-size), as many at a time as
// -inflight-bytes holds (at most -concurrency), checks every byte, and
// prints a summary. It exits non-zero if any
// fetch failed; at once, saying why, when the producer's data plane is not
// its own (a TCP consumer against a NIXL producer, say).
//
// It is written against the library's public API only (its flag helpers are
// the examples' own, examples/internal/cli): a region for the blocks
// fetched and the cache that gives them out (cache), a control plane and a
// data plane (transport, nixl), and the Pool that fetches into that cache
// (session/connector, FetchEntry), driven by the loop an engine would run.
// Each fetch has -deadline to complete, whatever it waits for: after it,
// the engine would encode the item itself.
package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"time"

	"github.com/ecxfer/ecxfer/cache"
	"github.com/ecxfer/ecxfer/examples/internal/cli"
	"github.com/ecxfer/ecxfer/nixl"
	"github.com/ecxfer/ecxfer/session/connector"
	"github.com/ecxfer/ecxfer/transport"
	"github.com/ecxfer/ecxfer/wire"
	"github.com/ecxfer/ecxfer/xfer"
)

func main() {
	producer := flag.String("producer", "tcp://127.0.0.1:5555", "the producer's control endpoint")
	plane := flag.String("data", "shm", "data plane: shm (TCP, with same-host copies), tcp (TCP only) or nixl (a build with -tags nixl); the producer's")
	items := flag.Int("items", 1000, "embeddings")
	perItem := flag.Int("blocks-per-item", 16, "blocks per embedding")
	blockSize := flag.Int("block-size", 8192, "bytes per block")
	concurrency := flag.Int("concurrency", 64, "fetches in flight at most (fewer when -inflight-bytes holds fewer items)")
	budget := cli.Size(1 << 30)
	flag.Var(&budget, "inflight-bytes", "bytes in flight, and so the size of the region fetched into: as many fetches as whole items fit, at most -concurrency (K, M, G or T: 256M, 1GiB)")
	lock := flag.Bool("mlock", false, "lock the region in RAM (mlock): a refusal (ulimit -l) fails the start")
	every := flag.Duration("progress-every", 2*time.Second, "how often to report how far along the fetches are; 0: never")
	deadline := flag.Duration("deadline", 30*time.Second, "how long each fetch may take, from its start: past it, it fails (an engine would encode the item itself)")
	cli.ParseFlags("consumer")
	item := cli.ItemBytes(*perItem, *blockSize)
	err := cli.Positive([]string{"items", "blocks-per-item", "block-size", "concurrency"}, *items, *perItem, *blockSize, *concurrency)
	switch {
	case err != nil:
	case *plane != "shm" && *plane != "tcp" && *plane != "nixl":
		err = fmt.Errorf("-data %q: want shm, tcp or nixl", *plane)
	case *every < 0:
		err = fmt.Errorf("-progress-every %v: want 0 (never) or more", *every)
	case *deadline <= 0:
		err = fmt.Errorf("-deadline %v: want more than 0", *deadline)
	case item < 0 || item > int64(budget):
		err = fmt.Errorf("-inflight-bytes %v holds no item of %d blocks of %s: give -inflight-bytes %s or more, or a smaller -block-size or -blocks-per-item",
			budget, *perItem, cli.FormatSize(int64(*blockSize)), cli.FormatSize(item))
	}
	if err == nil {
		err = cli.Endpoint("producer", *producer, false)
	}
	var inFlight int
	if err == nil {
		inFlight = int(min(int64(budget)/item, int64(*concurrency), int64(*items))) // an item is fetched once
		err = cli.CheckMemory(int64(inFlight)*item, "-inflight-bytes")
	}
	if err != nil {
		cli.Usage("consumer", err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, *producer, *plane, *items, *perItem, *blockSize, inFlight, *lock, *every, *deadline); err != nil {
		fmt.Fprintln(os.Stderr, "consumer:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, producer, plane string, items, perItem, blockSize, inFlight int, lock bool, every, deadline time.Duration) error {
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	// The region holds the items in flight. Unlocked by default: locking
	// takes the whole region at once, and a refusal names the limit
	// (ulimit -l).
	region, err := cache.NewRegion(cache.RegionConfig{Blocks: inFlight * perItem, BlockSize: blockSize, NoLock: !lock, RequireLock: lock})
	if err != nil {
		if lock { // a refused lock is undone by leaving -mlock out
			err = fmt.Errorf("-mlock: %w", err)
		}
		return err
	}
	defer region.Close()
	fmt.Printf("fetching %d items of %s, %d in flight (a %s region)\n", items, cli.FormatSize(int64(perItem*blockSize)), inFlight, cli.FormatSize(int64(len(region.Bytes()))))
	var data xfer.DataTransport
	switch plane {
	case "shm", "tcp":
		data, err = transport.NewTCPData(transport.TCPConfig{NoSharedMemory: plane == "tcp", Logger: log}, region)
	case "nixl":
		data, err = nixl.New(nixl.Config{Name: fmt.Sprintf("consumer-%d", os.Getpid()), Params: nixlParams}, region)
	default:
		err = fmt.Errorf("-data %q: want shm, tcp or nixl", plane)
	}
	if err != nil {
		return err
	}
	defer data.Close()
	ctl := transport.NewClient(transport.ClientConfig{Logger: log})
	defer ctl.Close()
	// The cache gives out the region's blocks: the Pool allocates each
	// fetch's, and hands a landed entry over held until we let it go.
	entries := cache.NewEmbeddingCache(region.Blocks())
	pool, err := connector.NewPool(connector.PoolConfig{CompatHash: CompatHash(blockSize), BlockSize: blockSize, Logger: log, Cache: entries}, ctl, data)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := pool.Connect(ctx, producer); err != nil { // optional: the first fetch would connect
		return explain(producer, plane, err)
	}

	item := map[string]int{} // mm_hash -> item, in flight
	want := make([]byte, blockSize)
	var verified, failed, next int
	start := time.Now()
	report := start.Add(every)
	for next < items || len(item) > 0 {
		now := time.Now()
		for ; next < items && len(item) < inFlight; next++ {
			_, err := pool.FetchEntry(producer, Hash(next), perItem*blockSize, now.Add(deadline), now)
			if errors.Is(err, cache.ErrNoSpace) {
				break // blocks whose READ may still write are not back yet
			}
			if err != nil {
				return fmt.Errorf("fetch item %d: %w", next, err)
			}
			item[Hash(next)] = next
		}
		wait := time.Duration(-1) // until something happens
		if every > 0 {
			wait = max(0, time.Until(report))
		}
		if len(item) == 0 { // nothing in flight: blocks held by READs that may still write come back in a Step
			wait = 10 * time.Millisecond
		}
		if !pool.WaitFor(ctx, wait) {
			return ctx.Err()
		}
		if now := time.Now(); every > 0 && !now.Before(report) {
			report = now.Add(every)
			fmt.Printf("  %d of %d verified (%s of %s), %d in flight, %.1fs\n", verified, items,
				cli.FormatSize(int64(verified)*int64(perItem*blockSize)), cli.FormatSize(int64(items)*int64(perItem*blockSize)), len(item), now.Sub(start).Seconds())
		}
		r := pool.Step(time.Now())
		for _, d := range r.Completed {
			for j, b := range d.Blocks {
				if Fill(want, item[d.MMHash], j); !bytes.Equal(region.Block(b), want) {
					return fmt.Errorf("item %d, block %d: the bytes differ from the producer's", item[d.MMHash], j)
				}
			}
			verified++
			delete(item, d.MMHash)
			// Done with it: let it go, and drop it, as an engine that
			// serves no one would; the blocks are free again.
			if err := errors.Join(entries.Unpin(d.MMHash), entries.Remove(d.MMHash)); err != nil {
				return err
			}
		}
		for _, f := range r.Failed {
			if errors.Is(f.Err, xfer.RegisterFailed) || errors.Is(f.Err, wire.NackIncompat) {
				return explain(producer, plane, f.Err) // every fetch would fail alike
			}
			fmt.Fprintln(os.Stderr, "consumer:", f.Err) // an engine would encode the item itself
			failed++
			delete(item, f.MMHash) // the Pool gives its blocks back to the cache
		}
	}
	summary(verified, failed, time.Since(start), pool.Stats())
	if failed > 0 {
		return fmt.Errorf("%d of %d fetches failed", failed, items)
	}
	return nil
}

// explain says in words what a failure to reach the producer means.
func explain(producer, plane string, err error) error {
	switch {
	case errors.Is(err, xfer.RegisterFailed):
		return fmt.Errorf("the producer at %s is not on this consumer's data plane (-data %s): give both the same -data\n  %w", producer, plane, err)
	case errors.Is(err, wire.NackIncompat):
		return fmt.Errorf("the producer at %s serves another model or block size: give both the same -block-size\n  %w", producer, err)
	}
	return fmt.Errorf("producer %s: %w", producer, err)
}

func summary(verified, failed int, took time.Duration, s connector.PoolStats) {
	fmt.Printf("verified %d transfers (%d failed) in %.2fs\n", verified, failed, took.Seconds())
	if secs := took.Seconds(); secs > 0 && verified > 0 {
		fmt.Printf("  %.0f transfers/s, %.3f GB/s\n", float64(verified)/secs, float64(s.BytesMoved)/secs/1e9)
		fmt.Printf("  latency from Fetch to completion: p50 %v, p99 %v\n", s.Latency.Quantile(0.5), s.Latency.Quantile(0.99))
	}
	fmt.Printf("  NACKs: %v; retries: %d; ack timeouts: %d; quarantined READs: %d\n", s.Nacks, s.Retries, s.AckTimeouts, s.Quarantines)
	fmt.Printf("  failures by reason: %v\n", s.FailedBy)
}

var nixlParams cli.Params

func init() {
	flag.Var(&nixlParams, "nixl-params", "NIXL backend parameters, `key=value[,key=value]` (-data nixl), e.g. ucx_error_handling_mode=none for UCX_TLS=sm")
}
