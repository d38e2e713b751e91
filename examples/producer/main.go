// Command producer serves the demo embeddings (see examples/consumer) until
// interrupted, over the TCP data plane or NIXL (-data nixl, in a build with
// -tags nixl). It prints "ready <control endpoint> <data address>" once
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
	dataAddr := flag.String("data-addr", "127.0.0.1:5556", "the TCP data plane's address to bind (-data tcp)")
	cfg.Flags(nil, false)
	flag.Parse()
	if err := cfg.Check(false); err != nil {
		fmt.Fprintln(os.Stderr, "producer:", err)
		os.Exit(2)
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	p, err := demo.StartProducer(cfg, *control, *dataAddr, log)
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
