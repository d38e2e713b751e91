package connector_test

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ecxfer/ecxfer/cache"
	"github.com/ecxfer/ecxfer/session/connector"
	"github.com/ecxfer/ecxfer/transport"
)

// A dead producer costs a few log lines a minute, not one per fetch: an
// engine that keeps fetching from a producer that refuses connections, or
// one that accepts and at once closes them, for a minute of the Pool's
// clock, sees at most deadLinesPerMinute lines at slog's default level
// (one logger for the Pool and its planes, as an engine would give), each
// naming the producer as the engine gave it.
const deadLinesPerMinute = 10

func TestDeadProducerLogLines(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	defer ln.Close()
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	for _, tc := range []struct{ name, addr string }{
		{"refuses", "tcp://localhost:1"},
		{"accepts and closes", "tcp://" + ln.Addr().String()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lines := deadProducerMinute(t, tc.addr)
			if len(lines) > deadLinesPerMinute {
				t.Errorf("%d log lines in a minute, want at most %d:\n%s", len(lines), deadLinesPerMinute, strings.Join(lines, "\n"))
			}
			// The Pool rate limits each message on the records' wall-clock
			// time (5 per 10 s), and this minute passes in seconds: a
			// message at that limit could have been held back here and let
			// through in a real minute. Below it, nothing was held back.
			per := map[string]int{}
			for _, l := range lines {
				msg, _, _ := strings.Cut(l, " addr=")
				if per[msg]++; per[msg] >= 5 || strings.Contains(l, "suppressed=") {
					t.Errorf("the rate limit held lines back (%q): the count is not a minute's", msg)
				}
			}
			goType := regexp.MustCompile(`ecxfer-guard|%!|0x[0-9a-f]{6,}|[{}]|\b[a-z][a-z0-9]*\.[A-Z][A-Za-z]+\b`)
			for _, l := range lines {
				if !strings.Contains(l, "addr="+tc.addr+" ") || goType.MatchString(l) {
					t.Errorf("a line that does not show %s as given, or shows internals: %s", tc.addr, l)
				}
			}
			t.Logf("%d lines:\n%s", len(lines), strings.Join(lines, "\n"))
		})
	}
}

// deadProducerMinute runs a Pool with defaults for a minute of its clock
// (steps of 50 ms; the minute passes as fast as the network answers),
// starting a fetch from addr whenever a block is free, and returns the
// log lines it and its planes wrote. Every fetch must fail.
func deadProducerMinute(t *testing.T, addr string) []string {
	const blocks = 4
	rec := &lineRecorder{}
	log := slog.New(rec)
	region := must(cache.NewRegion(cache.RegionConfig{Blocks: blocks, BlockSize: 4096, NoLock: true}))
	defer region.Close()
	data := must(transport.NewTCPData(transport.TCPConfig{Logger: log}, region))
	defer data.Close()
	cli := transport.NewClient(transport.ClientConfig{Logger: log})
	defer cli.Close()
	clock := time.Now()
	pool := must(connector.NewPool(connector.PoolConfig{CompatHash: "dead", BlockSize: 4096, Logger: log,
		Now: func() time.Time { return clock }}, cli, data))
	defer pool.Close()
	free := []int{0, 1, 2, 3}
	block := map[string]int{}
	fetches, failed := 0, 0
	for end := clock.Add(time.Minute); clock.Before(end); clock = clock.Add(50 * time.Millisecond) {
		for ; len(free) > 0; fetches++ {
			h := fmt.Sprint("item-", fetches)
			if _, err := pool.Fetch(addr, h, free[:1], clock.Add(30*time.Second), clock); err != nil {
				t.Fatalf("fetch: %v", err)
			}
			block[h], free = free[0], free[1:]
		}
		// Real time for the network's answers: a refusal is back in
		// milliseconds.
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Millisecond)
		pool.Wait(ctx)
		cancel()
		r := pool.Step(clock)
		if len(r.Completed) > 0 {
			t.Fatalf("a fetch from a dead producer completed: %+v", r.Completed[0])
		}
		for _, f := range r.Failed {
			failed++
			free = append(free, block[f.MMHash])
			delete(block, f.MMHash)
		}
	}
	// Enough fetches that one log line each would show.
	if failed < 100 {
		t.Fatalf("%d of %d fetches failed in the minute: too few to judge the log by", failed, fetches)
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	return rec.lines
}

// lineRecorder keeps each record at slog's default level (Info) and above
// as a line: level, message, attributes.
type lineRecorder struct {
	mu    sync.Mutex
	lines []string
}

func (h *lineRecorder) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelInfo }

func (h *lineRecorder) Handle(_ context.Context, r slog.Record) error {
	s := r.Level.String() + " " + r.Message
	r.Attrs(func(a slog.Attr) bool {
		s += " " + a.String()
		return true
	})
	h.mu.Lock()
	h.lines = append(h.lines, s+" ")
	h.mu.Unlock()
	return nil
}

func (h *lineRecorder) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *lineRecorder) WithGroup(string) slog.Handler      { return h }
