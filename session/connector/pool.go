package connector

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math/rand/v2"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/ecxfer/ecxfer/cache"
	"github.com/ecxfer/ecxfer/internal/fsm"
	"github.com/ecxfer/ecxfer/internal/hist"
	"github.com/ecxfer/ecxfer/internal/hooks"
	"github.com/ecxfer/ecxfer/internal/logx"
	"github.com/ecxfer/ecxfer/internal/plane"
	"github.com/ecxfer/ecxfer/internal/ptimer"
	"github.com/ecxfer/ecxfer/internal/shrink"
	"github.com/ecxfer/ecxfer/session"
	"github.com/ecxfer/ecxfer/wire"
	"github.com/ecxfer/ecxfer/xfer"
)

// ControlClient is a Pool's control plane, as *transport.Client provides.
type ControlClient interface {
	Send(addr string, payload []byte) error  // queues a copy, never blocks; refusals wrap xfer.ErrQueueFull, ErrPeerDown, ErrNotAllowed
	Drain(dst []xfer.Inbound) []xfer.Inbound // appends what arrived, none from a connection Dead reported or Remove dropped
	Dead(dst []xfer.Death) []xfer.Death      // appends the producers declared dead since the last call
	Remove(addr string)                      // drops addr's connection without reporting a death
	Wait(ctx context.Context) bool           // blocks until Drain or Dead has something (true) or ctx ends
}

// RetryConfig bounds retries of no ack, NACK_NOT_READY, a failed send or READ.
type RetryConfig struct {
	MaxAttempts             int           // attempts in all; default 5
	MaxElapsed              time.Duration // from the first attempt; default 10 s
	BaseBackoff, MaxBackoff time.Duration // the first backoff, the longest; defaults 20 ms, 1 s
	Jitter                  float64       // ± this fraction of each backoff; default 0.2
}

// PoolConfig configures a Pool. Zero fields take defaults.
type PoolConfig struct {
	CompatHash  string                // wire.CompatHash of this consumer; required
	Xfer        xfer.Config           // READ and quarantine timeouts, pin lease; defaults 20 s, 60 s, 30 s
	AckTimeout  time.Duration         // wait for each attempt's ack; default 2 s
	Retry       RetryConfig           // retries of one fetch
	BlockSize   int                   // bytes in one of Cache's blocks; FetchEntry needs it
	Cache       *cache.EmbeddingCache // over the data plane's blocks; FetchEntry allocates from it
	IdleSession time.Duration         // a producer's session with nothing in flight closes after it; default 1 min
	Seed        uint64                // makes ids and jitter reproducible; zero: crypto/rand
	Logger      *slog.Logger          // nil: slog.Default(); each message at most 5 per 10 s
	Now         func() time.Time      // the clock of the caller's Steps, for Connect; nil: time.Now
}

// pollInterval is Wait's poll of a data plane that does not signal.
const pollInterval = time.Millisecond

