package logx

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"
)

func TestRateLimited(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(RateLimited(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}), 2, time.Second))
	for range 10 {
		log.Warn("peer sent garbage")
		log.Info("expected NACK")
		log.Debug("READ posted")
	}
	out := buf.String()
	if n := strings.Count(out, "peer sent garbage"); n != 2 {
		t.Fatalf("%d warnings let through, want 2:\n%s", n, out)
	}
	if n := strings.Count(out, "expected NACK"); n != 2 {
		t.Fatalf("%d info records let through, want 2:\n%s", n, out)
	}
	if n := strings.Count(out, "READ posted"); n != 10 {
		t.Fatalf("%d debug records, want all 10", n)
	}
	log.With("k", "v").Warn("another")
	if !strings.Contains(buf.String(), "another") {
		t.Fatal("a different message was limited")
	}
}

// Past the interval a message is let through again, saying how many were
// suppressed; the clock is the records' own.
func TestRateLimitedInterval(t *testing.T) {
	var buf bytes.Buffer
	h := RateLimited(slog.NewTextHandler(&buf, nil), 2, time.Second)
	t0 := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	for i := range 10 {
		h.Handle(context.Background(), slog.NewRecord(t0.Add(time.Duration(i)*time.Millisecond), slog.LevelInfo, "ec consumer: NACK", 0))
	}
	if n := strings.Count(buf.String(), "NACK"); n != 2 {
		t.Fatalf("%d let through in the first interval, want 2", n)
	}
	buf.Reset()
	h.Handle(context.Background(), slog.NewRecord(t0.Add(time.Second), slog.LevelInfo, "ec consumer: NACK", 0))
	if out := buf.String(); !strings.Contains(out, "NACK") || !strings.Contains(out, "suppressed=8") {
		t.Fatalf("after the interval: %q, want the record with suppressed=8", out)
	}
}
