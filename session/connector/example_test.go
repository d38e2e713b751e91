package connector_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/ecxfer/ecxfer/cache"
	"github.com/ecxfer/ecxfer/session/connector"
	"github.com/ecxfer/ecxfer/transport"
	"github.com/ecxfer/ecxfer/wire"
)

var logger = slog.New(slog.NewTextHandler(io.Discard, nil))

// compat is both sides' compatibility hash.
var compat = wire.CompatHash("0.11.0", "Qwen/Qwen2.5-VL-7B-Instruct", "torch.bfloat16", 4096)

// startProducer serves one embedding, "img-1", of two 4 KiB blocks filled
// with 'x', and returns its control endpoint.
func startProducer(ctx context.Context) string {
	region, _ := cache.NewRegion(cache.RegionConfig{Blocks: 64, BlockSize: 4096})
	entries := cache.NewEmbeddingCache(region.Blocks())
	e, _ := entries.Alloc("img-1", 2)
	for _, b := range e.Blocks {
		copy(region.Block(b), bytes.Repeat([]byte("x"), 4096))
	}
	entries.MarkReady("img-1")
	data, _ := transport.NewTCPData(transport.TCPConfig{Listen: "127.0.0.1:0", Logger: logger}, region)
	ctl, _ := transport.Listen("tcp://127.0.0.1:0", transport.ServerConfig{Logger: logger})
	p := must(connector.NewProducer(connector.ProducerConfig{CompatHash: compat, Logger: logger}, ctl, data, entries))
	go func() {
		p.Serve(ctx, nil)
		p.Close()
		ctl.Close()
		data.Close()
		region.Close()
	}()
	return ctl.Endpoint()
}

// A producer loop: an engine that steps calls Step once per step; this one
// does not step while idle, so it runs Serve in the background instead.
func ExampleProducer() {
	region, _ := cache.NewRegion(cache.RegionConfig{Blocks: 64, BlockSize: 4096})
	defer region.Close()
	entries := cache.NewEmbeddingCache(region.Blocks())
	data, _ := transport.NewTCPData(transport.TCPConfig{Listen: "127.0.0.1:0", Logger: logger}, region)
	defer data.Close()
	ctl, _ := transport.Listen("tcp://127.0.0.1:0", transport.ServerConfig{Logger: logger})
	defer ctl.Close()
	p := must(connector.NewProducer(connector.ProducerConfig{CompatHash: compat, Logger: logger}, ctl, data, entries))

	// The encoder saves an embedding: allocate, write, mark ready.
	e, _ := entries.Alloc("img-1", 2)
	for _, b := range e.Blocks {
		copy(region.Block(b), "embedding bytes")
	}
	entries.MarkReady("img-1")

	// The engine's step loop.
	for range 3 {
		p.Step(time.Now())
	}
	fmt.Println("grants held:", p.Grants())
	fmt.Println("pins released at close:", p.Close())
	// Output:
	// grants held: 0
	// pins released at close: 0
}

// A consumer loop: fetch an embedding into local blocks, then step until
// the pool reports it.
func ExamplePool() {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	producer := startProducer(ctx)

	region, _ := cache.NewRegion(cache.RegionConfig{Blocks: 16, BlockSize: 4096})
	defer region.Close()
	data, _ := transport.NewTCPData(transport.TCPConfig{Logger: logger}, region)
	defer data.Close()
	ctl := transport.NewClient(transport.ClientConfig{Logger: logger})
	defer ctl.Close()
	pool := must(connector.NewPool(connector.PoolConfig{CompatHash: compat, BlockSize: 4096, Logger: logger}, ctl, data))
	defer pool.Close()

	now := time.Now()
	pool.Fetch(producer, "img-1", []int{3, 4}, now.Add(10*time.Second), now)
	for pool.InFlight() > 0 {
		r := pool.Step(time.Now())
		for _, d := range r.Completed {
			ok := bytes.Equal(region.Block(d.Blocks[0]), bytes.Repeat([]byte("x"), 4096))
			fmt.Println("completed", d.MMHash, "into blocks", d.Blocks, "bytes match:", ok)
		}
		for _, f := range r.Failed {
			fmt.Println("failed", f.MMHash, f.Reason, f.Status) // fall back to encoding locally
		}
		wait, stop := context.WithTimeout(ctx, time.Millisecond)
		ctl.Wait(wait) // or the engine's next step
		stop()
	}
	// Output:
	// completed img-1 into blocks [3 4] bytes match: true
}
