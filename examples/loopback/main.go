// Command loopback is ecxfer's main job: in one process, a producer and a
// consumer over real ZeroMQ on 127.0.0.1 and the pure-Go data plane. The
// producer holds deterministic embeddings; the consumer fetches every one,
// verifies every byte, and prints a summary.
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
	cfg.Flags(nil, true)
	verbose := flag.Bool("v", false, "log at debug level")
	flag.Parse()
	if err := cfg.Check(true); err != nil {
		fmt.Fprintln(os.Stderr, "loopback:", err)
		os.Exit(2)
	}
	level := slog.LevelWarn
	if *verbose {
		level = slog.LevelDebug
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))

	fmt.Printf("loopback: %d items x %d blocks x %d bytes, concurrency %d\n", cfg.Items, cfg.BlocksPerItem, cfg.BlockSize, cfg.Concurrency)
	pcfg := cfg
	pcfg.Metrics = "" // one endpoint, the consumer's, serves both sides
	prod, err := demo.StartProducer(pcfg, "127.0.0.1:0", "127.0.0.1:0", log)
	if err != nil {
		fmt.Fprintln(os.Stderr, "loopback: producer:", err)
		os.Exit(1)
	}
	defer prod.Close()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	cfg.MetricsAlso = append(cfg.MetricsAlso, prod.Collector())
	sum, err := demo.RunConsumer(ctx, cfg, prod.Control, os.Stdout, log)
	sum.Print(os.Stdout)
	fmt.Println("  producer:", prod.Stats())
	if err != nil {
		fmt.Fprintln(os.Stderr, "loopback:", err)
		os.Exit(1)
	}
}
