package connector

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ecxfer/ecxfer/cache"
	"github.com/ecxfer/ecxfer/internal/hooks"
	"github.com/ecxfer/ecxfer/internal/logx"
	"github.com/ecxfer/ecxfer/internal/plane"
	"github.com/ecxfer/ecxfer/session"
	"github.com/ecxfer/ecxfer/xfer"
)

// ControlServer is a Producer's control plane, as *transport.Server provides.
type ControlServer interface {
	Drain(dst []xfer.Message) []xfer.Message // appends the requests that arrived
	Reply(identity, payload []byte) error    // queues a reply to one consumer, never blocks
	Wait(ctx context.Context) bool           // blocks until Drain has something (true) or ctx ends
}

// ProducerConfig configures a Producer; zero fields take defaults.
type ProducerConfig struct {
	CompatHash           string           // wire.CompatHash of this producer; required
	PinLease             time.Duration    // longest a grant pins its entry; default 30 s
	MaxGrantsPerSession  int              // live grants of one consumer session, past which NACK_INTERNAL (other bounds: NACK_NOT_READY); default 4096
	MaxGrantsPerIdentity int              // of one control-plane identity; default MaxGrants/4, within [MaxGrantsPerSession, MaxGrants]
	MaxGrants            int              // in all; default 65536
	MaxGrantsPerEntry    int              // one session's live grants of one entry; default 8
	MaxPinnedShare       float64          // of the cache one session or identity may pin; default 0.5
	MaxRequestAge        time.Duration    // older requests are not granted; default 2 s
	MaxRequestsPerStep   int              // requests one Step answers; default 1024
	MaxPerPeerPerStep    int              // of them from one consumer; default 64
	MaxBacklog           int              // requests left waiting (and 64 MiB); past it the biggest waiter's newest drop; default 16384
	Logger               *slog.Logger     // nil: slog.Default()
	Now                  func() time.Time // clock of Serve and Wait; Step takes yours; nil: time.Now
}

// Producer serves a cache's entries to consumers. The engine's rules:
//
//   - Call Step in the engine's loop (it never blocks; sleep in Wait), or run
//     Serve in a goroutine, or both; every method is safe from any goroutine.
//   - A grant pins its entry until the consumer's READ is done or PinLease.
//   - Stop with Shutdown (waits for the READs under way) or Close (abrupt),
//     then close the control and data planes, then the region.
type Producer struct {
	mu      sync.Mutex // Step and Serve take turns
	ctl     ControlServer
	data    xfer.DataTransport
	ready   <-chan struct{} // the data plane's notifications, if it signals them
	sready  <-chan struct{} // the same for Serve, if the plane tells them apart (plane.Serving)
	waiter  plane.Waiter    // the data plane's, told when wait blocks, if it has one
	sess    *session.ProducerSession
	cfg     ProducerConfig
	waiting backlog        // requests for later steps
	in      []xfer.Message // a step's arrivals
	batch   []xfer.Message // a step's requests
	closed  bool
	done    chan struct{} // closed by Close: Serve and Shutdown return
	waitMu  sync.Mutex    // Serve, Shutdown and Wait may wait at once
	timer   *time.Timer   // wait's, reused
	// wakeAt is when a waiting Serve, Shutdown or Wait wakes (unix ns), so that a
	// step taken on a control-plane goroutine (serveInline) wakes it only
	// when that step needs it sooner. MaxInt64 while it plans.
	wakeAt atomic.Int64
}

// Errors of Pool and Producer.
var (
	ErrBadConfig      = xfer.ErrBadConfig                                     // NewPool or NewProducer got an unusable config
	ErrClosed         = xfer.ErrClosed                                        // the Pool or Producer is closed
	ErrInFlight       = session.ErrInFlight                                   // a READ may still write the mm_hash's blocks, or (FetchEntry) its entry is not ready
	ErrNotInFlight    = session.ErrNotInFlight                                // Cancel of an mm_hash not being fetched
	ErrContactRefused = errors.New("connector: the producer refused contact") // wraps the NACK refusing Connect
)

// NewProducer serves c, which must be cache.NewEmbeddingCache(region.Blocks())
// of data's region, filled before MarkReady. ErrBadConfig: a nil or empty arg.
func NewProducer(cfg ProducerConfig, ctl ControlServer, data xfer.DataTransport, c *cache.EmbeddingCache) (*Producer, error) {
	if cfg.CompatHash == "" {
		return nil, fmt.Errorf("%w: connector: ProducerConfig.CompatHash is required", ErrBadConfig)
	}
	if ctl == nil {
		return nil, fmt.Errorf("%w: connector: nil control plane", ErrBadConfig)
	}
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
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	s, err := session.NewProducerSession(session.ProducerConfig{PinLease: cfg.PinLease, Logger: log,
		MaxGrantsPerSession: cfg.MaxGrantsPerSession, MaxGrantsPerIdentity: cfg.MaxGrantsPerIdentity, MaxGrants: cfg.MaxGrants,
		MaxGrantsPerEntry: cfg.MaxGrantsPerEntry, MaxPinnedShare: cfg.MaxPinnedShare,
		MaxRequestAge: cfg.MaxRequestAge}, data, c, cfg.CompatHash)
	if err != nil {
		return nil, err
	}
	p := &Producer{ctl: ctl, data: data, sess: s, cfg: cfg, done: make(chan struct{})}
	if sg, ok := plane.As[plane.Signaling](data); ok {
		p.ready = sg.Ready()
	}
	p.waiter, _ = plane.As[plane.Waiter](data)
	p.sready = p.ready
	if s, ok := plane.As[plane.Serving](data); ok {
		p.sready = s.ServeReady()
	}
	return p, nil
}

