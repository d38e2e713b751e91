// Command producer serves -items embeddings of -blocks-per-item blocks of
// -block-size bytes (the content examples/consumer checks) until
// interrupted, over the TCP data plane or NIXL (-data nixl, in a build with
// -tags nixl). It prints "ready <control endpoint> <data address>" once
// serving, and what it served when it stops.
//
// It is written against the public API only: a region of blocks and the
// cache of its entries (cache), a control plane and a data plane
// (transport, nixl), and the Producer that answers requests
// (session/connector).
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/ecxfer/ecxfer/cache"
	"github.com/ecxfer/ecxfer/nixl"
	"github.com/ecxfer/ecxfer/session/connector"
	"github.com/ecxfer/ecxfer/transport"
	"github.com/ecxfer/ecxfer/xfer"
)

func main() {
	control := flag.String("control", "127.0.0.1:5555", "control-plane address to bind (ZeroMQ ROUTER)")
	dataAddr := flag.String("data-addr", "127.0.0.1:5556", "the TCP data plane's address to bind (-data shm or tcp)")
	plane := flag.String("data", "shm", "data plane: shm (TCP, with same-host copies out of a shared region), tcp (TCP only) or nixl (a build with -tags nixl)")
	items := flag.Int("items", 1000, "embeddings")
	perItem := flag.Int("blocks-per-item", 16, "blocks per embedding")
	blockSize := flag.Int("block-size", 8192, "bytes per block")
	flag.Parse()
	if err := run(*control, *dataAddr, *plane, *items, *perItem, *blockSize); err != nil {
		fmt.Fprintln(os.Stderr, "producer:", err)
		os.Exit(1)
	}
}

func run(control, dataAddr, plane string, items, perItem, blockSize int) error {
	if items <= 0 || perItem <= 0 || blockSize <= 0 {
		return fmt.Errorf("-items, -blocks-per-item and -block-size must be positive")
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	// The blocks live in a region; the cache says which blocks hold which
	// entry (by mm_hash) and which are ready to serve.
	region, err := cache.NewRegion(cache.RegionConfig{Blocks: items * perItem, BlockSize: blockSize, Shared: plane == "shm"})
	if err != nil {
		return err
	}
	defer region.Close()
	entries := cache.NewEmbeddingCache(region.Blocks()) // one entry per block at most: it matches the region
	for i := range items {
		e, err := entries.Alloc(Hash(i), perItem)
		if err != nil {
			return err
		}
		for j, b := range e.Blocks {
			Fill(region.Block(b), i, j) // an encoder writes the embedding here
		}
		entries.MarkReady(Hash(i))
	}

	var data xfer.DataTransport
	where := "nixl"
	switch plane {
	case "shm", "tcp":
		t, err := transport.NewTCPData(transport.TCPConfig{Listen: dataAddr, NoSharedMemory: plane == "tcp", Logger: log}, region)
		if err != nil {
			return err
		}
		data, where = t, t.Addr().String()
	case "nixl":
		a, err := nixl.New(nixl.Config{Name: fmt.Sprintf("producer-%d", os.Getpid()), Params: params(*nixlParams)}, region)
		if err != nil {
			return fmt.Errorf("-data nixl: %w", err)
		}
		data = a
	default:
		return fmt.Errorf("-data %q: want shm, tcp or nixl", plane)
	}
	defer data.Close()
	ctl, err := transport.Listen(control, transport.ServerConfig{Logger: log})
	if err != nil {
		return err
	}
	defer ctl.Close()
	prod, err := connector.NewProducer(connector.ProducerConfig{CompatHash: CompatHash(blockSize), Logger: log}, ctl, data, entries)
	if err != nil {
		return err
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	served := make(chan error, 1)
	go func() { served <- prod.Serve(ctx) }()
	fmt.Println("ready", ctl.Endpoint(), where)
	fmt.Printf("serving %d items; item 0 is mm_hash %s (examples/probe -fetch takes it)\n", items, Hash(0))
	<-ctx.Done()
	// Stop granting; give the READs under way 10 s to finish.
	grace, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err = prod.Shutdown(grace)
	<-served
	s := prod.Stats()
	fmt.Printf("producer: %d requests, %d grants, %d completed READs, %d leases expired; NACKs: %v; malformed requests: %d\n",
		s.Requests, s.Grants, s.Completions, s.Expired, s.Nacks, s.Malformed)
	return err
}

var nixlParams = flag.String("nixl-params", "", "NIXL backend parameters, key=value[,key=value] (-data nixl), e.g. ucx_error_handling_mode=none for UCX_TLS=sm")

// params parses key=value[,key=value] into NIXL backend parameters.
func params(s string) map[string]string {
	if s == "" {
		return nil
	}
	m := map[string]string{}
	for _, kv := range strings.Split(s, ",") {
		k, v, _ := strings.Cut(kv, "=")
		m[k] = v
	}
	return m
}
