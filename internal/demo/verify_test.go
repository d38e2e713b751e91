package demo

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"
)

// A block verifies only with its own item's and index's content, and one
// changed byte fails it.
func TestExpectedSums(t *testing.T) {
	cfg := Config{Items: 5, BlocksPerItem: 3, BlockSize: 4096}
	s := expected(cfg, nil)
	if expected(cfg, nil) != s {
		t.Fatal("the table is computed again for the same shape")
	}
	b := make([]byte, cfg.BlockSize)
	for i := range cfg.Items {
		for j := range cfg.BlocksPerItem {
			Fill(b, i, j)
			if !s.ok(b, i, j) {
				t.Fatalf("item %d block %d: its own content refused", i, j)
			}
			if s.ok(b, (i+1)%cfg.Items, j) || s.ok(b, i, (j+1)%cfg.BlocksPerItem) {
				t.Fatalf("item %d block %d: verified as another block", i, j)
			}
			b[(i*131+j*17)%len(b)] ^= 1
			if s.ok(b, i, j) {
				t.Fatalf("item %d block %d: a flipped bit verified", i, j)
			}
		}
	}
	if s.ok(b[:100], 0, 0) {
		t.Fatal("a short block verified")
	}
}

// With Rate set, a consumer asks at that rate, not as fast as its
// concurrency allows, and the warm-up's fetches are left out of the
// latencies.
func TestOpenLoopRate(t *testing.T) {
	cfg := Config{Items: 32, BlocksPerItem: 2, BlockSize: 4096, Concurrency: 16, Data: "tcp", Rate: 400}
	fs, err := RunFleet(context.Background(), cfg, FleetConfig{Producers: 1, Consumers: 1, Duration: 500 * time.Millisecond},
		io.Discard, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	// 200 fall due in 0.5 s; closed loop with 16 in flight does thousands.
	if fs.Verified < 100 || fs.Verified > 201 {
		t.Fatalf("%d fetches at 400/s in 0.5 s", fs.Verified)
	}
	cfg.Warmup = time.Hour
	fs, err = RunFleet(context.Background(), cfg, FleetConfig{Producers: 1, Consumers: 1, Duration: 200 * time.Millisecond},
		io.Discard, slog.New(slog.DiscardHandler))
	if err != nil || fs.Verified == 0 || fs.P50 != 0 || fs.P99 != 0 {
		t.Fatalf("all in the warm-up: %d verified, p50 %v, p99 %v, %v", fs.Verified, fs.P50, fs.P99, err)
	}
}