func init() {
	hooks.StopGranting = func(p any) { p.(*Producer).stopGranting() }
	hooks.ProducerPins = func(pr any, dst map[string]int) {
		p := pr.(*Producer)
		p.mu.Lock()
		defer p.mu.Unlock()
		hooks.SessionPins(p.sess, dst)
	}
}

// Stats returns the counters.
func (p *Producer) Stats() session.ProducerStats {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.sess.Stats()
}

// Step answers requests and ends finished or expired grants; never blocks.
func (p *Producer) Step(now time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.step(now)
}

func (p *Producer) step(now time.Time) {
	if p.closed {
		p.sess.Poll(nil, p.ctl, now) // recycles grants whose READ was being served
		return
	}
	p.in = p.ctl.Drain(p.in[:0])
	for i := range p.in {
		if p.in[i].At.IsZero() {
			p.in[i].At = now
		}
		p.waiting.add(p.in[i])
	}
	clear(p.in)
	p.waiting.trim(p.cfg.MaxBacklog, backlogBytes)
	// Up to the bounds, each consumer's requests in order, the consumers
	// in turn; the rest wait for later steps.
	p.batch = p.waiting.take(p.batch[:0], p.cfg.MaxRequestsPerStep, p.cfg.MaxPerPeerPerStep)
	p.sess.Poll(p.batch, p.ctl, now)
	clear(p.batch)
}

// Backlog returns the requests waiting for a later Step, and those dropped.
func (p *Producer) Backlog() (waiting int, dropped uint64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.waiting.n, p.waiting.dropped
}

// Serve steps on work until ctx ends (its error) or a close (ErrClosed).
func (p *Producer) Serve(ctx context.Context) error {
	now := p.cfg.Now
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-p.done:
			cancel()
		case <-ctx.Done():
		}
	}()
	// Serve waits between its steps, which run where messages arrive: the
	// planes' goroutines read every socket, and none is read in a step.
	if w, ok := plane.As[plane.Waiter](p.ctl); ok {
		defer w.Waiting()()
	}
	// Serve's goroutine steps no consumer: a Pool that steps on the same
	// data plane keeps its sockets (plane.Serving).
	if s, ok := plane.As[plane.Serving](p.data); ok {
		defer s.Serving()()
	} else if p.waiter != nil {
		defer p.waiter.Waiting()()
	}
	if s, ok := plane.As[inlineServer](p.ctl); ok {
		s.OnRequest(func() { p.serveInline(s, now) })
		defer s.OnRequest(nil)
		// Notifications too, where the data plane takes them (the unpin
		// happens there). The hook is this producer's session's, and goes
		// with it: a producer that replaces this one keeps its own.
		if hooks.OnNotify(p.sess, func() bool { return p.serveInline(s, now) }) {
			defer hooks.OnNotify(p.sess, nil)
		}
	}
	for {
		p.wakeAt.Store(math.MaxInt64)
		grants, backlog, next := p.load()
		if backlog == 0 {
			if err := p.wait(ctx, grants, next, -1, true); err != nil {
				return err
			}
		}
		if ctx.Err() != nil {
			return p.why(ctx)
		}
		p.Step(now())
	}
}

// why says why ctx ended: Close, or the caller's context.
func (p *Producer) why(ctx context.Context) error {
	select {
	case <-p.done:
		return ErrClosed
	default:
		return ctx.Err()
	}
}

// wait sleeps until a request comes, a notification is signalled (a
// Signaling data plane), the first lease runs out, d passes (d >= 0), or
// ctx ends; a data plane that cannot signal is polled every 5 ms while
// grants are live, and an idle producer wakes once a second (waitFor). A
// control plane that is closed ends it with ErrClosed, instead of
// returning at once forever. serving: Serve's, which holds the data plane
// for its whole run; any other caller's loop may step a Pool too.
func (p *Producer) wait(ctx context.Context, grants int, next time.Time, d time.Duration, serving bool) error {
	t := p.cfg.Now()
	wait := p.waitFor(grants, next, t)
	if d >= 0 {
		wait = min(wait, d)
	}
	p.wakeAt.Store(t.Add(wait).UnixNano())
	ready := p.ready
	if serving {
		ready = p.sready
	} else if p.waiter != nil { // Serve holds it for its whole run
		defer p.waiter.Waiting()()
	}
	if wo, ok := plane.As[serverWaiterOr](p.ctl); ok {
		// One select, no goroutine: the wake-up is the latency.
		p.waitMu.Lock()
		defer p.waitMu.Unlock()
		if p.timer == nil {
			p.timer = time.NewTimer(wait)
		} else {
			p.timer.Reset(wait)
		}
		// ready even with no grants: one may be made meanwhile on a
		// control-plane goroutine (serveInline).
		woke := wo.WaitOr(ctx, ready, p.timer.C)
		p.timer.Stop()
		if !woke && ctx.Err() == nil {
			return ErrClosed
		}
		return nil
	}
	wctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	if ready != nil && grants > 0 {
		go func() {
			select {
			case <-ready:
				cancel()
			case <-wctx.Done():
			}
		}()
	}
	if !p.ctl.Wait(wctx) && wctx.Err() == nil {
		return ErrClosed
	}
	return nil
}

