// Package sim is a deterministic simulation of producers and consumers
// under faults: one seeded generator decides everything, a fake clock moves
// in steps, the control plane is an in-memory channel that drops,
// duplicates, reorders, delays and refuses sends, and the data plane is
// xfertest's fake with READs that stall, fail, finish late or cannot be
// stopped, and notifications that come late and out of order. Producers
// crash, restart, are drained, share agent names, and keep saving new
// entries that evict old ones and overwrite their blocks, so a pin dropped
// too early shows as wrong bytes. Some producers speak as vLLM's does:
// their replies name no attempt, grant, token or lease, and their
// connections keep ZeroMQ's guarantees (order, no duplicates), while
// replies are still lost or delayed past the consumer's retries. Every
// write of a producer block carries its time, so a completion is checked
// to carry no byte written after its grant's lease ended. After every step
// the invariants are checked; a violation carries the seed and the events
// that led to it, and Run with that seed replays it exactly.
package sim

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"log/slog"
	"maps"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/ecxfer/ecxfer/cache"
	"github.com/ecxfer/ecxfer/internal/hooks"
	"github.com/ecxfer/ecxfer/internal/wirext"
	"github.com/ecxfer/ecxfer/internal/xfake"
	"github.com/ecxfer/ecxfer/session/connector"
	"github.com/ecxfer/ecxfer/wire"
	"github.com/ecxfer/ecxfer/xfer"
)

// Faults are per-event probabilities.
type Faults struct {
	Drop, Dup, Delay float64 // per control message
	MaxDelay         int     // steps a delayed message waits at most
	ReadStall        float64 // READ stuck until the simulator ends it
	ReadFail         float64
	ReadSlow         float64 // READ takes many checks
	CheckFail        float64 // state checks fail until it ends
	Unstoppable      float64 // a stuck READ cannot be released
	ProducerRestart  float64 // per producer per step
	ConsumerRestart  float64 // per consumer per step
	SpuriousDown     float64 // per consumer per step: a live producer reported dead
	ClockJump        float64 // per step: the clock leaps 0.5-10 s
	LateSave         float64 // an entry's save lands late
	SendRefuse       float64 // a control-plane send fails with ErrQueueFull
	SendDie          float64 // the producer's connection dies as a request is sent
	NotifDelay       float64 // a READ's notification arrives 1-40 drains late
	ProducerDrain    float64 // per producer per step: drained, then restarted
	Churn            float64 // per producer per step: a new entry is saved, evicting
	Cancel           float64 // per consumer per step: one fetch in flight is canceled
	LateReply        float64 // a reply waits 0.25-1.2 s: past its attempt's ack timeout and retry
}

// DefaultFaults are the rates CI runs with.
func DefaultFaults() Faults {
	return Faults{Drop: 0.03, Dup: 0.03, Delay: 0.1, MaxDelay: 20, ReadStall: 0.05, ReadFail: 0.05, ReadSlow: 0.1,
		CheckFail: 0.03, Unstoppable: 0.3, ProducerRestart: 0.001, ConsumerRestart: 0.0005, SpuriousDown: 0.001,
		ClockJump: 0.002, LateSave: 0.2, SendRefuse: 0.02, SendDie: 0.002, NotifDelay: 0.2, ProducerDrain: 0.001,
		Churn: 0.05, Cancel: 0.01, LateReply: 0.03}
}

// Config shapes one run.
type Config struct {
	Seed      uint64
	Steps     int // steps with faults
	Quiet     int // steps without faults after them; every fetch must end
	Producers int
	Consumers int
	Entries   int // per producer
	Blocks    int // per consumer
	Faults    Faults
	Trace     int // events kept for a violation report
	// VLLM producers (the last ones) speak as vLLM's: they see requests
	// without this library's extensions and send replies without them.
	VLLM int
	// Managed consumers (the first ones) fetch with FetchEntry into a
	// cache of their blocks, which the pool allocates and takes back;
	// they hold what completed for a few steps, then let it go.
	Managed int
	// ShortDeadlines is the share of fetches, with faults on, whose
	// deadline is 50-600 ms away: it fires in every stage of a fetch.
	ShortDeadlines float64
}

// DefaultConfig is the shape CI runs, for seed.
func DefaultConfig(seed uint64) Config {
	return Config{Seed: seed, Steps: 2000, Quiet: 1500, Producers: 3, Consumers: 3, Entries: 24, Blocks: 24,
		Faults: DefaultFaults(), Trace: 40, VLLM: 1, Managed: 1, ShortDeadlines: 0.2}
}

// The simulated timeouts keep the reference's order (ack < read < lease <
// read + quarantine) at a scale a few thousand 10 ms steps cover.
const (
	stepLen     = 10 * time.Millisecond
	ackTimeout  = 200 * time.Millisecond
	idleSession = 2 * time.Second
	blockSize   = 16 // 8 bytes of the entry, then when they were written
	churnSlack  = 6  // producer blocks beyond its base entries: saves evict
)

var xcfg = xfer.Config{ReadTimeout: time.Second, QuarantineTimeout: 3 * time.Second, PinLease: 1500 * time.Millisecond}

// Violation is a broken invariant.
type Violation struct {
	Seed  uint64
	Step  int
	What  string
	Trace []string
}

func (v *Violation) Error() string {
	return fmt.Sprintf("seed %d, step %d: %s\nlast events:\n  %s", v.Seed, v.Step, v.What, strings.Join(v.Trace, "\n  "))
}

// Stats counts what a run did.
type Stats struct {
	Fetches, Completed, Failed, Released, Forced int
	Messages, Dropped, Duplicated                int
	ProducerRestarts, ConsumerRestarts, Jumps    int
	Stalls, Refused, Drains, Saves, Canceled     int
	LateReplies                                  int
	Reaped                                       int // idle sessions the pools closed
	Deadlines                                    int // fetches ended by their deadline
	Hits                                         int // managed fetches of entries the cache held ready
}

