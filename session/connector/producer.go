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
	// MaxGrantsPerSession and MaxGrants bound live grants (see
	// session.ProducerConfig).
	MaxGrantsPerSession, MaxGrants int
	// MaxRequestsPerStep bounds the requests handled in one step, and
	// MaxPerPeerPerStep those of one consumer connection, so that a
	// flooding consumer cannot starve the others: the rest wait for later
	// steps, in order. Defaults 1024 and 64.
	MaxRequestsPerStep int
	MaxPerPeerPerStep  int
	// MaxBacklog bounds the requests waiting; beyond it new ones are
	// dropped (not answered: the consumer's ack timeout covers them).
	// Default 16384.
	MaxBacklog int
	Logger     *slog.Logger // nil: slog.Default(); peer-caused warnings are rate limited
}

// Producer serves a cache's entries: it drains the control plane, runs the
// ProducerSession and replies. Call Step from the engine's loop, or run
// Serve in a goroutine for an engine that does not step while idle; both may
// be used, and stopped, at any time.
type Producer struct {
	mu      sync.Mutex // Step and Serve take turns
	ctl     ControlServer
	ready   <-chan struct{} // the data plane's notifications, if it signals them
	sess    *session.ProducerSession
	cfg     ProducerConfig
	backlog []session.Message // waiting, in arrival order
	batch   []session.Message
	rest    []session.Message
	perPeer map[string]int
	dropped uint64
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
	if cfg.MaxPerPeerPerStep <= 0 {
		cfg.MaxPerPeerPerStep = 64
	}
	if cfg.MaxBacklog <= 0 {
		cfg.MaxBacklog = 16384
	}
	s := session.NewProducerSession(session.ProducerConfig{PinLease: cfg.PinLease, Logger: log,
		MaxGrantsPerSession: cfg.MaxGrantsPerSession, MaxGrants: cfg.MaxGrants}, data, c, cfg.CompatHash)
	if a, ok := data.(authorizing); ok {
		s.EnableAuthorize()
		a.SetAuthorizer(s.Authorize)
	}
	p := &Producer{ctl: ctl, sess: s, cfg: cfg, perPeer: map[string]int{}}
	if sg, ok := data.(xfer.Signaling); ok {
		p.ready = sg.Ready()
	}
	return p
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
	n := len(p.backlog)
	p.backlog = p.ctl.Drain(p.backlog)
	if over := len(p.backlog) - p.cfg.MaxBacklog; over > 0 {
		p.dropped += uint64(over)
		clear(p.backlog[max(n, p.cfg.MaxBacklog):])
		p.backlog = p.backlog[:max(n, p.cfg.MaxBacklog)]
	}
	// Take up to the bounds, each consumer's requests in order; the rest
	// stay for later steps.
	clear(p.perPeer)
	p.batch, p.rest = p.batch[:0], p.rest[:0]
	for _, m := range p.backlog {
		if len(p.batch) < p.cfg.MaxRequestsPerStep && p.perPeer[string(m.Identity)] < p.cfg.MaxPerPeerPerStep {
			p.perPeer[string(m.Identity)]++
			p.batch = append(p.batch, m)
		} else {
			p.rest = append(p.rest, m)
		}
	}
	p.sess.Poll(p.batch, now, p.ctl)
	clear(p.batch)
	clear(p.backlog)
	p.backlog, p.rest = p.rest, p.backlog[:0]
}

// Backlog returns how many requests wait for a later step, and how many
// were dropped because the backlog was full.
func (p *Producer) Backlog() (waiting int, dropped uint64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.backlog), p.dropped
}

// Serve steps until ctx ends: at once when a request arrives or is waiting,
// or when a data plane that signals notifications (xfer.Signaling) has some;
// every 5 ms while grants are outstanding (for completion notifications and
// the lease sweep), every second otherwise — the reference's cadence. now
// is the clock; nil means time.Now.
func (p *Producer) Serve(ctx context.Context, now func() time.Time) error {
	if now == nil {
		now = time.Now
	}
	for {
		grants, backlog := p.load()
		if backlog == 0 {
			wait := time.Second
			if grants > 0 {
				wait = 5 * time.Millisecond
			}
			wctx, cancel := context.WithTimeout(ctx, wait)
			if p.ready != nil && grants > 0 {
				go func() {
					select {
					case <-p.ready:
						cancel()
					case <-wctx.Done():
					}
				}()
			}
			p.ctl.Wait(wctx)
			cancel()
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		p.Step(now())
	}
}

// load returns the live grants and the requests waiting.
func (p *Producer) load() (grants, backlog int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.sess.Grants(), len(p.backlog)
}

// Close releases every grant's pin. The control plane and data plane are the
// caller's to close.
func (p *Producer) Close() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.sess.Close()
}
