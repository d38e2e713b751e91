package connector

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/ecxfer/ecxfer/cache"
	"github.com/ecxfer/ecxfer/internal/logx"
	"github.com/ecxfer/ecxfer/session"
	"github.com/ecxfer/ecxfer/xfer"
)

// ControlServer is what a Producer needs of the producer's control plane;
// *transport.Server implements it.
type ControlServer interface {
	Drain(dst []session.Message) []session.Message
	Reply(identity, payload []byte) error
	Wait(ctx context.Context) bool
}

// authorizing is a data plane that can gate the READs it serves, like
// *transport.TCPData.
type authorizing interface {
	SetAuthorizer(func(notif []byte, blocks []int) bool)
}

// ProducerConfig configures a Producer.
type ProducerConfig struct {
	CompatHash string        // wire.CompatHash of this producer; required
	PinLease   time.Duration // default 30 s
	// MaxRequestsPerStep bounds the requests handled in one step; the rest
	// wait for the next. Default 1024.
	MaxRequestsPerStep int
	Logger             *slog.Logger // nil: slog.Default(); peer-caused warnings are rate limited
}

// Producer serves a cache's entries: it drains the control plane, runs the
// ProducerSession and replies. Call Step from the engine's loop, or run
// Serve in a goroutine for an engine that does not step while idle; both may
// be used, and stopped, at any time.
type Producer struct {
	mu   sync.Mutex // Step and Serve take turns
	ctl  ControlServer
	sess *session.ProducerSession
	msgs []session.Message
	max  int
}

// NewProducer returns a producer serving c through ctl and data. If data can
// gate the READs it serves (the TCP data plane), it is given the session's
// grant check, so a consumer can read only what it was granted.
func NewProducer(cfg ProducerConfig, ctl ControlServer, data xfer.DataTransport, c *cache.EmbeddingCache) *Producer {
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	log = slog.New(logx.RateLimited(log.Handler(), 5, 10*time.Second))
	if cfg.MaxRequestsPerStep <= 0 {
		cfg.MaxRequestsPerStep = 1024
	}
	s := session.NewProducerSession(session.ProducerConfig{PinLease: cfg.PinLease, Logger: log}, data, c, cfg.CompatHash)
	if a, ok := data.(authorizing); ok {
		a.SetAuthorizer(s.Authorize)
	}
	return &Producer{ctl: ctl, sess: s, max: cfg.MaxRequestsPerStep}
}

// Session returns the producer session, for its stats.
func (p *Producer) Session() *session.ProducerSession { return p.sess }

// Stats returns the session's counters.
func (p *Producer) Stats() session.ProducerStats {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.sess.Stats()
}

// Step handles the requests that arrived, the completion notifications and
// the lease sweep, at now.
func (p *Producer) Step(now time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.msgs = p.ctl.Drain(p.msgs[:0])
	p.sess.Poll(p.msgs, now, p.ctl)
	clear(p.msgs)
}

// Serve steps until ctx ends: at once when a request arrives, and every
// 5 ms while grants are outstanding (for completion notifications and the
// lease sweep), every second otherwise — the reference's cadence. now is
// the clock; nil means time.Now.
func (p *Producer) Serve(ctx context.Context, now func() time.Time) error {
	if now == nil {
		now = time.Now
	}
	for {
		wait := time.Second
		if p.grants() > 0 {
			wait = 5 * time.Millisecond
		}
		wctx, cancel := context.WithTimeout(ctx, wait)
		p.ctl.Wait(wctx)
		cancel()
		if ctx.Err() != nil {
			return ctx.Err()
		}
		p.Step(now())
	}
}

func (p *Producer) grants() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.sess.Grants()
}

// Close releases every grant's pin. The control plane and data plane are the
// caller's to close.
func (p *Producer) Close() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.sess.Close()
}
