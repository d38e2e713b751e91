// Command probe asks a live producer, Go or vLLM's Python one, whether it is
// reachable, speaks our protocol version and has our compatibility hash,
// and with -fetch fetches one entry and reports its bytes:
//
//	go run ./examples/probe -producer tcp://10.0.0.5:5555 -compat-of 0.11.0,Qwen/Qwen2.5-VL-7B-Instruct,torch.bfloat16,4096
//
// -fetch takes the mm_hash the producer's engine saved the entry under (the
// hash of the image or other input it encoded); -fetch demo:N names item N
// of examples/producer and examples/loopback (the sha256, in hex, of
// "ecxfer demo item N").
//
// It exits 0 when the producer answered as a healthy one (and the fetch,
// if asked, completed), 1 otherwise, and 2, with one line naming it, for a
// bad flag. The library's own log lines are shown
// only with -v.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/ecxfer/ecxfer/cache"
	"github.com/ecxfer/ecxfer/examples/internal/cli"
	"github.com/ecxfer/ecxfer/internal/demo"
	"github.com/ecxfer/ecxfer/internal/probe"
	"github.com/ecxfer/ecxfer/wire"
)

func main() {
	var cfg demo.Config
	producer := flag.String("producer", "tcp://127.0.0.1:5555", "the producer's control endpoint")
	compat := flag.String("compat", "", "our compatibility hash (default: the demo's, for -block-size)")
	compatOf := flag.String("compat-of", "", "compute the compatibility hash of vllm_version,model,dtype,block_size_bytes")
	mm := flag.String("mm-hash", "", "the mm_hash to ask for (default: a random one, which a healthy producer does not hold)")
	fetch := flag.String("fetch", "", "fetch this mm_hash after the probe and report its bytes: the hash the producer's engine saved the entry\n"+
		"under, or demo:N for item N of examples/producer and examples/loopback")
	version := flag.Int64("version", 0, "the connector version to claim (default: ours)")
	timeout := flag.Duration("timeout", 3*time.Second, "the wait for each step")
	blocks := flag.Int("blocks", 1024, "local blocks for -fetch")
	verbose := flag.Bool("v", false, "show the library's log lines (on stderr)")
	cfg.Flags(nil, false)
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), `Usage: probe [flags]

Asks a producer (Go or vLLM's) for an entry and says in plain words what came back.
With -fetch HASH it also fetches that entry and prints its size, time and sha256;
give it the mm_hash the producer holds the entry under, or demo:N for item N of
examples/producer and examples/loopback. Exit status 0: healthy (and fetched).

`)
		flag.PrintDefaults()
	}
	demo.ParseFlags("probe", flag.CommandLine, os.Args[1:])
	err := cfg.Check(false)
	switch {
	case err != nil:
	case *timeout <= 0:
		err = fmt.Errorf("-timeout %v: want more than 0", *timeout)
	case *blocks <= 0:
		err = fmt.Errorf("-blocks %d: want a positive number", *blocks)
	default:
		err = cli.Endpoint("producer", *producer, false)
	}
	if err != nil {
		cli.Usage("probe", err)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	if *verbose {
		log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	if n, ok := strings.CutPrefix(*fetch, "demo:"); ok {
		i, err := strconv.Atoi(n)
		if err != nil || i < 0 {
			fmt.Fprintln(os.Stderr, "probe: -fetch demo:N wants an item number")
			os.Exit(2)
		}
		*fetch = demo.Hash(i)
	}
	hash := *compat
	switch {
	case *compatOf != "":
		f := strings.Split(*compatOf, ",")
		bs, err := strconv.Atoi(f[len(f)-1])
		if len(f) != 4 || err != nil {
			fmt.Fprintln(os.Stderr, "probe: -compat-of wants vllm_version,model,dtype,block_size_bytes")
			os.Exit(2)
		}
		hash = wire.CompatHash(f[0], f[1], f[2], bs)
	case hash == "":
		hash = cfg.CompatHash()
	}
	pc := probe.Config{Producer: *producer, CompatHash: hash, MMHash: *mm, Version: *version, Timeout: *timeout, Logger: log}
	if *fetch != "" {
		pc.MMHash, pc.Fetch, pc.BlockSize = *fetch, true, cfg.BlockSize
		region, err := cache.NewRegion(cache.RegionConfig{Blocks: *blocks, BlockSize: cfg.BlockSize, NoLock: !cfg.Lock, RequireLock: cfg.Lock})
		if err != nil {
			fmt.Fprintln(os.Stderr, "probe:", err)
			os.Exit(2)
		}
		defer region.Close()
		data, err := cfg.DataPlane(region, log)
		if err != nil {
			fmt.Fprintln(os.Stderr, "probe:", err)
			os.Exit(2)
		}
		defer data.Close()
		pc.Region, pc.Data = region, data
	}
	rep, err := probe.Run(context.Background(), pc, os.Stdout)
	if err != nil {
		fmt.Fprintln(os.Stderr, "probe:", err)
		os.Exit(2)
	}
	healthy := rep.Answered && (rep.Status == wire.OK || (*mm == "" && *fetch == "" && rep.Status == wire.NackMissing))
	if !healthy || (*fetch != "" && !rep.Fetched) {
		os.Exit(1)
	}
}
