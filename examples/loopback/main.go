// Command loopback is ecxfer's main job: in one process, a producer and a
// consumer over real ZeroMQ on 127.0.0.1 and the pure-Go data plane. The
// producer holds deterministic embeddings; the consumer fetches every one,
// verifies the content of every block (a keyed hash of all its bytes), and
// prints a summary.
//
// Its memory is the producer's region (every item) and the consumer's
// (-inflight-bytes, 1 GiB by default: as many fetches in flight as whole
// items fit, at most -concurrency); a run that needs more than the machine
// has available, or whose item does not fit -inflight-bytes, fails at
// once. -mlock locks both regions in RAM. Large runs report how far along
// they are every -progress-every.
//
// It is also a load generator shaped like a fleet: -producers N and
// -consumers M (each consumer a Pool with its own control-plane client,
// fetching from every producer), -duration D to run for a time, and -procs
// to run each producer and consumer as a process of its own. It then
// prints a line a second and, at the end, each process's RSS, goroutines
// and open descriptors at its start and end. The exit status is non-zero
// when any fetch failed or never ended.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"runtime/pprof"
	"runtime/trace"
	"strings"
	"time"

	"github.com/ecxfer/ecxfer/examples/internal/cli"
	"github.com/ecxfer/ecxfer/internal/demo"
)

func main() {
	var cfg demo.Config
	cfg.Flags(nil, true)
	verbose := flag.Bool("v", false, "log at debug level")
	var fc demo.FleetConfig
	flag.IntVar(&fc.Producers, "producers", 1, "producers")
	flag.IntVar(&fc.Consumers, "consumers", 1, "consumers, each fetching from every producer")
	flag.DurationVar(&fc.Duration, "duration", 0, "run for this long instead of a count of fetches")
	flag.BoolVar(&fc.Procs, "procs", false, "run producers and consumers as separate processes")
	role := flag.String("role", "", "internal: this process's role in a -procs run")
	producerList := flag.String("producer-list", "", "internal: the producers of a -procs consumer")
	cpuProfile := flag.String("cpuprofile", "", "write this process's CPU profile to the file (go tool pprof reads it)")
	memProfile := flag.String("memprofile", "", "write this process's allocation profile to the file at the end (go tool pprof -sample_index=alloc_space)")
	traceFile := flag.String("trace", "", "write this process's execution trace to the file (go tool trace reads it)")
	demo.ParseFlags("loopback", flag.CommandLine, os.Args[1:])
	if *traceFile != "" {
		f, err := os.Create(*traceFile)
		if err == nil {
			err = trace.Start(f)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "loopback:", err)
			os.Exit(2)
		}
		defer trace.Stop()
	}
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err == nil {
			err = pprof.StartCPUProfile(f)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "loopback:", err)
			os.Exit(2)
		}
		defer pprof.StopCPUProfile()
	}
	if *memProfile != "" {
		defer func() {
			f, err := os.Create(*memProfile)
			if err != nil {
				fmt.Fprintln(os.Stderr, "loopback:", err)
				return
			}
			pprof.Lookup("allocs").WriteTo(f, 0)
			f.Close()
		}()
	}
	err := cfg.Check(true)
	switch {
	case err != nil:
	case fc.Producers < 1:
		err = fmt.Errorf("-producers %d: want 1 or more", fc.Producers)
	case fc.Consumers < 1:
		err = fmt.Errorf("-consumers %d: want 1 or more", fc.Consumers)
	case fc.Duration < 0:
		err = fmt.Errorf("-duration %v: want 0 (a count of fetches) or more", fc.Duration)
	case *role != "" && *role != "producer" && *role != "consumer":
		err = fmt.Errorf("-role %q: want producer or consumer (-procs gives it)", *role)
	case (*role == "consumer") != (*producerList != ""):
		err = fmt.Errorf("-producer-list %q: wanted with -role consumer, and only then (-procs gives both)", *producerList)
	case cfg.Metrics != "" && cli.HostPort("metrics", cfg.Metrics, true) != nil:
		err = cli.HostPort("metrics", cfg.Metrics, true)
	case *role == "":
		// A fleet's members are checked once, by the process that starts
		// them all.
		err = cfg.CheckMemory(fc.Producers, fc.Consumers)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "loopback:", err)
		os.Exit(2)
	}
	level := slog.LevelWarn
	if *verbose {
		level = slog.LevelDebug
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()

	if *role != "" {
		if err := demo.RunRole(ctx, *role, cfg, strings.Split(*producerList, ","), fc.Duration, log); err != nil {
			fmt.Fprintln(os.Stderr, "loopback:", *role+":", err)
			os.Exit(1)
		}
		return
	}
	if fc.Producers > 1 || fc.Consumers > 1 || fc.Duration > 0 || fc.Procs {
		fleet(ctx, cfg, fc, log)
		return
	}

	inFlight, _ := cfg.InFlight() // checked above
	fmt.Printf("loopback: %d items x %d blocks x %s, %d in flight (-inflight-bytes %v, -concurrency %d)\n",
		cfg.Items, cfg.BlocksPerItem, demo.FormatBytes(int64(cfg.BlockSize)), inFlight, cfg.InflightBytes, cfg.Concurrency)
	pcfg := cfg
	pcfg.Metrics = "" // one endpoint, the consumer's, serves both sides
	pcfg.Progress = os.Stdout
	prod, err := demo.StartProducer(pcfg, "127.0.0.1:0", "127.0.0.1:0", log)
	if err != nil {
		fmt.Fprintln(os.Stderr, "loopback: producer:", err)
		os.Exit(1)
	}
	defer prod.Close()
	cfg.MetricsAlso = append(cfg.MetricsAlso, prod.Collector())
	sum, err := demo.RunConsumer(ctx, cfg, prod.Control, os.Stdout, log)
	sum.Print(os.Stdout)
	// The last notifications may still be on their way: count them in.
	sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	if serr := prod.Shutdown(sctx); serr != nil {
		fmt.Fprintln(os.Stderr, "loopback: producer:", serr)
	}
	cancel()
	fmt.Println("  producer:", prod.Stats())
	if err != nil {
		fmt.Fprintln(os.Stderr, "loopback:", err)
		os.Exit(1)
	}
}

func fleet(ctx context.Context, cfg demo.Config, fc demo.FleetConfig, log *slog.Logger) {
	fc.Self = []string{os.Args[0]}
	mode := "goroutines"
	if fc.Procs {
		mode = "processes"
	}
	what := fmt.Sprintf("%d fetches per consumer", max(cfg.Fetches, cfg.Items))
	if fc.Duration > 0 {
		what = "for " + fc.Duration.String()
	}
	inFlight, _ := cfg.InFlight()
	fmt.Printf("loopback: %d producers x %d consumers as %s, %d items x %d blocks x %s, %d in flight per consumer (-inflight-bytes %v, -concurrency %d), %s\n",
		fc.Producers, fc.Consumers, mode, cfg.Items, cfg.BlocksPerItem, demo.FormatBytes(int64(cfg.BlockSize)), inFlight, cfg.InflightBytes, cfg.Concurrency, what)
	start := time.Now()
	sum, err := demo.RunFleet(ctx, cfg, fc, os.Stdout, log)
	sum.Print(os.Stdout)
	if err != nil || sum.Failed > 0 {
		fmt.Fprintf(os.Stderr, "loopback: after %v: %v (%d failed)\n", time.Since(start).Round(time.Millisecond), err, sum.Failed)
		os.Exit(1)
	}
}