// waitFor is how long wait sleeps at now.
func (p *Producer) waitFor(grants int, next, now time.Time) time.Duration {
	wait := time.Second
	switch {
	case grants > 0 && (p.ready == nil || next.IsZero()):
		// Polled: no signal, or grants held past their end by a READ
		// still served, whose release signals nothing.
		wait = 5 * time.Millisecond
	case grants > 0 && !next.IsZero():
		wait = min(wait, max(next.Sub(now), 0)+time.Millisecond)
	}
	return wait
}

// inlineServer is a control plane that runs a function where each request
// arrives (*transport.Server).
type inlineServer interface {
	OnRequest(func())
	Wake()
}

// serveInline steps on the control plane's goroutine that just queued a
// request, or the data plane's that just queued notifications, so that
// they are handled without a hand-off to Serve's goroutine (on a 2-core
// machine that hand-off cost about 40 µs of a 100 µs round trip). If a
// step is under way, it is left to that one's successor, and false
// returned (the control plane wakes Serve for what is still queued, the
// data plane signals). Serve is woken only when the step made its sleep
// too long.
func (p *Producer) serveInline(s inlineServer, now func() time.Time) bool {
	if !p.mu.TryLock() {
		return false
	}
	t := now()
	p.step(t)
	next, _ := p.sess.NextDeadline()
	grants, backlog := p.sess.Grants(), p.waiting.n
	p.mu.Unlock()
	if backlog > 0 || t.Add(p.waitFor(grants, next, t)).UnixNano() < p.wakeAt.Load() {
		s.Wake()
	}
	return true
}

// serverWaiterOr is a control plane that can wait on a data plane's signal
// and a timer too (*transport.Server).
type serverWaiterOr interface {
	WaitOr(ctx context.Context, ready <-chan struct{}, timeout <-chan time.Time) bool
}

// Wait blocks until a Step may have work; false once ctx ends or on Close.
func (p *Producer) Wait(ctx context.Context) bool { return p.WaitFor(ctx, -1) }

// WaitFor is Wait for at most d (negative: no limit).
func (p *Producer) WaitFor(ctx context.Context, d time.Duration) bool {
	grants, backlog, next := p.load()
	if p.isClosed() {
		return false
	}
	if backlog > 0 {
		return true
	}
	return p.wait(ctx, grants, next, d, false) == nil && ctx.Err() == nil
}

func (p *Producer) isClosed() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.closed
}

// Grants returns the grants still holding a pin.
func (p *Producer) Grants() int {
	g, _, _ := p.load()
	return g
}

// load returns the live grants, the requests waiting and when the first
// lease runs out.
func (p *Producer) load() (grants, backlog int, next time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	next, _ = p.sess.NextDeadline()
	return p.sess.Grants(), p.waiting.n, next
}

// Shutdown answers new requests NACK_INTERNAL, steps until the live grants
// end, then closes; past ctx, Close ends the rest (the error wraps ctx's).
func (p *Producer) Shutdown(ctx context.Context) error {
	p.stopGranting()
	for {
		p.Step(p.cfg.Now())
		grants, _, next := p.load()
		if grants == 0 {
			break
		}
		if err := ctx.Err(); err != nil {
			_ = p.Close() // never fails
			return fmt.Errorf("connector: shutdown cut short, grants left: %d: %w", grants, err)
		}
		if p.wait(ctx, grants, next, -1, false) != nil {
			// The control plane is gone; notifications still come.
			t := time.NewTimer(5 * time.Millisecond)
			select {
			case <-ctx.Done():
			case <-t.C:
			}
			t.Stop()
		}
	}
	return p.Close()
}

// stopGranting starts a graceful shutdown: every request from now on is
// answered NACK_INTERNAL, while the live grants end through their
// notifications or leases.
func (p *Producer) stopGranting() {
	p.mu.Lock()
	p.sess.StopGranting()
	p.mu.Unlock()
}

// Close ends every grant and stops Serve; a READ under way (over NIXL, any
// grant) keeps its pin until a Step after it ends. Idempotent; returns nil.
func (p *Producer) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil
	}
	p.closed = true
	close(p.done)
	return p.sess.Close()
}
