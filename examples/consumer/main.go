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
	cfg.Flags(nil, true)
	flag.Parse()
	if err := cfg.Check(true); err != nil {
		fmt.Fprintln(os.Stderr, "consumer:", err)
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
