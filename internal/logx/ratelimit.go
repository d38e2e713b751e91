// Package logx holds logging helpers shared by ecxfer's packages.
package logx

import (
	"context"
	"log/slog"
	"sync"
	"time"
)

// RateLimited wraps h so that records at Info level and above are let
// through at most burst times per message text per interval; the rest are
// counted and the count is attached to the next record let through. A peer
// that misbehaves on every message cannot flood the log, nor can a
// workload whose every request is answered with an expected NACK (logged
// at Info, as the reference does: one line per cache miss). Debug records
// pass unchanged. The clock is the record's own time.
func RateLimited(h slog.Handler, burst int, interval time.Duration) slog.Handler {
	return &limiter{h: h, st: &limitState{burst: burst, interval: interval, seen: map[string]*bucket{}}}
}

type bucket struct {
	start      time.Time
	n          int
	suppressed int
}

type limitState struct {
	mu       sync.Mutex
	burst    int
	interval time.Duration
	seen     map[string]*bucket
}

type limiter struct {
	h  slog.Handler
	st *limitState
}

func (l *limiter) Enabled(ctx context.Context, level slog.Level) bool { return l.h.Enabled(ctx, level) }

func (l *limiter) Handle(ctx context.Context, r slog.Record) error {
	if r.Level < slog.LevelInfo {
		return l.h.Handle(ctx, r)
	}
	st := l.st
	st.mu.Lock()
	b := st.seen[r.Message]
	if b == nil {
		if len(st.seen) > 1024 { // bounded: forget everything rather than grow
			clear(st.seen)
		}
		b = &bucket{start: r.Time}
		st.seen[r.Message] = b
	}
	if r.Time.Sub(b.start) >= st.interval {
		b.start, b.n = r.Time, 0
	}
	b.n++
	if b.n > st.burst {
		b.suppressed++
		st.mu.Unlock()
		return nil
	}
	suppressed := b.suppressed
	b.suppressed = 0
	st.mu.Unlock()
	if suppressed > 0 {
		r = r.Clone()
		r.AddAttrs(slog.Int("suppressed", suppressed))
	}
	return l.h.Handle(ctx, r)
}

func (l *limiter) WithAttrs(as []slog.Attr) slog.Handler {
	return &limiter{h: l.h.WithAttrs(as), st: l.st}
}

func (l *limiter) WithGroup(name string) slog.Handler {
	return &limiter{h: l.h.WithGroup(name), st: l.st}
}
