package logx

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
	"time"
)

func TestRateLimited(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(RateLimited(slog.NewTextHandler(&buf, nil), 2, time.Second))
	for range 10 {
		log.Warn("peer sent garbage")
		log.Info("expected NACK")
	}
	out := buf.String()
	if n := strings.Count(out, "peer sent garbage"); n != 2 {
		t.Fatalf("%d warnings let through, want 2:\n%s", n, out)
	}
	if n := strings.Count(out, "expected NACK"); n != 10 {
		t.Fatalf("%d info records, want 10", n)
	}
	log.With("k", "v").Warn("another")
	if !strings.Contains(buf.String(), "another") {
		t.Fatal("a different message was limited")
	}
}
