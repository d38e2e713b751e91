package connector_test

import (
	"bytes"
	"context"
	"errors"
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

// producerDemo serves one embedding, "img-1", of two 4 KiB blocks filled
// with 'x', until ctx ends; it returns the control endpoint.
func producerDemo(ctx context.Context) (string, error) {
	region, err := cache.NewRegion(cache.RegionConfig{Blocks: 64, BlockSize: 4096})
	if err != nil {
		return "", err
	}
	entries := cache.NewEmbeddingCache(region.Blocks())
	e, err := entries.Alloc("img-1", 2)
	if err != nil {
		return "", err
	}
	for _, b := range e.Blocks {
		copy(region.Block(b), bytes.Repeat([]byte("x"), 4096))
	}
	if err := entries.MarkReady("img-1"); err != nil {
		return "", err
	}
	data, err := transport.NewTCPData(transport.TCPConfig{Listen: "127.0.0.1:0", Logger: logger}, region)
	if err != nil {
		return "", err
	}
	ctl, err := transport.Listen("tcp://127.0.0.1:0", transport.ServerConfig{Logger: logger})
	if err != nil {
		return "", err
	}
	p, err := connector.NewProducer(connector.ProducerConfig{CompatHash: compat, Logger: logger}, ctl, data, entries)
	if err != nil {
		return "", err
	}
	go func() {
		p.Serve(ctx)
		p.Close()
		ctl.Close()
		data.Close()
		region.Close()
	}()
	return ctl.Endpoint(), nil
}

// A consumer: fetch an embedding into local blocks, stepping until the
// pool reports it. An engine steps the pool from its own loop; Wait sleeps
// until there is work.
func ExamplePool() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	producer, err := producerDemo(ctx)
	if err != nil {
		fmt.Println(err)
		return
	}

	region, err := cache.NewRegion(cache.RegionConfig{Blocks: 16, BlockSize: 4096})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer region.Close()
	data, err := transport.NewTCPData(transport.TCPConfig{Logger: logger}, region)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer data.Close()
	ctl := transport.NewClient(transport.ClientConfig{Logger: logger})
	defer ctl.Close()
	pool, err := connector.NewPool(connector.PoolConfig{CompatHash: compat, BlockSize: 4096, Logger: logger}, ctl, data)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer pool.Close()

	now := time.Now()
	if _, err := pool.Fetch(producer, "img-1", []int{3, 4}, now.Add(5*time.Second), now); err != nil {
		fmt.Println(err) // nothing started: encode locally
		return
	}
	for pool.InFlight() > 0 && pool.Wait(ctx) {
		r := pool.Step(time.Now())
		for _, d := range r.Completed {
			ok := bytes.Equal(region.Block(d.Blocks[0]), bytes.Repeat([]byte("x"), 4096))
			fmt.Println("completed", d.MMHash, "into blocks", d.Blocks, "bytes match:", ok)
		}
		for _, f := range r.Failed {
			// Encode locally. If f.BlocksHeld, keep f.Blocks out of use
			// until they come back in a later r.Released.
			// f.Err says why, and matches f.Reason and the NACK's
			// status: errors.Is(f.Err, wire.NackMissing).
			fmt.Println("failed:", f.Err)
		}
	}
	// Output:
	// completed img-1 into blocks [3 4] bytes match: true
}

// A producer stepped by the engine's loop: the encoder saves embeddings
// into the cache; each step answers requests, takes completion
// notifications and ends expired grants; WaitFor sleeps until a step has
// work or the engine's next step is due. At the end, Shutdown stops
// granting and lets the READs under way finish.
func ExampleProducer() {
	region, err := cache.NewRegion(cache.RegionConfig{Blocks: 64, BlockSize: 4096})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer region.Close()
	entries := cache.NewEmbeddingCache(region.Blocks())
	data, err := transport.NewTCPData(transport.TCPConfig{Listen: "127.0.0.1:0", Logger: logger}, region)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer data.Close()
	ctl, err := transport.Listen("tcp://127.0.0.1:0", transport.ServerConfig{Logger: logger})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer ctl.Close()
	p, err := connector.NewProducer(connector.ProducerConfig{CompatHash: compat, Logger: logger}, ctl, data, entries)
	if err != nil {
		fmt.Println(err)
		return
	}

	// The encoder saves an embedding: allocate, write, mark ready.
	e, err := entries.Alloc("img-1", 2)
	if err != nil {
		fmt.Println(err) // cache.ErrNoSpace: every block pinned or not ready
		return
	}
	for _, b := range e.Blocks {
		copy(region.Block(b), "embedding bytes")
	}
	if err := entries.MarkReady("img-1"); err != nil {
		fmt.Println(err)
		return
	}

	// The engine's step loop.
	ctx := context.Background()
	for range 3 {
		p.WaitFor(ctx, time.Millisecond)
		p.Step(time.Now())
	}
	fmt.Println("grants held:", p.Grants())

	grace, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := p.Shutdown(grace); err != nil {
		fmt.Println(err) // the READs outlived grace; Close ended their grants
	}
	// Output:
	// grants held: 0
}

// A producer for an engine that does not step while idle: Serve runs the
// loop; at shutdown, Shutdown stops granting and waits for the READs under
// way before closing.
func ExampleProducer_Serve() {
	region, err := cache.NewRegion(cache.RegionConfig{Blocks: 64, BlockSize: 4096})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer region.Close()
	data, err := transport.NewTCPData(transport.TCPConfig{Listen: "127.0.0.1:0", Logger: logger}, region)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer data.Close()
	ctl, err := transport.Listen("tcp://127.0.0.1:0", transport.ServerConfig{Logger: logger})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer ctl.Close()
	p, err := connector.NewProducer(connector.ProducerConfig{CompatHash: compat, Logger: logger}, ctl, data,
		cache.NewEmbeddingCache(region.Blocks()))
	if err != nil {
		fmt.Println(err)
		return
	}
	served := make(chan error, 1)
	go func() { served <- p.Serve(context.Background()) }()

	// ... serving until shutdown. Then: let the READs under way finish,
	// for at most 30 s.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := p.Shutdown(ctx); err != nil {
		fmt.Println(err) // the READs outlived ctx; Close ended their grants
	}
	fmt.Println("Serve returned ErrClosed:", errors.Is(<-served, connector.ErrClosed))
	// Output:
	// Serve returned ErrClosed: true
}