func (s *Stats) add(o Stats) {
	s.Fetches += o.Fetches
	s.Completed += o.Completed
	s.Failed += o.Failed
	s.Released += o.Released
	s.Forced += o.Forced
	s.Messages += o.Messages
	s.Dropped += o.Dropped
	s.Duplicated += o.Duplicated
	s.ProducerRestarts += o.ProducerRestarts
	s.ConsumerRestarts += o.ConsumerRestarts
	s.Reaped += o.Reaped
	s.Jumps += o.Jumps
	s.Stalls += o.Stalls
	s.Refused += o.Refused
	s.Drains += o.Drains
	s.Saves += o.Saves
	s.Canceled += o.Canceled
	s.LateReplies += o.LateReplies
	s.Deadlines += o.Deadlines
	s.Hits += o.Hits
}

type msg struct {
	due     int
	seq     int // sending order: an ordered connection delivers in it
	toProd  bool
	ordered bool   // on a connection that keeps ZeroMQ's order (vLLM's peers)
	addr    string // the producer
	cons    int    // the consumer
	conn    int    // the consumer's connection generation to addr
	payload []byte
	// An OK ack's grant: its lease's end, and the grant's key.
	leaseEnd time.Time
	grantKey string // "<session_id>:<mm_hash>"
}

type producer struct {
	addr    string
	name    string // the data plane's agent name: producers may share one
	label   string // names its entries: unique
	vllm    bool   // speaks as vLLM's producer
	gen     int
	saves   int      // churn entries saved so far
	extra   []string // churn entries it may hold
	drainAt int      // the step a drain began; -1 when not draining
	names   []string // entryName, made once
	// scribbled entries: unpinned, their blocks overwritten (see rest)
	scribbled map[string]bool
	data      *xfake.Fake
	cache     *cache.EmbeddingCache
	prod      *connector.Producer
	srv       *simServer
	pending   []string // saves not landed yet
}

type fetch struct {
	hash     string
	addr     string
	blocks   []int // nil for a managed consumer's: the pool's
	start    int
	mustEnd  int       // step by which it must have completed (0: no promise)
	deadline time.Time // by which it must have ended
	hit      bool      // a managed fetch of an entry its cache held ready
}

type consumer struct {
	id       int
	data     *xfake.Fake
	pool     *connector.Pool
	ctl      *simClient
	free     []int
	held     map[string][]int // failed with blocks held, by mm_hash
	poisoned []int            // forced out while a READ may write: kept out of use
	inflight map[string]*fetch
	stuck    map[xfer.Handle]int // READs the simulator ends later: step
	// granted: per "<session_id>:<mm_hash>", the latest end of a lease
	// among the OK acks delivered to it. reads: per mm_hash, the last
	// READ posted, and the end of its grant's lease.
	granted map[string]time.Time
	reads   map[string]read
	// A managed consumer's cache (the pool allocates its blocks), the
	// entries it holds (step to let go), and the blocks retired by forced
	// releases.
	cache   *cache.EmbeddingCache
	owned   map[string]ownedEntry
	retired map[int]bool
}

type ownedEntry struct {
	blocks []int
	until  int
}

type read struct {
	local    []int
	leaseEnd time.Time
}

type sim struct {
	cfg   Config
	rng   *rand.Rand
	step  int
	now   time.Time
	fab   *xfake.Fabric
	prods []*producer
	cons  []*consumer
	net   []msg
	trace []string
	stats Stats
	log   *slog.Logger
	err   *Violation
	// watch hands each new producer to a goroutine that reads its stats
	// while the simulation steps it, as a metrics exporter would.
	watch chan *connector.Producer
	tock  chan struct{} // a step began: the watcher reads
	// retired agents of drained producers, closed later
	retired []retiredAgent
	seq     int
	lastDue map[connKey]int      // ordered connections: the due step of the last message
	grants  map[uint64]time.Time // the end of each Go grant's lease, by id
}

type connKey struct {
	toProd     bool
	addr       string
	cons, conn int
}

