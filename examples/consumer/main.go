// Command consumer fetches every demo embedding from a running producer
// (examples/producer, same sizes), verifies every byte and prints a summary.
// It exits non-zero if anything failed.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"

	"github.com/ecxfer/ecxfer/internal/demo"
)

func main() {
	var cfg demo.Config
	producer := flag.String("producer", "tcp://127.0.0.1:5555", "the producer's control endpoint")
	flag.IntVar(&cfg.Items, "items", 1000, "embeddings to fetch")
	flag.IntVar(&cfg.BlocksPerItem, "blocks-per-item", 16, "blocks per embedding")
	flag.IntVar(&cfg.BlockSize, "block-size", 8192, "bytes per block")
	flag.IntVar(&cfg.Concurrency, "concurrency", 64, "fetches in flight")
	flag.Parse()
	if cfg.Items <= 0 || cfg.BlocksPerItem <= 0 || cfg.BlockSize <= 0 || cfg.Concurrency <= 0 {
		fmt.Fprintln(os.Stderr, "consumer: every flag must be positive")
		os.Exit(2)
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	sum, err := demo.RunConsumer(ctx, cfg, *producer, os.Stderr, log)
	sum.Print(os.Stdout)
	if err != nil {
		fmt.Fprintln(os.Stderr, "consumer:", err)
		os.Exit(1)
	}
}
