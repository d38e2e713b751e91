// Command producer serves -items embeddings of -blocks-per-item blocks of
// -block-size bytes (the content examples/consumer checks) until
// interrupted, over the TCP data plane or NIXL (-data nixl, in a build with
// -tags nixl). It prints "ready <control endpoint> <data address>" once
// serving, and what it served when it stops: an interrupt gives the READs
// under way up to 10 s to finish, a second one ends them at once.
//
// It is written against the library's public API only (its flag helpers are
// the examples' own, examples/internal/cli): a region of blocks and the
// cache of its entries (cache), a control plane and a data plane
// (transport, nixl), and the Producer that answers requests
// (session/connector).
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/ecxfer/ecxfer/cache"
	"github.com/ecxfer/ecxfer/examples/internal/cli"
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
	lock := flag.Bool("mlock", false, "lock the region in RAM (mlock): a refusal (ulimit -l) fails the start")
	every := flag.Duration("progress-every", 2*time.Second, "how often to report how far the fill is; 0: never")
	cli.ParseFlags("producer")
	// The region holds every item: it is checked against the machine's
	// memory before it is mapped and filled.
	region := cli.ItemBytes(*perItem, *blockSize)
	if region > 0 && int64(*items) > math.MaxInt64/region {
		region = -1
	}
	region *= int64(*items)
	err := cli.Positive([]string{"items", "blocks-per-item", "block-size"}, *items, *perItem, *blockSize)
	switch {
	case err != nil:
	case *plane != "shm" && *plane != "tcp" && *plane != "nixl":
		err = fmt.Errorf("-data %q: want shm, tcp or nixl", *plane)
	case *every < 0:
		err = fmt.Errorf("-progress-every %v: want 0 (never) or more", *every)
	default:
		// Before the fill, which may take a while.
		err = cli.Endpoint("control", *control, true)
		if err == nil && *plane != "nixl" {
			err = cli.HostPort("data-addr", *dataAddr, true)
		}
		if err == nil {
			err = cli.CheckMemory(region, "-items, -blocks-per-item or -block-size")
		}
	}
	if err != nil {
		cli.Usage("producer", err)
	}
	if err := run(*control, *dataAddr, *plane, *items, *perItem, *blockSize, *lock, *every); err != nil {
		fmt.Fprintln(os.Stderr, "producer:", err)
		os.Exit(1)
	}
}

func run(control, dataAddr, plane string, items, perItem, blockSize int, lock bool, every time.Duration) error {
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	// The blocks live in a region; the cache says which blocks hold which
	// entry (by mm_hash) and which are ready to serve. Unlocked by
	// default: locking takes the whole region at once, and a refusal
	// names the limit (ulimit -l).
	region, err := cache.NewRegion(cache.RegionConfig{Blocks: items * perItem, BlockSize: blockSize, Shared: plane == "shm",
		NoLock: !lock, RequireLock: lock})
	if err != nil {
		if lock { // a refused lock is undone by leaving -mlock out
			err = fmt.Errorf("-mlock: %w", err)
		}
		return err
	}
	defer region.Close()
	entries := cache.NewEmbeddingCache(region.Blocks()) // one entry per block at most: it matches the region
	total := len(region.Bytes())
	next := time.Now().Add(every)
	for i := range items {
		e, err := entries.Alloc(Hash(i), perItem)
		if err != nil {
			return err
		}
		for j, b := range e.Blocks {
			Fill(region.Block(b), i, j) // an encoder writes the embedding here
			if now := time.Now(); every > 0 && now.After(next) {
				next = now.Add(every)
				fmt.Fprintf(os.Stderr, "producer: filled %s of %s\n", cli.FormatSize(int64((i*perItem+j+1)*blockSize)), cli.FormatSize(int64(total)))
			}
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
		a, err := nixl.New(nixl.Config{Name: fmt.Sprintf("producer-%d", os.Getpid()), Params: nixlParams}, region)
		if err != nil {
			return fmt.Errorf("-data nixl: %w", err)
		}
		data = a
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

	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(sigs)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	served := make(chan error, 1)
	go func() { served <- prod.Serve(ctx) }()
	fmt.Println("ready", ctl.Endpoint(), where)
	fmt.Printf("serving %d items; item 0 is mm_hash %s (examples/probe -fetch takes it)\n", items, Hash(0))
	<-sigs
	cancel()
	err = shutdown(prod, sigs, 10*time.Second, os.Stderr)
	<-served
	s := prod.Stats()
	fmt.Printf("producer: %d requests, %d grants, %d completed READs, %d leases expired; NACKs: %v; malformed requests: %d\n",
		s.Requests, s.Grants, s.Completions, s.Expired, s.Nacks, s.Malformed)
	return err
}

// shutdown stops prod granting and gives the READs under way grace to
// finish, saying so on w; another signal on sigs ends the wait at once
// (the grants left are ended, and the error says how many).
func shutdown(prod interface {
	Grants() int
	Shutdown(context.Context) error
}, sigs <-chan os.Signal, grace time.Duration, w io.Writer) error {
	ctx, cancel := context.WithTimeout(context.Background(), grace)
	defer cancel()
	if n := prod.Grants(); n > 0 {
		fmt.Fprintf(w, "producer: stopping: waiting up to %v for %d READs under way (interrupt again to exit at once)\n", grace, n)
	} else {
		fmt.Fprintln(w, "producer: stopping")
	}
	go func() {
		select {
		case <-sigs:
			cancel()
		case <-ctx.Done():
		}
	}()
	return prod.Shutdown(ctx)
}

var nixlParams cli.Params

func init() {
	flag.Var(&nixlParams, "nixl-params", "NIXL backend parameters, `key=value[,key=value]` (-data nixl), e.g. ucx_error_handling_mode=none for UCX_TLS=sm")
}