// simLogger discards, unless ECXFER_SIM_LOG is set (replaying a seed).
func simLogger() *slog.Logger {
	if os.Getenv("ECXFER_SIM_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// Run simulates cfg and returns its stats, or the first violation.
func Run(cfg Config) (Stats, error) {
	s := &sim{cfg: cfg, rng: rand.New(rand.NewPCG(cfg.Seed, cfg.Seed*0x9e3779b97f4a7c15+1)),
		now: time.Unix(1_700_000_000, 0), fab: xfake.NewFabric(), lastDue: map[connKey]int{}, grants: map[uint64]time.Time{},
		log: simLogger(), watch: make(chan *connector.Producer, 64), tock: make(chan struct{}, 1)}
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		var ps []*connector.Producer
		for {
			select {
			case p, ok := <-s.watch:
				if !ok {
					return
				}
				ps = append(ps, p)
			case <-s.tock:
				// Read while the next step runs.
				for _, p := range ps {
					_ = p.Stats()
					_ = p.Grants()
					p.Backlog()
				}
			}
		}
	}()
	defer func() { close(s.watch); <-watched }()
	for i := range cfg.Producers {
		// Every third producer shares the first one's agent name, as
		// replicas configured with one name do.
		name := fmt.Sprintf("p%d", i)
		if i%3 == 2 {
			name = "p0"
		}
		p := &producer{addr: fmt.Sprintf("tcp://producer-%d:5555", i), name: name, label: fmt.Sprintf("p%d", i), drainAt: -1,
			vllm: i >= cfg.Producers-cfg.VLLM}
		for j := range cfg.Entries + 2 {
			p.names = append(p.names, fmt.Sprintf("%s-e%02d", p.label, j))
		}
		s.prods = append(s.prods, p)
		s.startProducer(p)
	}
	for i := range cfg.Consumers {
		c := &consumer{id: i, data: s.fab.New(fmt.Sprintf("c%d", i), cfg.Blocks, blockSize),
			held: map[string][]int{}, inflight: map[string]*fetch{}, stuck: map[xfer.Handle]int{},
			granted: map[string]time.Time{}, reads: map[string]read{}}
		if i < cfg.Managed {
			c.cache, c.owned, c.retired = cache.NewEmbeddingCache(cfg.Blocks), map[string]ownedEntry{}, map[int]bool{}
		}
		for b := range cfg.Blocks {
			c.free = append(c.free, b)
		}
		c.data.SetOutcomeFunc(func(p xfake.Post) xfake.Outcome { return s.readOutcome(c, p) })
		s.cons = append(s.cons, c)
		s.startPool(c)
	}
	total := cfg.Steps + cfg.Quiet
	for s.step = 0; s.step < total && s.err == nil; s.step++ {
		s.tick()
	}
	if s.err == nil {
		s.finish()
	}
	if s.err != nil {
		return s.stats, s.err
	}
	return s.stats, nil
}

func (s *sim) faulty() bool { return s.step < s.cfg.Steps }

func (s *sim) chance(p float64) bool { return s.faulty() && s.rng.Float64() < p }

func (s *sim) event(format string, args ...any) {
	if s.cfg.Trace == 0 {
		return
	}
	if len(s.trace) == s.cfg.Trace {
		s.trace = s.trace[1:]
	}
	s.trace = append(s.trace, fmt.Sprintf("%5d ", s.step)+fmt.Sprintf(format, args...))
}

func (s *sim) fail(format string, args ...any) {
	if s.err == nil {
		s.err = &Violation{Seed: s.cfg.Seed, Step: s.step, What: fmt.Sprintf(format, args...), Trace: slices.Clone(s.trace)}
	}
}

// entry sizes and contents are fixed functions of the producer and index,
// so a restarted producer saves the same bytes again. A block holds 8
// bytes of its entry, then the time they were written (stamp).
func entryName(p *producer, i int) string {
	if i < len(p.names) {
		return p.names[i]
	}
	return fmt.Sprintf("%s-e%02d", p.label, i)
}
func entrySize(i int) int { return 1 + i%3 }
func fill(b []byte, hash string, j int) {
	h := fnv.New64a()
	h.Write([]byte(hash))
	binary.LittleEndian.PutUint64(b, h.Sum64()+uint64(j)*0x9e3779b97f4a7c15)
}

// write writes block j of entry hash into b at now; scribble writes
// zeros, as a reuse of the block.
func write(b []byte, hash string, j int, now time.Time) {
	fill(b, hash, j)
	binary.LittleEndian.PutUint64(b[8:], uint64(now.UnixNano()))
}

func scribble(b []byte, now time.Time) {
	clear(b[:8])
	binary.LittleEndian.PutUint64(b[8:], uint64(now.UnixNano()))
}

// stamp returns when b's bytes were written.
func stamp(b []byte) time.Time { return time.Unix(0, int64(binary.LittleEndian.Uint64(b[8:]))) }

func (s *sim) startProducer(p *producer) {
	blocks := churnSlack
	for i := range s.cfg.Entries {
		blocks += entrySize(i)
	}
	p.data = s.fab.New(p.name, blocks, blockSize) // a new peer, with new metadata
	p.cache = cache.NewEmbeddingCache(blocks)
	p.extra = p.extra[:0]
	p.drainAt = -1
	p.scribbled = map[string]bool{}
	p.srv = &simServer{s: s, p: p}
	var err error
	pcfg := connector.ProducerConfig{CompatHash: "sim", PinLease: xcfg.PinLease, Logger: s.log, MaxPerPeerPerStep: 16}
	if p.vllm {
		// vLLM's producer bounds no consumer's pins. (Ours, serving a
		// consumer that names no grant, ends the oldest grant of a key
		// per notification: grants whose acks the consumer dropped then
		// stay live while the key is fetched more often than the lease,
		// and the bounds would refuse ready entries.)
		pcfg.MaxGrantsPerEntry, pcfg.MaxPinnedShare = 1<<16, 1
	}
	p.prod, err = connector.NewProducer(pcfg, p.srv, p.data, p.cache)
	if err != nil {
		s.fail("producer: %v", err)
		return
	}
	select {
	case s.watch <- p.prod:
	default: // the watcher is behind: it skips this one
	}
	p.pending = p.pending[:0]
	for i := range s.cfg.Entries {
		h := entryName(p, i)
		e, err := p.cache.Alloc(h, entrySize(i))
		if err != nil {
			s.fail("producer alloc: %v", err)
			return
		}
		for j, b := range e.Blocks {
			write(p.data.Block(b), h, j, s.now)
		}
		if s.chance(s.cfg.Faults.LateSave) {
			p.pending = append(p.pending, h)
		} else {
			p.cache.MarkReady(h)
		}
	}
}

func (s *sim) startPool(c *consumer) {
	c.ctl = &simClient{s: s, c: c, conn: map[string]int{}, down: map[string]bool{}}
	var err error
	c.pool, err = connector.NewPool(connector.PoolConfig{CompatHash: "sim", Xfer: xcfg, AckTimeout: ackTimeout,
		Retry:     connector.RetryConfig{MaxAttempts: 4, MaxElapsed: 2 * time.Second, BaseBackoff: 20 * time.Millisecond, MaxBackoff: 200 * time.Millisecond},
		BlockSize: blockSize, Seed: s.rng.Uint64() | 1, Logger: s.log, Cache: c.cache,
		// Short, so that sessions are reaped (and their connections
		// dropped) in a run, some while a death is on its way.
		IdleSession: idleSession}, c.ctl, c.data)
	if err != nil {
		s.fail("pool: %v", err)
	}
}

// readOutcome draws how a READ ends, and notes the end of the lease of
// the grant it reads under: the one its notification names, else the
// latest delivered to its session for its mm_hash (no earlier than the
// grant the consumer took).
func (s *sim) readOutcome(c *consumer, p xfake.Post) xfake.Outcome {
	key, id, _, named := wirext.SplitNotifGrant([]byte(p.Notif))
	end, ok := c.granted[p.Notif]
	if named {
		end, ok = s.grants[id]
	}
	if !ok {
		s.fail("c%d: READ %s posted with no grant delivered for it", c.id, p.Notif)
	}
	_, h, _ := strings.Cut(string(key), ":")
	if !named {
		_, h, _ = strings.Cut(p.Notif, ":")
	}
	c.reads[h] = read{local: p.Local, leaseEnd: end}
	o := s.drawOutcome(c, p)
	if s.chance(s.cfg.Faults.NotifDelay) {
		o.NotifDelay = 1 + s.rng.IntN(40)
	}
	return o
}

func (s *sim) drawOutcome(c *consumer, p xfake.Post) xfake.Outcome {
	f := s.cfg.Faults
	switch r := s.rng.Float64(); {
	case !s.faulty():
		return xfake.Outcome{After: s.rng.IntN(3)}
	case r < f.ReadStall:
		s.stats.Stalls++
		c.stuck[p.Handle] = s.step + 1 + s.rng.IntN(600)
		s.event("c%d READ %d %s stalls", c.id, p.Handle, p.Notif[37:])
		return xfake.Outcome{Kind: xfake.Stuck, Unstoppable: s.rng.Float64() < f.Unstoppable}
	case r < f.ReadStall+f.ReadFail:
		return xfake.Outcome{Kind: xfake.FailAfter, After: s.rng.IntN(5)}
	case r < f.ReadStall+f.ReadFail+f.CheckFail:
		c.stuck[p.Handle] = s.step + 1 + s.rng.IntN(300)
		return xfake.Outcome{Kind: xfake.CheckError, After: s.rng.IntN(3), Unstoppable: s.rng.Float64() < f.Unstoppable}
	case r < f.ReadStall+f.ReadFail+f.CheckFail+f.ReadSlow:
		return xfake.Outcome{After: 5 + s.rng.IntN(200)}
	default:
		return xfake.Outcome{After: s.rng.IntN(3)}
	}
}

func (s *sim) tick() {
	select {
	case s.tock <- struct{}{}:
	default:
	}
	s.now = s.now.Add(stepLen)
	if s.chance(s.cfg.Faults.ClockJump) {
		j := 500*time.Millisecond + time.Duration(s.rng.Int64N(int64(10*time.Second)))
		s.now = s.now.Add(j)
		s.stats.Jumps++
		s.event("clock jumps %v", j)
	}
	for _, p := range s.prods {
		switch {
		case s.chance(s.cfg.Faults.ProducerRestart):
			s.restartProducer(p)
		case p.drainAt < 0 && s.chance(s.cfg.Faults.ProducerDrain):
			p.drainAt = s.step
			s.stats.Drains++
			s.event("%s drains", p.label)
			hooks.StopGranting(p.prod)
		case p.drainAt >= 0 && (p.prod.Grants() == 0 || s.step-p.drainAt > 160):
			// Drained (or its grants' leases are long over): a planned
			// restart, in a process that lives on and reuses the memory.
			s.retire(p)
		}
		if s.chance(s.cfg.Faults.Churn) {
			s.save(p)
		}
	}
	for _, c := range s.cons {
		if s.chance(s.cfg.Faults.ConsumerRestart) {
			s.restartConsumer(c)
		}
		if s.chance(s.cfg.Faults.SpuriousDown) {
			p := s.prods[s.rng.IntN(len(s.prods))]
			// Half of them as a silence (its READs end), half as a
			// connection that closed (they run on).
			silent := s.rng.IntN(2) == 0
			s.event("c%d told %s died (it did not; silent %v)", c.id, p.name, silent)
			c.ctl.peerDown(p.addr, silent)
		}
		s.endStuck(c)
		if len(c.inflight) > 0 && s.chance(s.cfg.Faults.Cancel) {
			s.cancel(c)
		}
	}
	s.retired = slices.DeleteFunc(s.retired, func(r retiredAgent) bool {
		if r.closeAt <= s.step || !s.faulty() {
			r.data.Close()
			return true
		}
		return false
	})
	s.deliver()
	for _, p := range s.prods {
		p.prod.Step(s.now)
		s.rest(p)
		// Saves land over time.
		kept := p.pending[:0]
		for _, h := range p.pending {
			if s.rng.IntN(100) == 0 || !s.faulty() {
				p.cache.MarkReady(h)
				continue
			}
			kept = append(kept, h)
		}
		p.pending = kept
	}
	for _, c := range s.cons {
		s.startFetches(c)
		s.collect(c, c.pool.Step(s.now))
		if c.cache != nil {
			s.letGo(c, !s.faulty() && s.step >= s.cfg.Steps+s.cfg.Quiet-100)
		}
	}
	s.check()
}

// endStuck finishes or fails READs whose time has come; with faults over,
// every one ends at once.
func (s *sim) endStuck(c *consumer) {
	for _, h := range slices.Sorted(maps.Keys(c.stuck)) {
		if at := c.stuck[h]; at <= s.step || !s.faulty() {
			delete(c.stuck, h)
			if s.rng.IntN(3) == 0 {
				c.data.FailRead(h)
			} else {
				c.data.Finish(h)
			}
		}
	}
}

// rest models what a producer may do with the blocks of an entry nobody
// has pinned: reuse them. After the producer's step every unpinned entry's
// blocks are scribbled over, until a grant pins it again and they are
// restored; a READ that completes meanwhile copies the scribbles. So a pin
// dropped while a READ still runs under it shows as wrong bytes in a
// completed fetch, the moment it happens, not only when an eviction
// happens to hit it. (A READ that outlives its grant's lease is the
// consumer's to refuse: it sees the completion after the lease and does not
// promote it.)
func (s *sim) rest(p *producer) {
	for i := range s.cfg.Entries + len(p.extra) {
		h := ""
		if i < s.cfg.Entries {
			h = entryName(p, i)
		} else {
			h = p.extra[i-s.cfg.Entries]
		}
		e, ok := p.cache.Get(h)
		if !ok || !e.Ready || (e.Pins == 0) == p.scribbled[h] {
			continue
		}
		p.scribbled[h] = e.Pins == 0
		for j, b := range e.Blocks {
			if e.Pins == 0 {
				scribble(p.data.Block(b), s.now)
			} else {
				write(p.data.Block(b), h, j, s.now)
			}
		}
	}
}

// save stores a new entry, evicting the oldest unpinned ones, and writes
// its bytes over whatever the evicted entries held.
func (s *sim) save(p *producer) {
	h := fmt.Sprintf("%s-n%d", p.label, p.saves)
	p.saves++
	e, err := p.cache.Alloc(h, 1+s.rng.IntN(3))
	if err != nil {
		return // everything pinned: the save is refused, nothing evicted
	}
	s.stats.Saves++
	for j, b := range e.Blocks {
		write(p.data.Block(b), h, j, s.now)
	}
	p.cache.MarkReady(h)
	delete(p.scribbled, h)
	// Forget the saves evicted since: what is left fits in the cache.
	p.extra = slices.DeleteFunc(p.extra, func(x string) bool { _, ok := p.cache.Get(x); return !ok })
	p.extra = append(p.extra, h)
}

// cancel cancels one fetch in flight.
func (s *sim) cancel(c *consumer) {
	hs := slices.Sorted(maps.Keys(c.inflight))
	h := hs[s.rng.IntN(len(hs))]
	f, err := c.pool.Cancel(h, s.now)
	if err != nil {
		s.fail("c%d: cancel of %s in flight: %v", c.id, h, err)
		return
	}
	s.stats.Canceled++
	s.event("c%d cancels %s held=%v", c.id, h, f.BlocksHeld)
	s.collect(c, &connector.Results{Failed: []connector.Failure{f}})
}

// retire closes a drained producer and starts its successor. The old
// agent lives on a while (the process reuses its memory) before it goes: a
// READ still running against it completes with scribbles, which only a
// READ past its grant's lease may do, and the consumer must refuse.
func (s *sim) retire(p *producer) {
	s.event("%s drained (%d grants left); restarts", p.label, p.prod.Grants())
	p.prod.Close()
	old := p.data
	for b := range old.Blocks() {
		scribble(old.Block(b), s.now)
	}
	s.retired = append(s.retired, retiredAgent{old, s.step + 300})
	p.data = nil
	s.restartProducer(p)
}

type retiredAgent struct {
	data    *xfake.Fake
	closeAt int
}

func (s *sim) restartProducer(p *producer) {
	p.gen++
	s.stats.ProducerRestarts++
	s.event("%s restarts (gen %d)", p.label, p.gen)
	p.prod.Close()
	if p.data != nil {
		p.data.Close() // the process is gone: READs still running fail
	}
	// Its connections break: in-flight messages are lost, consumers see
	// the death.
	s.net = slices.DeleteFunc(s.net, func(m msg) bool { return m.addr == p.addr })
	for _, c := range s.cons {
		c.ctl.peerDown(p.addr, false)
	}
	s.startProducer(p)
}

func (s *sim) restartConsumer(c *consumer) {
	s.stats.ConsumerRestarts++
	s.event("c%d restarts", c.id)
	s.stats.Reaped += int(c.pool.Stats().Reaped)
	c.pool.Close()
	s.collect(c, c.pool.Step(s.now)) // what Close ended
	if len(c.inflight) > 0 {
		s.fail("c%d: %d fetches without an outcome after Close", c.id, len(c.inflight))
	}
	s.net = slices.DeleteFunc(s.net, func(m msg) bool { return m.cons == c.id })
	s.startPool(c)
}

// startFetches asks for entries while there are blocks; during the quiet
// phase a fetch of a ready entry must complete.
func (s *sim) startFetches(c *consumer) {
	if s.step >= s.cfg.Steps+s.cfg.Quiet-400 {
		return // the tail drains
	}
	for range 2 {
		p := s.prods[s.rng.IntN(len(s.prods))]
		i := s.rng.IntN(s.cfg.Entries + 2) // some are absent: NACK_MISSING
		h := entryName(p, i)
		n := entrySize(i)
		if len(p.extra) > 0 && s.rng.IntN(4) == 0 {
			h = p.extra[s.rng.IntN(len(p.extra))]
			e, ok := p.cache.Get(h)
			if !ok {
				continue
			}
			n = len(e.Blocks)
		}
		if _, busy := c.inflight[h]; busy || c.cache == nil && len(c.free) < n {
			continue
		}
		if _, held := c.held[h]; held {
			continue // the pool would refuse it: a READ for it may still run
		}
		deadline := s.now.Add(5 * time.Second)
		short := s.chance(s.cfg.ShortDeadlines)
		if short {
			deadline = s.now.Add(50*time.Millisecond + time.Duration(s.rng.IntN(56))*stepLen)
		}
		f := &fetch{hash: h, addr: p.addr, start: s.step, deadline: deadline}
		if c.cache != nil {
			if _, owned := c.owned[h]; owned {
				continue // one hold at a time, in this engine
			}
			e, ok := c.cache.Get(h)
			f.hit = ok && e.Ready
			joined, err := c.pool.FetchEntry(p.addr, h, n*blockSize-blockSize/2, deadline, s.now)
			switch {
			case joined:
				s.fail("c%d: FetchEntry of %s joined a fetch the engine does not know", c.id, h)
			case errors.Is(err, cache.ErrNoSpace) || errors.Is(err, connector.ErrInFlight):
				continue
			case err != nil:
				s.fail("c%d: FetchEntry of %s: %v", c.id, h, err)
				continue
			}
		} else {
			f.blocks = slices.Clone(c.free[len(c.free)-n:])
			joined, err := c.pool.Fetch(p.addr, h, f.blocks, deadline, s.now)
			if joined || err != nil {
				continue
			}
			c.free = c.free[:len(c.free)-n]
		}
		if e, ok := p.cache.Get(h); ok && e.Ready && s.step > s.cfg.Steps+200 && !short {
			f.mustEnd = s.step + 150
		}
		c.inflight[h] = f
		s.stats.Fetches++
		s.event("c%d fetch %s blocks %v by +%v", c.id, h, f.blocks, deadline.Sub(s.now))
	}
}

// collect applies a pool's results to the consumer's block allocator,
// checking that nothing is freed while a READ may still write into it.
func (s *sim) collect(c *consumer, r *connector.Results) {
	for _, d := range r.Completed {
		f := c.inflight[d.MMHash]
		if f == nil {
			s.fail("c%d: completion of %s, not in flight", c.id, d.MMHash)
			return
		}
		delete(c.inflight, d.MMHash)
		s.stats.Completed++
		s.event("c%d completed %s into %v", c.id, d.MMHash, d.Blocks)
		if d.Held != (c.cache != nil) {
			s.fail("c%d: completion of %s held %v", c.id, d.MMHash, d.Held)
		}
		if f.hit {
			s.stats.Hits++
			s.own(c, d.MMHash, d.Blocks)
			continue // no READ: the bytes were checked when it landed
		}
		// The producer's bytes for that entry, never another's: a pin
		// dropped under a READ shows here once a save reuses the blocks.
		// And none written after the lease of the grant read under.
		want := make([]byte, blockSize)
		rd, ok := c.reads[d.MMHash]
		if !ok || !slices.Equal(rd.local, d.Blocks) {
			s.fail("c%d: completion of %s into %v, not the READ posted last (%v)", c.id, d.MMHash, d.Blocks, rd.local)
		}
		for j, b := range d.Blocks {
			fill(want, d.MMHash, j)
			got := c.data.Block(b)
			if !bytes.Equal(got[:8], want[:8]) {
				s.fail("c%d: %s block %d holds the wrong bytes (%x, want %x)", c.id, d.MMHash, j, got[:4], want[:4])
			}
			if at := stamp(got); at.After(rd.leaseEnd) {
				s.fail("c%d: %s block %d holds bytes written %v after its grant's lease ended", c.id, d.MMHash, j, at.Sub(rd.leaseEnd))
			}
		}
		if c.cache != nil {
			s.own(c, d.MMHash, d.Blocks)
			continue
		}
		s.free(c, d.Blocks, "completed "+d.MMHash)
	}
	for _, f := range r.Failed {
		if c.inflight[f.MMHash] == nil {
			s.fail("c%d: failure of %s, not in flight", c.id, f.MMHash)
			return
		}
		fe := c.inflight[f.MMHash]
		delete(c.inflight, f.MMHash)
		s.stats.Failed++
		if f.Reason == xfer.DeadlineExceeded {
			s.stats.Deadlines++
		}
		s.event("c%d failed %s: %s %s held=%v", c.id, f.MMHash, f.Reason, f.Status, f.BlocksHeld)
		if fe.mustEnd != 0 {
			s.fail("c%d: fetch of ready %s failed without faults: %s %s", c.id, f.MMHash, f.Reason, f.Status)
		}
		if fe.hit {
			s.fail("c%d: a hit of %s failed", c.id, f.MMHash)
		}
		if f.BlocksHeld {
			c.held[f.MMHash] = f.Blocks
		} else if c.cache == nil {
			s.free(c, f.Blocks, "failed "+f.MMHash)
		}
	}
	for _, rel := range r.Released {
		blocks, ok := c.held[rel.MMHash]
		if !ok || !slices.Equal(blocks, rel.Blocks) {
			s.fail("c%d: release of %s %v, held %v", c.id, rel.MMHash, rel.Blocks, blocks)
			return
		}
		delete(c.held, rel.MMHash)
		s.stats.Released++
		s.event("c%d released %s forced=%v", c.id, rel.MMHash, rel.Forced)
		switch {
		case rel.Forced && c.cache != nil:
			s.stats.Forced++
			for _, b := range rel.Blocks {
				c.retired[b] = true
			}
		case rel.Forced:
			s.stats.Forced++
			c.poisoned = append(c.poisoned, rel.Blocks...)
		case c.cache == nil:
			s.free(c, rel.Blocks, "released "+rel.MMHash)
		}
	}
}

// own holds a managed consumer's completed entry for a few steps.
func (s *sim) own(c *consumer, h string, blocks []int) {
	if _, dup := c.owned[h]; dup {
		s.fail("c%d: %s held twice", c.id, h)
		return
	}
	c.owned[h] = ownedEntry{blocks: slices.Clone(blocks), until: s.step + s.rng.IntN(30)}
}

// letGo lets go of a managed consumer's entries whose time has come (all of
// them, with all).
func (s *sim) letGo(c *consumer, all bool) {
	for _, h := range slices.Sorted(maps.Keys(c.owned)) {
		if o := c.owned[h]; o.until <= s.step || all {
			if err := c.cache.Unpin(h); err != nil {
				s.fail("c%d: let go of %s: %v", c.id, h, err)
			}
			delete(c.owned, h)
		}
	}
}

// checkManaged checks a managed consumer's blocks: the entries it holds
// are there, ready, held and unmoved; no block a READ may still write is
// free or another's (in flight, a failure whose READ may still write, or
// retired); the cache's counts add up.
func (s *sim) checkManaged(c *consumer) {
	mine := map[int]string{}
	for h, o := range c.owned {
		e, ok := c.cache.Get(h)
		if !ok || !e.Ready || e.Pins == 0 || !slices.Equal(e.Blocks, o.blocks) {
			s.fail("c%d: held entry %s evicted, let go or moved: %+v", c.id, h, e)
			return
		}
		for _, b := range o.blocks {
			mine[b] = "owned " + h
		}
	}
	for h, f := range c.inflight {
		if f.hit {
			continue
		}
		e, ok := c.cache.Get(h)
		if !ok || e.Ready {
			s.fail("c%d: %s in flight has no entry being written", c.id, h)
			return
		}
		for _, b := range e.Blocks {
			mine[b] = "fetch " + h
		}
	}
	for h, bs := range c.held {
		if e, ok := c.cache.Get(h); !ok || e.Ready || !slices.Equal(e.Blocks, bs) {
			s.fail("c%d: %s, whose READ may write, has no entry being written", c.id, h)
			return
		}
		for _, b := range bs {
			mine[b] = "held failure " + h
		}
	}
	for b := range s.cfg.Blocks {
		if who, ok := mine[b]; c.data.MayWrite(b) && (!ok || strings.HasPrefix(who, "owned ")) && !c.retired[b] {
			s.fail("c%d: block %d may still be written, and is %q", c.id, b, who)
			return
		}
	}
	if st := c.cache.Stats(); st.Free+st.EvictableBlock+st.Retired+blocksOf(c) != st.Capacity || st.Retired != len(c.retired) {
		s.fail("c%d: cache blocks add up wrong: %+v", c.id, st)
	}
}

// blocksOf counts the blocks of a managed consumer's cache entries that
// are held or not ready.
func blocksOf(c *consumer) int {
	n := 0
	for h := range c.owned {
		e, _ := c.cache.Get(h)
		n += len(e.Blocks)
	}
	for h, f := range c.inflight {
		if e, ok := c.cache.Get(h); ok && !f.hit && !e.Ready {
			n += len(e.Blocks)
		}
	}
	for _, bs := range c.held {
		n += len(bs)
	}
	return n
}

func (s *sim) free(c *consumer, blocks []int, why string) {
	for _, b := range blocks {
		if c.data.MayWrite(b) {
			s.fail("c%d: block %d freed (%s) while a READ may still write into it", c.id, b, why)
		}
	}
	c.free = append(c.free, blocks...)
}

// check verifies the invariants that hold after every step.
func (s *sim) check() {
	counts := map[string]int{}
	for _, p := range s.prods {
		clear(counts)
		hooks.ProducerPins(p.prod, counts)
		for i := range s.cfg.Entries + len(p.extra) {
			var h string
			if i < s.cfg.Entries {
				h = entryName(p, i)
			} else {
				h = p.extra[i-s.cfg.Entries]
			}
			e, _ := p.cache.Get(h)
			if e.Pins != counts[h] {
				s.fail("%s: %s has %d pins for %d live grants", p.label, h, e.Pins, counts[h])
			}
			delete(counts, h)
		}
		for h, n := range counts {
			if e, _ := p.cache.Get(h); e.Pins != n {
				s.fail("%s: %s has %d pins for %d live grants", p.label, h, e.Pins, n)
			}
		}
		// Every READ being served holds its entry: pinned, and the blocks
		// it reads are still that entry's.
		for _, post := range p.data.Serving() {
			_, rest, _ := strings.Cut(post.Notif, ":")
			h, _, _ := strings.Cut(rest, "#")
			e, ok := p.cache.Get(h)
			if !ok || e.Pins == 0 {
				s.fail("%s: %s unpinned while a READ of it is served (%s)", p.label, h, post.Notif)
				continue
			}
			for _, b := range post.Remote {
				if !slices.Contains(e.Blocks, b) {
					s.fail("%s: READ %s served block %d, not %s's", p.label, post.Notif, b, h)
				}
			}
		}
		if g := p.prod.Grants(); g > 4*s.cfg.Consumers*s.cfg.Entries {
			s.fail("%s: %d grants", p.name, g)
		}
	}
	for _, c := range s.cons {
		if c.pool.InFlight() != len(c.inflight) {
			s.fail("c%d: pool has %d fetches in flight, the simulator %d", c.id, c.pool.InFlight(), len(c.inflight))
		}
		for _, f := range c.inflight {
			if f.mustEnd != 0 && s.step > f.mustEnd {
				s.fail("c%d: fetch of ready %s (step %d) has not completed", c.id, f.hash, f.start)
			}
			if !s.now.Before(f.deadline) && !f.hit {
				s.fail("c%d: fetch of %s (step %d) still in flight %v past its deadline", c.id, f.hash, f.start, s.now.Sub(f.deadline))
			}
		}
		if c.cache != nil {
			s.checkManaged(c)
			continue
		}
		held := 0
		for _, b := range c.held {
			held += len(b)
		}
		inflight := 0
		for _, f := range c.inflight {
			inflight += len(f.blocks)
		}
		if n := len(c.free) + held + len(c.poisoned) + inflight; n != s.cfg.Blocks {
			s.fail("c%d: blocks add up to %d of %d", c.id, n, s.cfg.Blocks)
		}
		// Poisoned blocks come back once nothing can write into them.
		c.poisoned = slices.DeleteFunc(c.poisoned, func(b int) bool {
			if !c.data.MayWrite(b) {
				c.free = append(c.free, b)
				return true
			}
			return false
		})
	}
	if len(s.net) > 100000 {
		s.fail("%d control messages in flight", len(s.net))
	}
}

// finish checks the end state: every fetch ended, every held block came
// back, and once the pools close no handle or peer registration remains.
func (s *sim) finish() {
	// Let leases run out so every grant ends.
	for range 3 {
		s.now = s.now.Add(xcfg.PinLease)
		for _, p := range s.prods {
			p.prod.Step(s.now)
		}
	}
	s.check()
	for _, c := range s.cons {
		s.stats.Reaped += int(c.pool.Stats().Reaped)
		if len(c.inflight) > 0 {
			for h := range c.inflight {
				s.fail("c%d: fetch of %s never ended", c.id, h)
				return
			}
		}
		if len(c.held) > 0 {
			s.fail("c%d: blocks of %d failed fetches never came back", c.id, len(c.held))
			return
		}
		c.pool.Close()
		s.collect(c, c.pool.Step(s.now)) // what Close ended
		if l := c.data.Leaks(); len(l.Handles) > 0 || len(l.Peers) > 0 {
			s.fail("c%d leaks handles %v, peers %v", c.id, l.Handles, l.Peers)
		}
		if c.cache != nil {
			s.letGo(c, true)
			if st := c.cache.Stats(); st.Free+st.EvictableBlock+st.Retired != s.cfg.Blocks || st.NotReady+st.Pinned != 0 {
				s.fail("c%d: cache blocks not all back: %+v", c.id, st)
			}
			continue
		}
		if len(c.free)+len(c.poisoned) != s.cfg.Blocks {
			s.fail("c%d: %d of %d blocks back", c.id, len(c.free)+len(c.poisoned), s.cfg.Blocks)
		}
	}
	for _, p := range s.prods {
		if p.cache.Stats().Pinned != 0 {
			s.fail("%s: %d entries still pinned", p.name, p.cache.Stats().Pinned)
		}
	}
}

// ---- the in-memory control plane ----

// send puts a message on the network, with faults. A message may be lost,
// delayed, late past a retry (a reply), and, except on a connection that
// keeps ZeroMQ's guarantees, duplicated and overtaken; on such a
// connection a delayed message delays those behind it.
func (s *sim) send(m msg) {
	s.stats.Messages++
	if s.chance(s.cfg.Faults.Drop) {
		s.stats.Dropped++
		return
	}
	m.due = s.step + 1
	if s.chance(s.cfg.Faults.Delay) {
		m.due += s.rng.IntN(s.cfg.Faults.MaxDelay + 1)
	}
	if !m.toProd && s.chance(s.cfg.Faults.LateReply) {
		s.stats.LateReplies++
		m.due += 25 + s.rng.IntN(96)
	}
	s.seq++
	m.seq = s.seq
	if m.ordered {
		k := connKey{m.toProd, m.addr, m.cons, m.conn}
		m.due = max(m.due, s.lastDue[k])
		s.lastDue[k] = m.due
	}
	s.net = append(s.net, m)
	if !m.ordered && s.chance(s.cfg.Faults.Dup) {
		s.stats.Duplicated++
		d := m
		d.due += s.rng.IntN(5)
		s.net = append(s.net, d)
	}
}

// deliver hands out the messages due, in a random order (reordering),
// except that an ordered connection's keep their sending order.
func (s *sim) deliver() {
	var due []msg
	s.net = slices.DeleteFunc(s.net, func(m msg) bool {
		if m.due <= s.step {
			due = append(due, m)
			return true
		}
		return false
	})
	if s.faulty() {
		s.rng.Shuffle(len(due), func(i, j int) { due[i], due[j] = due[j], due[i] })
		var at []int
		var ordered []msg
		for i, m := range due {
			if m.ordered {
				at, ordered = append(at, i), append(ordered, m)
			}
		}
		slices.SortFunc(ordered, func(a, b msg) int { return a.seq - b.seq })
		for i, m := range ordered {
			due[at[i]] = m
		}
	}
	for _, m := range due {
		if m.toProd {
			for _, p := range s.prods {
				if p.addr == m.addr {
					p.srv.in = append(p.srv.in, xfer.Message{Identity: fmt.Appendf(nil, "c%d/%d", m.cons, m.conn), Payload: m.payload})
				}
			}
			continue
		}
		c := s.cons[m.cons]
		if c.ctl.conn[m.addr] == m.conn && !c.ctl.down[m.addr] {
			if m.grantKey != "" {
				if end, ok := c.granted[m.grantKey]; !ok || m.leaseEnd.After(end) {
					c.granted[m.grantKey] = m.leaseEnd
				}
			}
			c.ctl.in = append(c.ctl.in, xfer.Inbound{Addr: m.addr, Payload: m.payload})
		}
	}
}

type simServer struct {
	s  *sim
	p  *producer
	in []xfer.Message
}

func (v *simServer) Drain(dst []xfer.Message) []xfer.Message {
	dst = append(dst, v.in...)
	v.in = v.in[:0]
	return dst
}

func (v *simServer) Reply(identity, payload []byte) error {
	var cons, conn int
	if _, err := fmt.Sscanf(string(identity), "c%d/%d", &cons, &conn); err != nil {
		return err
	}
	m := msg{addr: v.p.addr, cons: cons, conn: conn, ordered: v.p.vllm}
	var a wire.XferAck
	if err := wire.DecodeAck(payload, &a); err != nil {
		return err
	}
	v.s.event("%s -> c%d ack %s %s grant %d attempt %d blocks %d", v.p.label, cons, a.MMHash, a.Status, a.Grant, a.Attempt, len(a.SrcBlockIndices))
	if a.Status == wire.OK {
		// Granted now: the lease runs from this step.
		m.leaseEnd = v.s.now.Add(xcfg.PinLease)
		v.s.grants[a.Grant] = m.leaseEnd
		if v.p.vllm {
			m.grantKey = a.SessionID + ":" + a.MMHash
		}
	}
	if v.p.vllm {
		// vLLM's producer: a NACK carries mm_hash and status only, an
		// OK ack the reference's fields.
		a = wire.XferAck{MMHash: a.MMHash, Status: a.Status, SessionID: a.SessionID, SrcBlockIndices: a.SrcBlockIndices,
			AgentMetadata: a.AgentMetadata, MemDescriptor: a.MemDescriptor}
		if a.Status != wire.OK {
			a.SessionID = ""
		}
		payload = wire.AppendAck(nil, &a)
	}
	m.payload = bytes.Clone(payload)
	v.s.send(m)
	return nil
}

func (v *simServer) Wait(context.Context) bool { return false }

type simClient struct {
	s    *sim
	c    *consumer
	in   []xfer.Inbound
	dead []xfer.Death
	conn map[string]int  // connection generation per producer
	down map[string]bool // reported dead, not yet taken by Dead
}

func (v *simClient) Send(addr string, payload []byte) error {
	if v.down[addr] {
		return xfer.ErrPeerDown
	}
	if v.s.chance(v.s.cfg.Faults.SendRefuse) {
		v.s.stats.Refused++
		return xfer.ErrQueueFull
	}
	if v.s.chance(v.s.cfg.Faults.SendDie) {
		// The producer dies as we send, in the middle of the pool's step.
		v.s.event("c%d: %s dies during a send", v.c.id, addr)
		v.peerDown(addr, false)
		return xfer.ErrPeerDown
	}
	m := msg{toProd: true, addr: addr, cons: v.c.id, conn: v.conn[addr], payload: bytes.Clone(payload)}
	for _, p := range v.s.prods {
		if p.addr == addr && p.vllm {
			// vLLM's producer reads none of the extensions: ours grants
			// as it would (no token, no attempt to echo).
			var r wire.XferReq
			if err := wire.DecodeReq(payload, &r); err != nil {
				return err
			}
			r.Agent, r.Attempt, r.AcceptsShape, r.Contact, r.Known = "", 0, false, false, 0
			m.payload, m.ordered = wire.AppendReq(nil, &r), true
		}
	}
	v.s.send(m)
	return nil
}

func (v *simClient) Drain(dst []xfer.Inbound) []xfer.Inbound {
	dst = append(dst, v.in...)
	v.in = v.in[:0]
	return dst
}

// peerDown breaks the connection to addr: what was in flight on it is
// lost; the next Dead reports it and the next Send reconnects.
func (v *simClient) peerDown(addr string, silent bool) {
	if v.down[addr] {
		return
	}
	v.down[addr] = true
	err := errors.New("connection closed")
	if silent {
		err = xfer.ErrPeerSilent
	}
	v.dead = append(v.dead, xfer.Death{Addr: addr, Err: err})
	v.in = slices.DeleteFunc(v.in, func(m xfer.Inbound) bool { return m.Addr == addr })
}

func (v *simClient) Dead(dst []xfer.Death) []xfer.Death {
	for _, d := range v.dead {
		delete(v.down, d.Addr)
		v.conn[d.Addr]++
	}
	dst = append(dst, v.dead...)
	v.dead = v.dead[:0]
	return dst
}

// Remove drops the connection to addr, as transport.Client does: what was
// in flight on it is lost, a death not yet reported is not reported, and
// the next Send connects anew.
func (v *simClient) Remove(addr string) {
	v.conn[addr]++
	delete(v.down, addr)
	v.dead = slices.DeleteFunc(v.dead, func(d xfer.Death) bool { return d.Addr == addr })
	v.in = slices.DeleteFunc(v.in, func(m xfer.Inbound) bool { return m.Addr == addr })
}

func (v *simClient) Wait(context.Context) bool { return true }
