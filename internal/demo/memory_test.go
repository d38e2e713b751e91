package demo

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/ecxfer/ecxfer/session"
)

func TestParseBytes(t *testing.T) {
	for in, want := range map[string]int64{"0": 0, "4096": 4096, "256M": 256 << 20, "1GiB": 1 << 30, "2gb": 2 << 30, "3 KiB": 3 << 10, "1T": 1 << 40} {
		if got, err := ParseBytes(in); err != nil || got != want {
			t.Errorf("%q: %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "x", "1x", "-1", "1.5G", "9999999999T", "G"} {
		if n, err := ParseBytes(in); err == nil {
			t.Errorf("%q read as %d", in, n)
		}
	}
	for n, want := range map[int64]string{0: "0B", 100: "100B", 64 << 20: "64MiB", 1 << 30: "1GiB", 3 << 29: "1.5GiB", 1<<20 + 1: "1.0MiB"} {
		if got := FormatBytes(n); got != want {
			t.Errorf("%d: %q, want %q", n, got, want)
		}
	}
}

// A consumer keeps as many items in flight as its budget holds, at most
// Concurrency and Items; an item larger than the budget is refused, saying
// which flag to change and to what.
func TestInFlight(t *testing.T) {
	cfg := Config{Items: 100, BlocksPerItem: 4, BlockSize: 64 << 20, Concurrency: 64, InflightBytes: 1 << 30}
	for _, c := range []struct {
		items, conc int
		budget      Bytes
		want        int
	}{{100, 64, 1 << 30, 4}, {100, 2, 1 << 30, 2}, {3, 64, 4 << 30, 3}, {100, 64, 0, 4}, {100, 64, 300 << 20, 1}} {
		cfg.Items, cfg.Concurrency, cfg.InflightBytes = c.items, c.conc, c.budget
		if n, err := cfg.InFlight(); err != nil || n != c.want {
			t.Errorf("%+v: %d, %v; want %d", c, n, err, c.want)
		}
	}
	cfg.InflightBytes = 128 << 20
	_, err := cfg.InFlight()
	if err == nil || !strings.HasPrefix(err.Error(), "-inflight-bytes 128MiB") || !strings.Contains(err.Error(), "give -inflight-bytes 256MiB or more") {
		t.Fatalf("a 256 MiB item in a 128 MiB budget: %v", err)
	}
	if err2 := cfg.Check(true); err2 == nil || err2.Error() != err.Error() {
		t.Fatalf("Check: %v", err2)
	}
	if err := cfg.Check(false); err != nil {
		t.Fatalf("a producer has no budget: %v", err)
	}
	prod, cons := Config{Items: 10, BlocksPerItem: 2, BlockSize: 1 << 20, Concurrency: 3}.Memory(2, 4)
	if prod != 2*10*2<<20 || cons != 4*3*2<<20 {
		t.Fatalf("memory of 2 producers and 4 consumers: %d, %d", prod, cons)
	}
}

// Each bad value is refused in one line that starts with its flag.
func TestCheckNamesTheFlag(t *testing.T) {
	good := Config{Items: 10, BlocksPerItem: 2, BlockSize: 4096, Concurrency: 4}
	if err := good.Check(true); err != nil {
		t.Fatal(err)
	}
	for flag, bad := range map[string]func(*Config){
		"-items":           func(c *Config) { c.Items = 0 },
		"-blocks-per-item": func(c *Config) { c.BlocksPerItem = -1 },
		"-block-size":      func(c *Config) { c.BlockSize = 0 },
		"-concurrency":     func(c *Config) { c.Concurrency = 0 },
		"-fetches":         func(c *Config) { c.Fetches = -1 },
		"-rate":            func(c *Config) { c.Rate = -1 },
		"-progress-every":  func(c *Config) { c.ProgressEvery = -time.Second },
		"-inflight-bytes":  func(c *Config) { c.InflightBytes = -1 },
		"-data":            func(c *Config) { c.Data = "udp" },
	} {
		c := good
		bad(&c)
		err := c.Check(true)
		if err == nil || !strings.HasPrefix(err.Error(), flag+" ") || strings.Contains(err.Error(), "\n") {
			t.Errorf("%s: %v", flag, err)
		}
	}
}

// Progress lines fall due every interval on the clock given, none with a
// zero interval, and say how far along the run is.
func TestProgressPacing(t *testing.T) {
	t0 := time.Unix(1000, 0)
	p := newPacer(t0, 2*time.Second)
	var due []int
	for ms := 0; ms <= 7000; ms += 500 {
		if p.due(t0.Add(time.Duration(ms) * time.Millisecond)) {
			due = append(due, ms)
		}
	}
	if len(due) != 3 || due[0] != 2000 || due[1] != 4000 || due[2] != 6000 {
		t.Fatalf("lines at %v ms", due)
	}
	if w := p.until(t0.Add(6500 * time.Millisecond)); w != 1500*time.Millisecond {
		t.Fatalf("next line in %v", w)
	}
	never := newPacer(t0, 0)
	if never.due(t0.Add(time.Hour)) || never.until(t0) >= 0 {
		t.Fatal("a zero interval reports")
	}
	var b strings.Builder
	progressLine(&b, 3, 16, false, 3<<26, 1<<26, 4, 2100*time.Millisecond)
	if got := b.String(); got != "  3 of 16 verified (192MiB of 1GiB), 4 in flight (256MiB), 2.1s\n" {
		t.Fatalf("%q", got)
	}
}

// The consumer's region holds what -inflight-bytes allows, not
// -concurrency items: no more fetches are ever in flight.
func TestConsumerInflightBudget(t *testing.T) {
	cfg := Config{Items: 12, BlocksPerItem: 2, BlockSize: 4096, Concurrency: 64, InflightBytes: 3 * 2 * 4096, Data: "tcp"}
	log := slog.New(slog.DiscardHandler)
	p, err := StartProducer(cfg, "127.0.0.1:0", "127.0.0.1:0", log)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	sum, err := RunConsumer(context.Background(), cfg, p.Control, io.Discard, log)
	if err != nil || sum.Verified != cfg.Items {
		t.Fatalf("%d verified: %v", sum.Verified, err)
	}
	if sum.MaxInFlight != 3 {
		t.Fatalf("%d fetches in flight at once, want 3 (the budget's)", sum.MaxInFlight)
	}
}

// A block's sum, made a piece at a time, is that of its whole content, for
// a block of several pieces and a length that is not a multiple of 8.
func TestExpectedSumsLargeBlock(t *testing.T) {
	cfg := Config{Items: 2, BlocksPerItem: 2, BlockSize: 2*sumChunk + 12}
	s := expected(cfg, nil)
	b := make([]byte, cfg.BlockSize)
	for i := range cfg.Items {
		for j := range cfg.BlocksPerItem {
			clear(b)
			Fill(b, i, j)
			if !s.ok(b, i, j) {
				t.Fatalf("item %d block %d refused", i, j)
			}
		}
	}
}

// The producer saves nothing while it serves, so one consumer may pin all
// of its cache: with every item in flight at once, none is refused.
func TestProducerWholeCachePinnable(t *testing.T) {
	cfg := Config{Items: 4, BlocksPerItem: 2, BlockSize: 4096, Concurrency: 4, Data: "tcp"}
	log := slog.New(slog.DiscardHandler)
	p, err := StartProducer(cfg, "127.0.0.1:0", "127.0.0.1:0", log)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	sum, err := RunConsumer(context.Background(), cfg, p.Control, io.Discard, log)
	if err != nil || sum.Verified != cfg.Items || sum.MaxInFlight != cfg.Items {
		t.Fatalf("%d verified, %d in flight at most: %v", sum.Verified, sum.MaxInFlight, err)
	}
	if n := p.prod.Stats().Nacks; n != (session.NackCounts{}) {
		t.Fatalf("NACKs %v", n)
	}
}