func (c PoolConfig) withDefaults() PoolConfig {
	if c.AckTimeout <= 0 {
		c.AckTimeout = 2 * time.Second
	}
	if c.IdleSession <= 0 {
		c.IdleSession = time.Minute
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	r := &c.Retry
	if r.MaxAttempts <= 0 {
		r.MaxAttempts = 5
	}
	if r.MaxElapsed <= 0 {
		r.MaxElapsed = 10 * time.Second
	}
	if r.BaseBackoff <= 0 {
		r.BaseBackoff = 20 * time.Millisecond
	}
	if r.MaxBackoff <= 0 {
		r.MaxBackoff = time.Second
	}
	if r.Jitter <= 0 {
		r.Jitter = 0.2
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	c.Logger = slog.New(logx.RateLimited(c.Logger.Handler(), 5, 10*time.Second))
	return c
}

// Done is a completed fetch: its blocks hold the entry.
type Done struct {
	MMHash  string
	Addr    string
	Blocks  []int         // Fetch's, the caller's again; FetchEntry's: the entry's, not always contiguous
	Latency time.Duration // from Fetch to completion
	Held    bool          // FetchEntry's: call Cache.Unpin(MMHash) once, when done with it
}

// Failure is a fetch that ended without the entry: encode it locally.
type Failure struct {
	MMHash     string
	Addr       string
	Blocks     []int
	Reason     xfer.Reason // why, e.g. xfer.Nacked, xfer.DeadlineExceeded
	Status     wire.Status // the NACK, when Reason is xfer.Nacked
	Err        error       // never nil; matches Reason, Status and cause: errors.Is(f.Err, wire.NackMissing)
	BlocksHeld bool        // a READ may still write: reuse Blocks only after a later Released
}

// String says what failed and why, and whether the blocks are held.
func (f Failure) String() string {
	s := "connector: fetch of " + f.MMHash + " failed: " + f.Reason.String()
	if f.Err != nil {
		s = f.Err.Error()
	}
	if f.BlocksHeld {
		s += " (blocks held until released)"
	}
	return s
}

// Released hands back a BlocksHeld failure's blocks (FetchEntry's: to Cache).
type Released struct {
	MMHash string
	Blocks []int
	Forced bool  // never confirmed stopped (quarantine deadline, Close): keep out of use if you can; FetchEntry's are retired
	Err    error // on a Forced one, why: matches xfer.ErrMayStillWrite, and names what the data plane said
}

// Results are a Step's outcomes, valid until the next Step, Connect or Close.
type Results struct {
	Completed []Done
	Failed    []Failure
	Released  []Released
}

func (r *Results) reset() {
	clear(r.Completed)
	clear(r.Failed)
	clear(r.Released)
	r.Completed, r.Failed, r.Released = r.Completed[:0], r.Failed[:0], r.Released[:0]
}

// Histogram counts durations to within 1 %; a copy is a snapshot.
type Histogram struct {
	Counts [hist.Buckets]uint64
	N      uint64        // durations counted
	Sum    time.Duration // of all of them
	Max    time.Duration // the longest
}

// Quantile returns the q quantile, at most 1 % over the exact one; 0 if empty.
func (h *Histogram) Quantile(q float64) time.Duration {
	if h == nil {
		return 0
	}
	return (*hist.Histogram)(h).Quantile(q)
}

// Mean returns the mean duration; 0 if empty.
func (h *Histogram) Mean() time.Duration {
	if h == nil {
		return 0
	}
	return (*hist.Histogram)(h).Mean()
}

// PoolStats counts what a Pool did.
type PoolStats struct {
	Fetches, Joined, Completed, Failed, Retries uint64
	Nacks                                       session.NackCounts
	AckTimeouts, Quarantines, ForcedEvictions   uint64
	Settled, Released, PeerDeaths               uint64
	BytesMoved                                  uint64
	Malformed                                   uint64 // undecodable acks
	Hits                                        uint64 // FetchEntry's of entries held ready already
	Reaped                                      uint64 // idle sessions closed
	InFlight, Sessions                          int    // fetches not ended; producer sessions held
	FailedBy                                    FailureCounts
	Latency                                     *Histogram // from Fetch to completion; never nil
}

// FailureCounts counts failed fetches by reason.
type FailureCounts map[xfer.Reason]uint64

// String lists the counts: "nacked 1000, register-failed 1", or "none".
func (c FailureCounts) String() string {
	var b strings.Builder
	for _, r := range slices.Sorted(maps.Keys(c)) {
		if c[r] == 0 {
			continue
		}
		if b.Len() > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%s %d", r.String(), c[r])
	}
	if b.Len() == 0 {
		return "none"
	}
	return b.String()
}

// fetch is one mm_hash being fetched, across attempts.
type fetch struct {
	mmHash   string
	addr     string
	blocks   []int
	started  time.Time
	deadline time.Time // the caller's
	attempts int
	retryAt  time.Time // zero while an attempt is in flight
	lastWhy  xfer.Reason
	lastSt   wire.Status
	lastErr  error
	refused  error // a retry's send refused after the last attempt, if one was
	pe       *peer // the session of the current attempt
	managed  bool  // FetchEntry's: the blocks are an entry of the Pool's cache
	// heldOn is the session f waits on while its producer's first
	// answer is on its way (see hold); held says f waited once.
	heldOn *peer
	held   bool
	// endCause is what end ended it for (the producer's death, and what
	// its last attempt met), for the outcome its session reports.
	endCause error
}

// peer is one consumer session and the address it talks to.
type peer struct {
	contacting bool // Connect's contact request was sent on it
	addr       string
	s          *session.ConsumerSession
	msgs       [][]byte
	lastUsed   time.Time // the last attempt started on it
	died       error     // why its control connection was declared dead
}

// Pool fetches entries from producers for a consumer. The engine's rules:
//
//   - Call Step every engine step, even at InFlight() 0; sleep in Wait(For).
//     Only Connect and the waits block; no two methods but Stats run at once.
//   - Each fetch ends once, in a Step's Completed or Failed (Cancel's:
//     returned), at the latest in the first Step past its deadline.
//   - Fetch's blocks are the Pool's until then; after a BlocksHeld Failure,
//     until a later Released.
//   - The Pool retries: on an error or a Failure, encode the entry locally.
//   - FetchEntry's entry completes Held: Cache.Unpin it once, when done.
//   - Close the Pool, then its control and data planes, then the region.
type Pool struct {
	cfg     PoolConfig
	maxWait time.Duration // Wait's longest sleep on a data plane that signals; tests lengthen it
	ctl     ControlClient
	data    xfer.DataTransport
	log     *slog.Logger
	rng     *rand.Rand
	ids     io.Reader
	peers   map[string]*peer
	order   []*peer // the live sessions, in creation order: steps are deterministic
	// draining holds the sessions of dead control connections whose READs
	// run on, or sit in quarantine.
	draining   []*peer
	fetches    map[string]*fetch
	retrying   []*fetch
	spareRetry []*fetch // the last list retryDue walked, for reuse

	res     Results
	inbound []xfer.Inbound
	dead    []xfer.Death
	overdue []string // scratch of endOverdue
	sres    session.Results
	stats   PoolStats
	closed  bool
	reapAt  time.Time // the next look for idle sessions
	// For trim: the most fetches, replies or results a step held since
	// the last trim, and the most fetches since the map was made.
	lately, fetchesMade int

	ready   <-chan struct{} // the data plane's, if it signals (plane.Signaling)
	stepped plane.Stepped   // the data plane's, if it reads in the step
	waiter  plane.Waiter    // the data plane's, told when WaitFor blocks, if it has one
	// own is the control plane's, where WaitFor may read its busy
	// connection itself: the data plane signals nothing, or calls
	// own.Interrupt where it does (unhook stops that, at Close).
	own      plane.OwnWaiter
	hooked   plane.SignalHooked // the data plane, if own hears it through a hook
	unhook   func()
	lastStep time.Time // the now of the last Step
	// nextDeadline is at or before the earliest deadline of the fetches
	// in flight (zero: none): endOverdue looks at them only once it passed.
	nextDeadline time.Time
	published    time.Time     // the now of the last publish
	timer        *time.Timer   // Wait's, reused
	ptimer       *ptimer.Timer // Wait's for waits under preciseBelow

	closedMalformed uint64 // Malformed of sessions closed
	kept            bool   // p.res holds outcomes of Connect's steps, for the next Step
	connecting      bool   // Connect is running
	hits            []Done // FetchEntry's of entries the cache held ready, for the next Step
	sorted          []int  // Fetch's check of its blocks (fsm.DistinctBlocks)
	// held holds the mm_hashes of the failed fetches whose READ may still
	// write, whichever session follows it: no fetch of one starts until
	// its blocks are released, so a release names one fetch. The value
	// says the blocks are FetchEntry's, back to the cache on release.
	held  map[string]bool
	pubMu sync.Mutex
	pub   PoolStats      // what Stats returns, less the histogram
	lat   hist.Histogram // PoolStats.Latency, under pubMu
}

// NewPool returns a Pool; ErrBadConfig without CompatHash, ctl or data.
func NewPool(cfg PoolConfig, ctl ControlClient, data xfer.DataTransport) (*Pool, error) {
	switch {
	case cfg.CompatHash == "":
		return nil, fmt.Errorf("%w: connector: PoolConfig.CompatHash is required", ErrBadConfig)
	case ctl == nil || data == nil:
		return nil, fmt.Errorf("%w: connector: nil control plane or data plane", ErrBadConfig)
	}
	cfg = cfg.withDefaults()
	p := &Pool{cfg: cfg, maxWait: 10 * time.Millisecond, ctl: ctl, data: data, log: cfg.Logger, peers: map[string]*peer{}, fetches: map[string]*fetch{}}
	seed := cfg.Seed
	if seed == 0 {
		seed = rand.Uint64()
		p.ids = nil // crypto/rand
	} else {
		p.ids = rand.NewChaCha8([32]byte{byte(seed), byte(seed >> 8), byte(seed >> 16), byte(seed >> 24), byte(seed >> 32)})
	}
	p.rng = rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	if cs, ok := plane.As[plane.ConsumerSignaling](data); ok {
		p.ready = cs.ConsumerReady() // not a producer's on the same plane
	} else if sg, ok := plane.As[plane.Signaling](data); ok {
		p.ready = sg.Ready()
	}
	p.stepped, _ = plane.As[plane.Stepped](data)
	p.waiter, _ = plane.As[plane.Waiter](data)
	if own, ok := plane.As[plane.OwnWaiter](ctl); ok {
		if p.ready == nil {
			p.own = own
		} else if sh, ok := plane.As[plane.SignalHooked](data); ok {
			p.own, p.hooked, p.unhook = own, sh, sh.OnSignal(own.Interrupt)
			// A Pool dropped without Close leaves no hook on a plane
			// that outlives it.
			runtime.AddCleanup(p, func(f func()) { f() }, p.unhook)
		}
	}
	p.stats.FailedBy = FailureCounts{}
	return p, nil
}

// Stats returns the counters as of the last Step; safe from any goroutine.
func (p *Pool) Stats() PoolStats {
	p.pubMu.Lock()
	defer p.pubMu.Unlock()
	s := p.pub
	lat := Histogram(p.lat)
	s.Latency = &lat
	s.FailedBy = maps.Clone(p.pub.FailedBy)
	if s.FailedBy == nil {
		s.FailedBy = FailureCounts{}
	}
	return s
}

// publish copies the counters for Stats.
func (p *Pool) publish() {
	malformed := p.closedMalformed
	for _, pe := range p.order {
		malformed += pe.s.Stats().Malformed
	}
	for _, pe := range p.draining {
		malformed += pe.s.Stats().Malformed
	}
	p.pubMu.Lock()
	fb := p.pub.FailedBy
	p.pub = p.stats
	p.pub.Malformed = malformed
	p.pub.InFlight, p.pub.Sessions = len(p.fetches)+p.owed(), len(p.order)+len(p.draining)
	if fb == nil {
		fb = FailureCounts{}
	}
	maps.Copy(fb, p.stats.FailedBy)
	p.pub.FailedBy = fb
	p.pubMu.Unlock()
}

func (p *Pool) allPeers() []*peer {
	out := make([]*peer, 0, len(p.order)+len(p.draining))
	out = append(out, p.order...)
	return append(out, p.draining...)
}

// InFlight returns the fetches whose outcome no Step has handed out yet.
func (p *Pool) InFlight() int { return len(p.fetches) + p.owed() }

// owed counts the fetches that ended and whose outcome the next Step
// hands out: FetchEntry's hits, and those Connect's steps ended.
func (p *Pool) owed() int {
	n := len(p.hits)
	if p.kept {
		n += len(p.res.Completed) + len(p.res.Failed)
	}
	return n
}

// Fetch starts fetching mmHash from addr into blocks of the data plane's
// region, to end by deadline. If mmHash is being fetched already, joined is
// true, blocks stay the caller's, and the first fetch's outcome (and deadline)
// is the only one. On error nothing started: ErrClosed, session.ErrBadBlocks, ErrInFlight
// (until a held READ's Released), or the control plane's refusal.
func (p *Pool) Fetch(addr, mmHash string, blocks []int, deadline, now time.Time) (joined bool, err error) {
	if p.closed {
		return false, ErrClosed
	}
	if _, ok := p.fetches[mmHash]; ok {
		p.stats.Joined++
		return true, nil
	}
	if _, ok := p.held[mmHash]; ok {
		return false, fmt.Errorf("%w: %s", ErrInFlight, mmHash)
	}
	if !fsm.DistinctBlocks(blocks, &p.sorted) { // before a hold: its StartXfer comes later
		return false, fmt.Errorf("%w: %v", session.ErrBadBlocks, blocks)
	}
	f := &fetch{mmHash: mmHash, addr: addr, blocks: blocks, started: now, deadline: deadline}
	if !now.Before(deadline) {
		// Over before it starts: nothing is sent, and the next Step ends
		// it as any fetch past its deadline.
		f.retryAt = now
		p.retrying = append(p.retrying, f)
	} else if err := p.attempt(f, now); err != nil {
		// A producer whose death the control plane has not reported yet
		// (a later Step takes the report and drops its connection), or a
		// full queue: the fetch starts, and its first send is retried
		// like any other. Anything else is the caller's to see.
		f.lastWhy, f.lastErr = xfer.PeerDown, err
		if !(errors.Is(err, xfer.ErrPeerDown) || errors.Is(err, xfer.ErrQueueFull)) || p.scheduleRetry(f, now) != retried {
			return false, err
		}
	}
	p.fetches[mmHash] = f
	if p.nextDeadline.IsZero() || deadline.Before(p.nextDeadline) {
		p.nextDeadline = deadline
	}
	p.lately = max(p.lately, len(p.fetches))
	p.fetchesMade = max(p.fetchesMade, len(p.fetches))
	p.stats.Fetches++
	return false, nil
}

// connecter is a control plane that can connect ahead of the first send
// (*transport.Client).
type connecter interface {
	Connect(ctx context.Context, addr string) error
}

// Connect steps until addr is in contact, so the first fetch pays no set-up
// (nil at once for vLLM's); outcomes come in the next Step. Errors:
// ErrContactRefused, xfer.RegisterFailed or BadAck, ctx's, ControlClient's.
func (p *Pool) Connect(ctx context.Context, addr string) error {
	if p.closed {
		return ErrClosed
	}
	now := p.cfg.Now
	p.connecting = true // its own waits wait, outcomes kept or not
	defer func() { p.connecting = false }()
	if c, ok := p.ctl.(connecter); ok {
		if err := c.Connect(ctx, addr); err != nil {
			return err
		}
	}
	var agent string
	var last error // what the latest try that ended met: no answer, a death, a busy producer
	ended := func() error {
		if last == nil {
			return ctx.Err()
		}
		// %v: the error is ctx's, whatever an earlier try met.
		return fmt.Errorf("connector: contact with %s: %w; an earlier try: %v", addr, ctx.Err(), last)
	}
	for agent == "" {
		if ctx.Err() != nil {
			return ended()
		}
		t := now()
		pe, err := p.peer(addr)
		if err != nil {
			return err
		}
		pe.lastUsed = t
		if peer, ok := hooks.ConsumerOf(pe.s).Registered(); ok {
			agent = peer.Agent
			break
		}
		if done, _, _, _ := hooks.ConsumerOf(pe.s).Contacted(); done || !pe.contacting {
			if err := hooks.ConsumerOf(pe.s).Contact(t.Add(p.cfg.AckTimeout), t); err != nil {
				if !errors.Is(err, xfer.ErrPeerDown) && !errors.Is(err, xfer.ErrQueueFull) {
					return err
				}
				if last == nil || errors.Is(err, xfer.ErrPeerDown) { // a full queue follows from what came before
					last = err
				}
				// Its death is reported in a step to come; or a full
				// queue: wait a little.
				p.WaitFor(ctx, pollInterval)
				p.keep()
				p.step(now())
				continue
			}
			pe.contacting = true
		}
		for {
			if !p.WaitFor(ctx, p.cfg.AckTimeout) && ctx.Err() != nil {
				return ended()
			}
			p.keep()
			p.step(now())
			done, again, st, err := hooks.ConsumerOf(pe.s).Contacted()
			if p.peers[addr] != pe || !done {
				if p.peers[addr] != pe {
					if pe.died != nil {
						last = pe.died
					}
					break // it died: a new session asks again
				}
				continue
			}
			pe.contacting = false
			switch {
			case again:
				last = err
			case errors.Is(err, xfer.BadAck): // an answer we cannot read, not a data plane we cannot use
				return fmt.Errorf("connector: contact with %s: %w", addr, err)
			case err != nil:
				return fmt.Errorf("connector: contact with %s: %w: %s: %w", addr, xfer.RegisterFailed, planeHint, err)
			case st == wire.NackMissing:
				return nil // it takes no contact request: the first fetch registers it
			case st.Retryable():
				// Busy (its backlog answered late): ask again.
				last = st
				p.WaitFor(ctx, pollInterval)
			case st != wire.OK:
				return fmt.Errorf("%w: %s: %w", ErrContactRefused, addr, st)
			}
			break
		}
	}
	if c := plane.ContacterOf(p.data); c != nil {
		if p.waiter != nil {
			// The contact waits on the plane's connections, which a loop
			// that stepped may have left for its Steps to read.
			defer p.waiter.Waiting()()
		}
		return c.Contact(ctx, agent, hooks.ConsumerOf(p.peers[addr].s).ContactOf())
	}
	return nil
}

// attempt sends one request for f, or holds it (see hold).
func (p *Pool) attempt(f *fetch, now time.Time) error {
	_, existed := p.peers[f.addr]
	pe, err := p.peer(f.addr)
	if err != nil {
		return err
	}
	if p.hold(f, pe, now) {
		return nil
	}
	f.heldOn = nil // it waits on no session's first answer now
	ackBy := now.Add(p.cfg.AckTimeout)
	if f.deadline.Before(ackBy) {
		ackBy = f.deadline
	}
	if err := pe.s.StartXfer(f.mmHash, f.blocks, ackBy, now); err != nil {
		if !existed && pe.s.InFlight() == 0 {
			// Refused before anything was sent (an address the allowlist
			// refuses, say): leave nothing behind.
			p.dropPeer(pe)
		}
		return err
	}
	pe.lastUsed = now
	f.attempts++
	f.retryAt, f.refused = time.Time{}, nil
	f.pe, f.heldOn = pe, nil
	if _, ok := hooks.ConsumerOf(pe.s).Registered(); !ok {
		// Sent before its producer is registered, it may be the request
		// the others are held behind: its own retries never wait on it.
		f.held = true
	}
	return nil
}

// hold makes f wait, once, while a request to its producer is unanswered
// and the producer not registered yet (Connect's contact, or a first
// fetch): that answer registers it, and the requests sent after say so
// (ecx_known), so that a Go producer describes its region (224 KB for
// 16,000 blocks, to a consumer that takes no shapes) once, not in every
// ack of the first wave. f goes once the producer is registered, its
// first answer came otherwise, its session is gone, or an ack timeout
// passed.
func (p *Pool) hold(f *fetch, pe *peer, now time.Time) bool {
	if f.held || !hooks.ConsumerOf(pe.s).Probing() {
		return false
	}
	f.held, f.heldOn = true, pe
	f.retryAt = now.Add(p.cfg.AckTimeout)
	if f.deadline.Before(f.retryAt) {
		f.retryAt = f.deadline
	}
	p.retrying = append(p.retrying, f)
	return true
}

// waits reports whether f, held, still waits on its producer's first
// answer.
func (p *Pool) waits(f *fetch) bool {
	pe := f.heldOn
	return pe != nil && p.peers[pe.addr] == pe && hooks.ConsumerOf(pe.s).Probing()
}

func (p *Pool) peer(addr string) (*peer, error) {
	if pe := p.peers[addr]; pe != nil {
		return pe, nil
	}
	s, err := session.NewConsumerSession(session.ConsumerConfig{Xfer: p.cfg.Xfer, Logger: p.log, Rand: p.ids},
		sender{p.ctl, addr}, p.data, p.cfg.CompatHash)
	if err != nil {
		return nil, err
	}
	pe := &peer{addr: addr, s: s}
	p.peers[addr] = pe
	p.order = append(p.order, pe)
	return pe, nil
}

type sender struct {
	ctl  ControlClient
	addr string
}

func (s sender) Send(b []byte) error { return s.ctl.Send(s.addr, b) }

// keep makes what is added to p.res from now on go out with the next
// Step's Results (Connect's steps, Close), dropping first what the last
// Step handed out already: each outcome is handed out once.
func (p *Pool) keep() {
	if !p.kept {
		p.res.reset()
		p.kept = true
	}
}

// Step runs one engine step at now and returns its outcomes; it never blocks.
func (p *Pool) Step(now time.Time) *Results {
	if p.kept {
		p.kept = false // Connect's steps' outcomes go out with this one's
	} else {
		p.res.reset()
	}
	p.res.Completed = append(p.res.Completed, p.hits...)
	clear(p.hits)
	p.hits = p.hits[:0]
	return p.step(now)
}

// step is Step, adding to p.res.
func (p *Pool) step(now time.Time) *Results {
	p.lastStep = now
	if p.closed {
		return &p.res
	}
	p.inbound = p.ctl.Drain(p.inbound[:0])
	if p.stepped != nil {
		p.stepped.Step() // lands what came whole, before the sessions look
	}
	p.lately = max(p.lately, len(p.inbound))
	for _, in := range p.inbound {
		if pe := p.peers[in.Addr]; pe != nil {
			pe.msgs = append(pe.msgs, in.Payload)
		}
	}
	clear(p.inbound)
	for _, pe := range p.order {
		pe.s.Poll(pe.msgs, now)
		clear(pe.msgs)
		pe.msgs = pe.msgs[:0]
		p.collect(pe, now)
	}
	// Deaths after the replies that came before them: an ack that arrived
	// still counts.
	p.dead = p.ctl.Dead(p.dead[:0])
	for _, d := range p.dead {
		p.peerDown(d, now)
	}
	clear(p.dead)
	kept := p.draining[:0]
	for _, pe := range p.draining {
		pe.s.Poll(nil, now)
		p.collect(pe, now)
		if pe.s.InFlight() > 0 {
			kept = append(kept, pe)
			continue
		}
		p.closeSession(pe)
	}
	clear(p.draining[len(kept):])
	p.draining = kept
	p.endOverdue(now)
	p.retryDue(now)
	p.lately = max(p.lately, len(p.res.Completed)+len(p.res.Failed)+len(p.res.Released), len(p.retrying))
	p.reapIdle(now)
	// Publish for Stats when the step ended something, else at most once
	// a millisecond of the caller's clock: an idle loop steps often.
	if len(p.res.Completed)+len(p.res.Failed)+len(p.res.Released) > 0 ||
		now.Sub(p.published) >= time.Millisecond || now.Before(p.published) {
		p.publish()
		p.published = now
	}
	return &p.res
}

// dropPeer forgets a live session with nothing in flight, and its
// control-plane connection.
func (p *Pool) dropPeer(pe *peer) {
	delete(p.peers, pe.addr)
	if i := slices.Index(p.order, pe); i >= 0 {
		p.order = slices.Delete(p.order, i, i+1)
	}
	p.ctl.Remove(pe.addr)
	p.closeSession(pe)
}

// reapIdle closes the sessions idle for IdleSession, looking at most four
// times per IdleSession.
// reapDue returns when a Step may first close an idle session (see
// reapIdle), if any session is idle.
func (p *Pool) reapDue() (time.Time, bool) {
	var due time.Time
	for _, pe := range p.order {
		if pe.s.InFlight() > 0 {
			continue
		}
		if t := pe.lastUsed.Add(p.cfg.IdleSession); due.IsZero() || t.Before(due) {
			due = t
		}
	}
	if due.IsZero() {
		return due, false
	}
	if due.Before(p.reapAt) {
		due = p.reapAt
	}
	return due, true
}

func (p *Pool) reapIdle(now time.Time) {
	if now.Before(p.reapAt) {
		return
	}
	p.reapAt = now.Add(p.cfg.IdleSession / 4)
	defer p.trim()
	for i := 0; i < len(p.order); {
		pe := p.order[i]
		if pe.s.InFlight() > 0 || now.Sub(pe.lastUsed) < p.cfg.IdleSession {
			i++
			continue
		}
		p.stats.Reaped++
		p.dropPeer(pe)
	}
}

// trim gives back the memory kept for a past burst: the maps and buffers
// of the pool and of its sessions that are sized for far more than the
// steps since the last trim held shrink to fit (Go's maps never shrink by
// themselves). It runs with reapIdle, four times per IdleSession, so a
// burst's memory is back within half an IdleSession of its end.
func (p *Pool) trim() {
	n := max(p.lately, len(p.fetches))
	p.fetches = shrink.Map(p.fetches, &p.fetchesMade, n)
	p.inbound = shrink.Slice(p.inbound, n)
	p.retrying, p.spareRetry = shrink.Slice(p.retrying, n), shrink.Slice(p.spareRetry, n)
	p.res.Completed, p.res.Failed, p.res.Released = shrink.Slice(p.res.Completed, n), shrink.Slice(p.res.Failed, n), shrink.Slice(p.res.Released, n)
	r := &p.sres
	r.Completed, r.Failed, r.Released = shrink.Slice(r.Completed, n), shrink.Slice(r.Failed, n), shrink.Slice(r.Released, n)
	for _, pe := range p.allPeers() {
		pe.msgs = shrink.Slice(pe.msgs, n)
		hooks.ConsumerOf(pe.s).Trim()
	}
	p.lately = len(p.fetches)
}

// sessions returns how many producer sessions the pool holds: live ones,
// and those of dead control connections still following their READs.
func (p *Pool) sessions() int { return len(p.order) + len(p.draining) }

// peerDown moves the producer's session out of the pool: waiting transfers
// become retryable; READs run on, on their data connections, and are
// followed to their end, a READ that completes a completed fetch (a
// control connection that broke says nothing of the data's); the next
// fetch to addr starts a new session on a new socket.
func (p *Pool) peerDown(d xfer.Death, now time.Time) {
	pe := p.peers[d.Addr]
	if pe == nil {
		return
	}
	p.stats.PeerDeaths++
	pe.died = d.Err
	delete(p.peers, d.Addr)
	for i, o := range p.order {
		if o == pe {
			p.order = append(p.order[:i], p.order[i+1:]...)
			break
		}
	}
	pe.s.PeerDown(now)
	p.collect(pe, now)
	if errors.Is(d.Err, xfer.ErrPeerSilent) {
		// Silent past the peer timeout: hung, stopped or cut off, not a
		// connection that closed and may be made again. The fetches that
		// asked it for anything end now, whatever they wait for (an ack,
		// a READ on this connection or an earlier one, a retry, its first
		// answer), as at their deadline: held where a READ may still
		// write. A fetch that never reached it (its sends refused) goes
		// on, on a new connection.
		for _, h := range p.fetchesOn(pe) {
			p.end(p.fetches[h], xfer.PeerDown, d.Err, now)
		}
	}
	if pe.s.InFlight() > 0 {
		p.draining = append(p.draining, pe)
	} else {
		p.closeSession(pe)
	}
}

func (p *Pool) closeSession(pe *peer) {
	p.closedMalformed += pe.s.Stats().Malformed
	// Nothing should be left; whatever is, is reported, never dropped.
	r := new(session.Results)
	pe.s.TakeResults(r)
	p.apply(pe, r, time.Time{})
	r.Reset()
	_ = pe.s.Close() // never fails
	pe.s.TakeResults(r)
	// What Close ended fails as closed, with no retry: now is zero.
	p.apply(pe, r, time.Time{})
}

func (p *Pool) release(o session.Outcome, forced bool) {
	p.stats.Released++
	if forced {
		p.stats.ForcedEvictions++
	}
	managed := p.held[o.MMHash]
	delete(p.held, o.MMHash)
	switch {
	case !managed:
	case !forced:
		p.giveBack(o.MMHash)
	default:
		// Its READ may still write: its blocks are never handed out again.
		if err := p.cfg.Cache.Retire(o.MMHash); err != nil {
			p.log.Warn("ec consumer: cache entry of a forced release not retired", "mm_hash", o.MMHash, "err", err)
		}
	}
	p.res.Released = append(p.res.Released, Released{MMHash: o.MMHash, Blocks: o.Blocks, Forced: forced, Err: o.Err})
}

// current returns the fetch an outcome of pe's belongs to, or nil if the
// fetch has moved on (a stale session's outcome).
func (p *Pool) current(pe *peer, mmHash string) *fetch {
	if f := p.fetches[mmHash]; f != nil && f.pe == pe {
		return f
	}
	return nil
}

// collect takes a session's outcomes and turns them into fetch results.
func (p *Pool) collect(pe *peer, now time.Time) {
	p.sres.Reset()
	pe.s.TakeResults(&p.sres)
	p.apply(pe, &p.sres, now)
}

// apply turns a session's outcomes into the fetches' (now is zero for a
// session being closed: nothing is retried).
func (p *Pool) apply(pe *peer, r *session.Results, now time.Time) {
	for _, o := range r.Completed {
		f := p.current(pe, o.MMHash)
		if f == nil {
			continue
		}
		delete(p.fetches, o.MMHash)
		held := false
		if f.managed {
			if _, err := p.cfg.Cache.MarkReadyPinned(f.mmHash); err != nil {
				// The engine removed the entry under its fetch: its blocks
				// are not the entry's to hand out.
				p.stats.Failed++
				p.stats.FailedBy[xfer.BadAck]++
				p.res.Failed = append(p.res.Failed, Failure{MMHash: f.mmHash, Addr: f.addr, Blocks: f.blocks, Reason: xfer.BadAck,
					Err: failErr(f.mmHash, f.addr, xfer.BadAck, wire.OK, fmt.Errorf("the cache entry it filled: %w", err))})
				continue
			}
			held = true
		}
		lat := now.Sub(f.started)
		p.stats.Completed++
		p.pubMu.Lock() // the histogram is Stats's to copy, not publish's
		p.lat.Add(lat)
		p.pubMu.Unlock()
		p.stats.BytesMoved += uint64(len(f.blocks) * p.cfg.BlockSize)
		p.res.Completed = append(p.res.Completed, Done{MMHash: f.mmHash, Addr: f.addr, Blocks: f.blocks, Latency: lat, Held: held})
	}
	for _, o := range r.Failed {
		p.countNack(o)
		if o.Reason == xfer.AckTimedOut {
			p.stats.AckTimeouts++
		}
		if o.BlocksHeld {
			p.stats.Quarantines++
		}
		f := p.current(pe, o.MMHash)
		switch {
		case f != nil && f.endCause != nil && o.Err == nil:
			o.Err = f.endCause // what end ended it for (a later connection's death, say)
		case f != nil && f.endCause != nil && !errors.Is(o.Err, f.endCause):
			o.Err = fmt.Errorf("%w; %w", f.endCause, o.Err)
		case o.Reason == xfer.PeerDown && o.Err == nil:
			o.Err = pe.died
		}
		if f == nil {
			continue
		}
		// A failure worth another attempt is retried while the deadline
		// and the budget allow (a new request is a new grant): a NACK_NOT_READY,
		// an ack timeout, a READ that failed (its blocks are free). Not a
		// producer's silence: that ends what asked it (peerDown).
		if o.Retry && !o.BlocksHeld && !now.IsZero() && !errors.Is(o.Err, xfer.ErrPeerSilent) {
			switch p.scheduleRetry(f, now) {
			case retried:
				f.lastWhy, f.lastSt, f.lastErr, f.refused = o.Reason, o.Status, o.Err, nil
				continue
			case pastDeadline:
				// No retry fits before the deadline: the deadline ends it
				// now, rather than at the deadline for nothing.
				p.fail(o.MMHash, xfer.DeadlineExceeded, wire.OK, withLast(f, causeOf(o)), false)
				continue
			}
		}
		if f.endCause == nil { // else end named the earlier attempt
			o.Err = withLast(f, o.Err)
		}
		p.fail(o.MMHash, o.Reason, o.Status, o.Err, o.BlocksHeld)
	}
	for _, o := range r.Released {
		p.stats.Settled++
		p.release(o, o.Forced)
	}
}

// causeOf is what a session's failure says of its cause, as an error.
func causeOf(o session.Outcome) error {
	switch {
	case o.Reason == xfer.Nacked:
		return fmt.Errorf("%w: %w", o.Reason, o.Status)
	case o.Err != nil:
		return fmt.Errorf("%w: %w", o.Reason, o.Err)
	}
	return o.Reason
}

func (p *Pool) countNack(o session.Outcome) {
	if o.Reason == xfer.Nacked && o.Status <= wire.NackNotReady {
		p.stats.Nacks[o.Status]++
	}
}

// fail ends a fetch without the entry.
func (p *Pool) fail(mmHash string, why xfer.Reason, st wire.Status, err error, held bool) {
	f := p.fetches[mmHash]
	if f == nil {
		return
	}
	delete(p.fetches, mmHash)
	switch {
	case held:
		if p.held == nil {
			p.held = map[string]bool{}
		}
		p.held[mmHash] = f.managed
	case f.managed:
		p.giveBack(mmHash)
	}
	p.stats.Failed++
	p.stats.FailedBy[why]++
	p.res.Failed = append(p.res.Failed, Failure{MMHash: mmHash, Addr: f.addr, Blocks: f.blocks, Reason: why, Status: st,
		Err: failErr(mmHash, f.addr, why, st, err), BlocksHeld: held})
}

// giveBack returns a FetchEntry's blocks to the cache: its entry, not
// ready, goes.
func (p *Pool) giveBack(mmHash string) {
	if err := p.cfg.Cache.Discard(mmHash); err != nil {
		p.log.Warn("ec consumer: cache entry of a failed fetch not given back", "mm_hash", mmHash, "err", err)
	}
}

// FetchEntry is Fetch into blocks it allocates in Cache for size bytes; a
// cached entry completes at the next Step. Failed blocks go back to Cache.
// Do not Remove, Discard or Retire the entry meanwhile. Errors: Fetch's,
// ErrBadConfig (no Cache or BlockSize), cache.ErrNoSpace or ErrTooLarge.
func (p *Pool) FetchEntry(addr, mmHash string, size int, deadline, now time.Time) (joined bool, err error) {
	c := p.cfg.Cache
	switch {
	case p.closed:
		return false, ErrClosed
	case c == nil || p.cfg.BlockSize <= 0:
		return false, fmt.Errorf("%w: connector: FetchEntry needs PoolConfig.Cache and BlockSize", ErrBadConfig)
	case size < 0:
		return false, fmt.Errorf("%w: %d bytes", cache.ErrTooLarge, size)
	}
	if _, ok := p.fetches[mmHash]; ok {
		p.stats.Joined++
		return true, nil
	}
	if _, ok := p.held[mmHash]; ok {
		return false, fmt.Errorf("%w: %s: a READ of an earlier fetch may still write", ErrInFlight, mmHash)
	}
	e, err := c.Pin(mmHash)
	switch {
	case err == nil:
		p.stats.Hits++
		p.hits = append(p.hits, Done{MMHash: mmHash, Addr: addr, Blocks: e.Blocks, Held: true})
		return false, nil
	case errors.Is(err, cache.ErrNotReady):
		return false, fmt.Errorf("%w: %s: its cache entry is being written", ErrInFlight, mmHash)
	}
	e, err = c.Alloc(mmHash, (size+p.cfg.BlockSize-1)/p.cfg.BlockSize)
	if err != nil {
		return false, fmt.Errorf("connector: blocks for %s (%d bytes): %w", mmHash, size, err)
	}
	joined, err = p.Fetch(addr, mmHash, e.Blocks, deadline, now)
	if err != nil {
		p.giveBack(mmHash)
		return false, err
	}
	p.fetches[mmHash].managed = true
	return joined, nil
}

// planeHint says what a registration failure most likely means.
const planeHint = "cannot use the producer's data-plane contact; is the producer on this consumer's data plane? " +
	"(the TCP data plane and NIXL cannot read from each other)"

// failErr is a Failure's Err: it says what failed in words, and matches
// the reason, the NACK's status and the cause.
func failErr(mmHash, addr string, why xfer.Reason, st wire.Status, cause error) error {
	at := "connector: fetch of " + mmHash + " from " + addr
	switch {
	case why == xfer.Nacked && cause != nil:
		return fmt.Errorf("%s: %w: %w: %w", at, why, st, cause)
	case why == xfer.Nacked:
		return fmt.Errorf("%s: %w: %w", at, why, st)
	case why == xfer.RegisterFailed && cause != nil:
		return fmt.Errorf("%s: %w: %s: %w", at, why, planeHint, cause)
	case cause != nil:
		return fmt.Errorf("%s: %w: %w", at, why, cause)
	}
	return fmt.Errorf("%s: %w", at, why)
}

// fetchesOn returns the mm_hashes of the fetches that sent a request to
// pe's producer (on pe, or on an earlier connection to it), or wait on
// pe's first answer, sorted, so that what ends them ends them in one
// order.
func (p *Pool) fetchesOn(pe *peer) []string {
	p.overdue = p.overdue[:0]
	for h, f := range p.fetches {
		if f.pe != nil && f.pe.addr == pe.addr || f.heldOn == pe {
			p.overdue = append(p.overdue, h)
		}
	}
	slices.Sort(p.overdue)
	return p.overdue
}

// endOverdue ends every fetch whose deadline has passed, whatever it
// waits for (see Fetch).
func (p *Pool) endOverdue(now time.Time) {
	if p.nextDeadline.IsZero() || now.Before(p.nextDeadline) {
		return
	}
	p.overdue = p.overdue[:0]
	var next time.Time
	for h, f := range p.fetches {
		switch {
		case !now.Before(f.deadline):
			p.overdue = append(p.overdue, h)
		case next.IsZero() || f.deadline.Before(next):
			next = f.deadline
		}
	}
	p.nextDeadline = next
	slices.Sort(p.overdue)
	for _, h := range p.overdue {
		p.end(p.fetches[h], xfer.DeadlineExceeded, nil, now)
	}
}

// end ends f at now for why, caused by cause (the producer's death; nil:
// the reason says it all), where it stands: between attempts nothing
// runs; a request waiting for its ack is forgotten (a late ack's grant is
// given back unread); a READ is stopped where the data plane can stop it
// for certain, and otherwise its blocks are held until it ends.
func (p *Pool) end(f *fetch, why xfer.Reason, cause error, now time.Time) {
	if f == nil {
		return
	}
	if !f.retryAt.IsZero() || f.pe == nil {
		// Nothing of it runs: it fails here, naming what ended it and
		// what its last attempt met.
		p.fail(f.mmHash, why, wire.OK, withLast(f, cause), false)
		return
	}
	if cause != nil { // else the outcome names the earlier attempt, as any does (apply)
		f.endCause = withLast(f, cause)
	}
	if err := hooks.ConsumerOf(f.pe.s).End(f.mmHash, now, why); err != nil {
		p.fail(f.mmHash, why, wire.OK, err, false) // cannot happen: the session holds every fetch on it
		return
	}
	p.collect(f.pe, now)
}

// What scheduleRetry did.
type retryPlan uint8

const (
	noRetry      retryPlan = iota // the retry budget is spent
	retried                       // a retry is planned
	pastDeadline                  // the next retry would come at or after the deadline
)

// scheduleRetry plans the next attempt of f, if the budget and the
// deadline allow one.
func (p *Pool) scheduleRetry(f *fetch, now time.Time) retryPlan {
	r := p.cfg.Retry
	if f.attempts >= r.MaxAttempts || now.Sub(f.started) >= r.MaxElapsed {
		return noRetry
	}
	back := r.BaseBackoff << min(max(f.attempts-1, 0), 30)
	if back > r.MaxBackoff || back <= 0 {
		back = r.MaxBackoff
	}
	back += time.Duration((p.rng.Float64()*2 - 1) * r.Jitter * float64(back))
	at := now.Add(back)
	switch {
	case !at.Before(f.deadline):
		return pastDeadline
	case at.Sub(f.started) >= r.MaxElapsed:
		return noRetry
	}
	f.retryAt = at
	p.retrying = append(p.retrying, f)
	p.stats.Retries++
	return retried
}

// retryDue starts the retries whose backoff has passed. A retry whose send
// is refused again is planned anew, onto a fresh list: planning onto the
// list being walked would lose it, and its fetch would never end.
func (p *Pool) retryDue(now time.Time) {
	due := p.retrying
	p.retrying = p.spareRetry[:0]
	for _, f := range due {
		if p.fetches[f.mmHash] != f { // ended meanwhile (Close)
			continue
		}
		if now.Before(f.retryAt) && (f.heldOn == nil || p.waits(f)) {
			p.retrying = append(p.retrying, f)
			continue
		}
		if err := p.attempt(f, now); err != nil {
			err = fmt.Errorf("connector: retry of %s: %w", f.mmHash, err)
			if errors.Is(err, session.ErrInFlight) || errors.Is(err, xfer.ErrPeerDown) || errors.Is(err, xfer.ErrQueueFull) {
				switch p.scheduleRetry(f, now) {
				case retried:
					if f.lastWhy == xfer.NoReason {
						f.lastWhy, f.lastErr = xfer.PeerDown, err // what a deadline names
					} else {
						f.refused = err // named after what the last attempt met
					}
					continue
				case pastDeadline:
					p.fail(f.mmHash, xfer.DeadlineExceeded, wire.OK, withLast(f, err), false)
					continue
				}
			}
			why := f.lastWhy
			if why == xfer.NoReason { // held, it never sent: its send was refused
				why = xfer.PeerDown
			}
			if why != xfer.Nacked { // failErr names a NACK's status itself
				err = withLast(f, err)
			} else if f.refused != nil && !errors.Is(err, f.refused) {
				err = fmt.Errorf("%w; a retry before it refused: %w", err, f.refused)
			}
			p.fail(f.mmHash, why, f.lastSt, err, false)
		}
	}
	clear(due)
	p.spareRetry = due[:0]
}

// Wait blocks until a Step may have work; false at ctx's end or once closed.
func (p *Pool) Wait(ctx context.Context) bool { return p.WaitFor(ctx, -1) }

// WaitFor is Wait for at most d (negative: no limit).
func (p *Pool) WaitFor(ctx context.Context, d time.Duration) bool {
	if (p.owed() > 0 || p.kept && len(p.res.Released) > 0) && !p.connecting {
		return true // the next Step has outcomes already, Close's included
	}
	if p.closed {
		return false
	}
	if p.waiter != nil {
		defer p.waiter.Waiting()() // its connections go back to their goroutines
	}
	// Held blocks come back in a Step as fetches end: both need polling.
	// With neither, a Step still has an idle session to close in time.
	busy := len(p.fetches) > 0 || len(p.held) > 0
	wait := pollInterval
	if p.ready != nil {
		wait = p.maxWait
	}
	if !busy {
		wait = d
		if due, ok := p.reapDue(); ok && (wait < 0 || due.Sub(p.lastStep) < wait) {
			wait = max(0, due.Sub(p.lastStep))
		}
		if wait < 0 {
			if p.ownWait() {
				if woke, ok := p.own.WaitOwn(ctx, p.ready, -1); ok {
					return woke
				}
			}
			return p.ctl.Wait(ctx)
		}
	}
	if d >= 0 {
		wait = min(wait, d)
	}
	// Retries are due on the caller's clock; measure from the last Step.
	for _, f := range p.retrying {
		wait = min(wait, max(0, f.retryAt.Sub(p.lastStep)))
	}
	if !p.nextDeadline.IsZero() {
		wait = min(wait, max(0, p.nextDeadline.Sub(p.lastStep)))
	}
	if wait >= preciseBelow && p.ownWait() {
		// Its busy connection read by this goroutine: a reply wakes no
		// other.
		if woke, ok := p.own.WaitOwn(ctx, p.ready, wait); ok {
			return woke
		}
	}
	if wo, ok := plane.As[waiterOr](p.ctl); ok {
		// No goroutine, no context: the loop may wait thousands of times
		// a second.
		if wait < preciseBelow {
			// A Go timer this short fires a millisecond late when the
			// process is idle (see internal/ptimer).
			if p.ptimer == nil {
				p.ptimer = ptimer.New()
				// Its goroutine and descriptor outlive a Pool dropped
				// without Close only until the Pool is collected.
				runtime.AddCleanup(p, func(t *ptimer.Timer) { t.Close() }, p.ptimer)
			}
			p.ptimer.Reset(wait)
			woke := wo.WaitOr(ctx, p.ready, p.ptimer.C)
			p.ptimer.Stop()
			return woke
		}
		if p.timer == nil {
			p.timer = time.NewTimer(wait)
		} else {
			p.timer.Reset(wait)
		}
		woke := wo.WaitOr(ctx, p.ready, p.timer.C)
		if !p.timer.Stop() {
			select { // drained by WaitOr, or fired meanwhile
			case <-p.timer.C:
			default:
			}
		}
		return woke
	}
	wctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	if p.ready != nil {
		select {
		case <-p.ready:
			return true
		default:
		}
		go func() {
			select {
			case <-p.ready:
				cancel()
			case <-wctx.Done():
			}
		}()
	}
	if p.ctl.Wait(wctx) {
		return true
	}
	return ctx.Err() == nil
}

// ownWait says whether WaitFor may read its busy connection itself: not
// where a READ's bytes may come pushed (plane.SignalHooked).
func (p *Pool) ownWait() bool {
	return p.own != nil && (p.hooked == nil || !p.hooked.Pushes())
}

// waiterOr is a control plane that can wait on a data plane's signal and a
// timer too (*transport.Client).
type waiterOr interface {
	WaitOr(ctx context.Context, ready <-chan struct{}, timeout <-chan time.Time) bool
}

// Cancel ends mmHash's fetch now and returns its Failure (xfer.Canceled;
// BlocksHeld if its READ runs on). Errors: ErrClosed, ErrNotInFlight.
func (p *Pool) Cancel(mmHash string, now time.Time) (Failure, error) {
	f := p.fetches[mmHash]
	if p.closed {
		return Failure{}, ErrClosed
	}
	if f == nil {
		return Failure{}, fmt.Errorf("%w: %s", ErrNotInFlight, mmHash)
	}
	n := len(p.res.Failed)
	if !f.retryAt.IsZero() || f.pe == nil { // between attempts: nothing runs
		p.fail(mmHash, xfer.Canceled, wire.OK, withLast(f, nil), false)
	} else if err := f.pe.s.Cancel(mmHash, now); err != nil {
		return Failure{}, err
	} else {
		p.collect(f.pe, now)
	}
	// The outcome went where Step's would; hand it over instead, leaving
	// the last Step's Results as they were.
	var out Failure
	for _, fl := range p.res.Failed[n:] {
		if fl.MMHash == mmHash {
			out = fl
		}
	}
	clear(p.res.Failed[n:])
	p.res.Failed = p.res.Failed[:n]
	p.publish()
	if out.MMHash == "" {
		return Failure{}, fmt.Errorf("%w: %s", ErrNotInFlight, mmHash)
	}
	return out, nil
}

// Close ends every fetch (xfer.Closed): Failed and Released in the next Step.
func (p *Pool) Close() error {
	if p.closed {
		return nil
	}
	p.keep()
	p.closed = true
	for _, pe := range p.order {
		p.ctl.Remove(pe.addr)
	}
	for _, pe := range p.allPeers() {
		p.closeSession(pe)
	}
	for _, h := range slices.Sorted(maps.Keys(p.fetches)) {
		p.fail(h, xfer.Closed, wire.OK, withLast(p.fetches[h], nil), false)
	}
	p.peers, p.order, p.draining, p.retrying = nil, nil, nil, nil
	if p.ptimer != nil {
		p.ptimer.Close()
		p.ptimer = nil
	}
	if p.unhook != nil {
		p.unhook()
	}
	p.publish()
	return nil
}

// preciseBelow is the wait under which WaitFor uses a precise timer: a Go
// timer's millisecond of lateness would be most of such a wait, and the
// precise one costs a system call to arm.
const preciseBelow = 2 * time.Millisecond

// lastCause is what f's last attempt met, or nil.
func lastCause(f *fetch) error {
	if f.lastWhy == xfer.NoReason {
		return nil
	}
	c := causeOf(session.Outcome{Reason: f.lastWhy, Status: f.lastSt, Err: f.lastErr})
	if f.refused != nil {
		c = fmt.Errorf("%w; its retry refused: %w", c, f.refused)
	}
	return c
}

// withLast is err (nil: nothing more), naming what f's earlier attempt
// met too, if anything.
func withLast(f *fetch, err error) error {
	switch {
	case f.lastWhy == xfer.NoReason || err != nil && errors.Is(f.lastErr, err): // Is: == panics on some error types
		return err
	case err == nil:
		return fmt.Errorf("an earlier attempt: %w", lastCause(f))
	}
	return fmt.Errorf("%w; an earlier attempt: %w", err, lastCause(f))
}
