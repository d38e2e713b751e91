// Command producer serves the demo embeddings (see examples/consumer) until
// interrupted. It prints "ready <control endpoint> <data address>" once
// serving.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/ecxfer/ecxfer/internal/demo"
)

func main() {
	var cfg demo.Config
	control := flag.String("control", "127.0.0.1:5555", "control-plane address to bind (ZeroMQ ROUTER)")
	data := flag.String("data", "127.0.0.1:5556", "data-plane address to bind")
	flag.IntVar(&cfg.Items, "items", 1000, "embeddings to hold")
	flag.IntVar(&cfg.BlocksPerItem, "blocks-per-item", 16, "blocks per embedding")
	flag.IntVar(&cfg.BlockSize, "block-size", 8192, "bytes per block")
	flag.Parse()
	if cfg.Items <= 0 || cfg.BlocksPerItem <= 0 || cfg.BlockSize <= 0 {
		fmt.Fprintln(os.Stderr, "producer: every size must be positive")
		os.Exit(2)
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	p, err := demo.StartProducer(cfg, *control, *data, log)
	if err != nil {
		fmt.Fprintln(os.Stderr, "producer:", err)
		os.Exit(1)
	}
	fmt.Println("ready", p.Control, p.Data)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	<-ctx.Done()
	fmt.Println("producer:", p.Stats())
	p.Close()
}
