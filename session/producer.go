package session

import (
	"bytes"
	"cmp"
	"context"
	"crypto/rand"
	"crypto/subtle"
	"fmt"
	"io"
	"log/slog"
	"math/bits"
	mrand "math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/ecxfer/ecxfer/cache"
	"github.com/ecxfer/ecxfer/internal/cachex"
	"github.com/ecxfer/ecxfer/internal/fsm"
	"github.com/ecxfer/ecxfer/internal/hooks"
	"github.com/ecxfer/ecxfer/internal/plane"
	"github.com/ecxfer/ecxfer/internal/wireview"
	"github.com/ecxfer/ecxfer/internal/wirext"
	"github.com/ecxfer/ecxfer/wire"
	"github.com/ecxfer/ecxfer/xfer"
)

// Replier queues a reply to identity's consumer; it must not block or keep it.
type Replier interface {
	Reply(identity, payload []byte) error
}

// ProducerConfig configures a ProducerSession; zero fields take those shown.
type ProducerConfig struct {
	PinLease             time.Duration // longest a grant pins its entry; 30 s
	MaxGrantsPerSession  int           // live grants of one session; past it NACK_INTERNAL; 4096
	MaxGrantsPerIdentity int           // of one control-plane identity; MaxGrants/4, within [MaxGrantsPerSession, MaxGrants]
	MaxGrants            int           // live grants in all; 65536
	MaxGrantsPerEntry    int           // one session's live grants of one entry; 8
	MaxPinnedShare       float64       // most of the cache one session or identity pins; 0.5
	SaveReserve          int           // blocks MaxPinnedShare keeps for saves (else NACK_NOT_READY); 0: the largest seen
	MaxRequestAge        time.Duration // older requests get NACK_NOT_READY; 2 s
	Logger               *slog.Logger  // nil: slog.Default()
	Rand                 io.Reader     // seeds grant tokens; nil: crypto/rand
}

// ProducerStats counts what a ProducerSession has done.
type ProducerStats struct {
	Requests, Malformed  uint64 // requests decoded; payloads that did not decode as an XferReq
	Grants               uint64 // OK acks sent
	Nacks                NackCounts
	Completions, Expired uint64 // grants ended by their notification; by the lease
	ReRequests, Contacts uint64 // grants while the session held one for the entry; contact requests answered
	Stale, OverPinned    uint64 // requests refused (NACK_NOT_READY) past MaxRequestAge; by the pinned shares
	OverBound            uint64 // requests refused by the grant bounds
	BadSessionIDs        uint64 // requests whose session id is not a canonical UUID
	UnknownNotifs        uint64 // notifications matching no grant (late, foreign)
	ForeignNotifs        uint64 // notifications from an agent the grant is not bound to
	BadNotifs, BadTokens uint64 // notifications not UTF-8; naming a live grant without its token
	ReplyErrors          uint64 // replies the control plane refused
	DrainErrors          uint64 // failed notification drains
	DescsSent, DescBytes uint64 // OK acks carrying the mem descriptor; its bytes
	ShapesSent, Pushes   uint64 // OK acks carrying the region's shape instead; grants pushed with the ack (TCP)
	BrokenReads          uint64 // grants ended early: their READ's connection broke
}

type consumerState struct {
	// Where the grants asked for under the session are pushed (see
	// gate.Authorize): id for those the identity that opened it asked for,
	// others' for another identity's (made as they ask).
	id        uint64
	ident     string
	others    map[string]uint64
	grants    int
	blocks    int    // pinned by its live grants
	agent     string // the agent its READs come from, once known
	confirmed bool
	contact   *grant // its live contact grant, if any
}

// asker counts the live grants one control-plane identity asked for,
// whichever sessions it named; it is forgotten when they reach zero.
type asker struct {
	name     string
	grants   int // contact grants included
	contacts int
}

// maxContactsPerIdent bounds the live contact grants of one control-plane
// identity: a consumer holds one per producer connection.
const maxContactsPerIdent = 4

// grant is one live ProducerXfer, on the lease list in deadline order.
type grant struct {
	fsm.ProducerXfer
	id    uint64
	token wire.Token // the grant's capability; zero for a consumer that takes none
	key   string     // "<session_id>:<mm_hash>", the notification's text
	agent string     // the agent allowed to read it; "" while unknown
	ident string     // the control-plane identity charged for its pins
	by    *asker     // the control-plane identity that asked
	cs    *consumerState
	// contact: a contact grant (contactGrant), of no blocks and no pin,
	// found by its id alone: never among byKey's, whatever its mm_hash.
	contact bool
	// push names where its blocks are pushed: its consumer session's, as
	// the identity that asked knows it (pushID); 0: nowhere.
	push uint64
	// hold counts the READs being served under the grant (Authorize to
	// their release), plus endedBit once the grant ended. Whoever brings
	// it to exactly endedBit unpins: the step loop ending an idle grant,
	// or the release of the last READ of an ended one.
	hold       atomic.Int32
	release    func() // ends one hold; made once per grant object
	prev, next *grant
}

const endedBit = 1 << 30

// contactDrive is how long a producer drives a data plane that must be
// driven (plane.Driven) after a contact request, as if a READ were
// expected: the consumer's data plane connects to ours meanwhile (over
// UCX, its connection's set-up moves only while both agents are driven).
const contactDrive = time.Second

// contactSuffix ends the notification a consumer's data plane sends as it
// makes contact, naming no grant (NIXL's, see plane.Contacter).
var contactSuffix = []byte(":" + wirext.ContactHash)

// grantIDs numbers grants across every producer session of the process: a
// data plane that outlives a session (or serves its successor) never sees
// an id twice.
var grantIDs atomic.Uint64

// maxPushLive: a grant is pushed (plane.Attachment) only while its consumer
// session holds at most this many live grants, this one included.
const maxPushLive = 2

// ProducerSession grants requests, each pinning its entry until its READ or
// lease ends.
type ProducerSession struct {
	data     xfer.DataTransport
	driven   plane.Driven     // data, when it must be told of the live grants
	fresh    bool             // this Poll made a grant, or took a contact request (driven)
	att      plane.Attachment // data, when it serves READs through our gate (set once)
	notes    plane.Drainer    // where our completion notifications are taken: att's own, else data
	gating   bool             // data serves only what we grant: Close may unpin at once
	nextCons uint64           // consumer sessions' ids
	notifBuf []byte           // a pushed grant's notification, reused
	tokens   *mrand.ChaCha8   // grant tokens
	cache    *cache.EmbeddingCache
	compat   string
	lease    time.Duration
	log      *slog.Logger

	authMu sync.RWMutex        // guards byKey and byID against Authorize
	byKey  map[string][]*grant // live grants per key, oldest first
	byID   map[uint64]*grant
	lru    grant // sentinel of the lease list: lru.next expires first
	spare  []*grant
	// held are grants that ended while a READ was being served under
	// them: their pin goes when the last such READ is released.
	held []*grant

	// Per consumer session: its live grants, and whether it has completed
	// a READ since our agent metadata last changed (then it has registered
	// our agent, and acks can leave the mem descriptor out).
	consumers  map[string]*consumerState
	pruneAt    int            // consumers' size at which pruneConsumers scans next
	prunes     int            // its scans, for tests
	idents     map[string]int // blocks pinned per control-plane identity
	askers     map[string]*asker
	lastMeta   []byte
	metaDigest uint64 // wirext.MetaDigest(lastMeta): a consumer that has it registered says so (ecx_known)
	// The shape of the data plane's descriptor (shapeOf), if it is one.
	shapeOf   []byte
	shape     wire.Blocks
	shapeOK   bool
	perSess   int
	perIdent  int
	perEntry  int
	maxGrants int
	maxPinned int
	reserve   int // ProducerConfig.SaveReserve
	maxAge    time.Duration
	draining  bool
	// contactUntil: a consumer asked for contact (its data plane connects
	// to ours): a data plane that must be driven is, until then.
	contactUntil time.Time

	req    wireview.Req
	ack    wire.XferAck
	keyBuf []byte
	ids    []wire.Int
	buf    []byte
	notifs []xfer.Notif
	stats  ProducerStats
	closed bool
}

// NewProducerSession returns a session serving c, whose block ids are data's
// region's; xfer.ErrBadConfig for an empty compatHash or a nil dependency.
func NewProducerSession(cfg ProducerConfig, data xfer.DataTransport, c *cache.EmbeddingCache, compatHash string) (*ProducerSession, error) {
	switch {
	case compatHash == "":
		return nil, fmt.Errorf("%w: session: empty compatibility hash", xfer.ErrBadConfig)
	case data == nil || c == nil:
		return nil, fmt.Errorf("%w: session: nil data plane or cache", xfer.ErrBadConfig)
	}
	if cfg.PinLease <= 0 {
		cfg.PinLease = xfer.Config{}.WithDefaults().PinLease
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	if cfg.MaxGrantsPerSession <= 0 {
		cfg.MaxGrantsPerSession = 4096
	}
	if cfg.MaxGrants <= 0 {
		cfg.MaxGrants = 65536
	}
	if cfg.MaxGrantsPerIdentity <= 0 {
		cfg.MaxGrantsPerIdentity = min(cfg.MaxGrants, max(cfg.MaxGrants/4, cfg.MaxGrantsPerSession))
	}
	if cfg.MaxGrantsPerEntry <= 0 {
		cfg.MaxGrantsPerEntry = 8
	}
	if cfg.MaxPinnedShare <= 0 || cfg.MaxPinnedShare > 1 {
		cfg.MaxPinnedShare = 0.5
	}
	if cfg.MaxRequestAge <= 0 {
		cfg.MaxRequestAge = 2 * time.Second
	}
	p := &ProducerSession{data: data, cache: c, compat: compatHash, lease: cfg.PinLease, log: log,
		byKey: map[string][]*grant{}, byID: map[uint64]*grant{}, consumers: map[string]*consumerState{},
		idents: map[string]int{}, askers: map[string]*asker{}, perSess: cfg.MaxGrantsPerSession,
		perIdent: cfg.MaxGrantsPerIdentity, perEntry: cfg.MaxGrantsPerEntry,
		maxGrants: cfg.MaxGrants, maxAge: cfg.MaxRequestAge, reserve: max(0, cfg.SaveReserve),
		maxPinned: max(1, int(cfg.MaxPinnedShare*float64(c.Stats().Capacity)))}
	var seed [32]byte
	r := cfg.Rand
	if r == nil {
		r = rand.Reader
	}
	if _, err := io.ReadFull(r, seed[:]); err != nil {
		return nil, fmt.Errorf("session: token seed: %w", err)
	}
	p.tokens = mrand.NewChaCha8(seed)
	p.lru.prev, p.lru.next = &p.lru, &p.lru
	p.driven, _ = plane.As[plane.Driven](data)
	p.notes = data
	if a := plane.AttacherOf(data); a != nil {
		p.att, p.gating = a.Attach(gate{p}), true
		if d, ok := p.att.(plane.Drainer); ok {
			p.notes = d // not another session's, on a plane it shares with us
		}
	}
	return p, nil
}

// Stats returns the counters.
func (p *ProducerSession) Stats() ProducerStats { return p.stats }

// Grants returns the number of grants still holding a pin.
func (p *ProducerSession) Grants() int { return len(p.byID) + len(p.held) }

// Poll takes the data plane's notifications, ends the grants whose lease ran
// out by now, then answers every request in msgs, in order, through out.
func (p *ProducerSession) Poll(msgs []xfer.Message, out Replier, now time.Time) {
	if p.closed {
		// Grants Close left (a data plane that cannot refuse READs) end
		// as they would have: by notification or lease.
		p.drainNotifs()
		p.sweep(now)
		p.reapHeld()
		if p.driven != nil {
			p.driven.ExpectReads(p.Grants(), false)
		}
		return
	}
	if meta := p.data.AgentMetadata(); !bytes.Equal(meta, p.lastMeta) {
		// A new incarnation of our agent: every consumer registers anew.
		p.lastMeta = append(p.lastMeta[:0], meta...)
		p.metaDigest = wirext.MetaDigest(p.lastMeta)
		for _, c := range p.consumers {
			c.confirmed = false
		}
	}
	// The grants that ended by now end first: a consumer whose
	// notification came before its next request is not charged for the
	// entry it let go (its share).
	p.drainNotifs()
	p.drainBroken()
	p.sweep(now)
	for i := range msgs {
		p.handle(&msgs[i], now, out)
	}
	p.reapHeld()
	if p.driven != nil {
		n := p.Grants()
		if now.Before(p.contactUntil) {
			n++ // a consumer's data plane connects: drive ours for it
		}
		p.driven.ExpectReads(n, p.fresh)
	}
	p.fresh = false
}

func (p *ProducerSession) handle(m *xfer.Message, now time.Time, out Replier) {
	stale := !m.At.IsZero() && now.Sub(m.At) > p.maxAge
	if err := wireview.DecodeReq(m.Payload, &p.req); err != nil {
		p.stats.Malformed++
		p.log.Warn("ec producer: malformed XferReq", "err", err)
		// Answer what can still be named, so the consumer need not wait
		// out its ack timeout.
		if mm, sid, attempt, ok := wireview.PeekIDs(m.Payload, "req"); ok {
			p.ack = wire.XferAck{MMHash: string(mm), SessionID: string(sid), Status: wire.NackInternal, Attempt: attempt}
			p.buf = wire.AppendAck(p.buf[:0], &p.ack)
			if out.Reply(m.Identity, p.buf) != nil {
				p.stats.ReplyErrors++
			}
			p.stats.Nacks[wire.NackInternal]++
		}
		return
	}
	p.stats.Requests++
	var g *grant
	if stale {
		// Its consumer may have given up: no grant, whose pin would wait
		// out a lease for nobody. But an answer, retryable, so that one
		// still waiting need not wait out its ack timeout; a Go consumer
		// that gave up drops it by its attempt.
		p.stats.Stale++
		p.ack = wire.XferAck{MMHash: string(p.req.MMHash), Status: wire.NackNotReady, Attempt: p.req.Attempt}
		p.stats.Nacks[wire.NackNotReady]++
	} else {
		g = p.grantOrNack(&p.req, m.Identity, now)
	}
	p.buf = wire.AppendAck(p.buf[:0], &p.ack)
	if err := out.Reply(m.Identity, p.buf); err != nil {
		p.stats.ReplyErrors++
		p.log.Warn("ec producer: reply not sent", "mm_hash", string(p.req.MMHash), "err", err)
		if g != nil {
			// The consumer will never READ under this grant: do not hold
			// the pin for a whole lease.
			p.endGrant(g)
		}
		return
	}
	if g != nil && p.att != nil && !g.token.IsZero() && g.push != 0 && g.cs.grants <= maxPushLive && len(g.Blocks) > 0 {
		// The ack is out and the grant live: its blocks follow it at
		// once, under a hold of the pin until they are out of the region.
		// (Ahead of the ack they delayed it by as much as they saved.)
		// Only for a consumer session with few grants live: with many,
		// its READs keep the data plane's connections busy anyway, and
		// pushes would funnel every byte through this loop (the TCP
		// loopback at 64 in flight halved).
		g.hold.Add(1)
		p.notifBuf = wirext.AppendNotifGrant(append(p.notifBuf[:0], g.key...), g.id, g.token)
		if p.att.Push(g.push, p.notifBuf, g.Blocks, g.release) {
			p.stats.Pushes++
		} else {
			g.release()
		}
	}
}

// grantOrNack applies the reference's rules in order and fills p.ack. Its
// strings alias the request until a grant copies them (one allocation: the
// grant key, of which session id and mm_hash are substrings).
func (p *ProducerSession) grantOrNack(req *wireview.Req, ident []byte, now time.Time) *grant {
	p.ack = wire.XferAck{}
	nack := func(s wire.Status, msg string) *grant {
		p.ack = wire.XferAck{MMHash: string(req.MMHash), Status: s, Attempt: req.Attempt}
		p.stats.Nacks[s]++
		level := slog.LevelWarn
		if wirext.Expected(s) {
			level = slog.LevelInfo
		}
		p.log.Log(context.Background(), level, msg, "mm_hash", p.ack.MMHash, "status", s.String())
		return nil
	}
	if !req.VersionIs(wire.ConnectorVersion) {
		return nack(wire.NackVersion, "ec producer: incompatible connector version")
	}
	if string(req.CompatibilityHash) != p.compat {
		return nack(wire.NackIncompat, "ec producer: incompatible compatibility hash")
	}
	if len(req.SessionID) == 0 {
		// Grants are keyed by session: an empty id would alias other peers'.
		return nack(wire.NackInternal, "ec producer: XferReq without session_id")
	}
	if !canonicalUUID(req.SessionID) {
		// Keys are "<session_id>:<mm_hash>": an id with a ':' could alias
		// another consumer's key.
		p.stats.BadSessionIDs++
		return nack(wire.NackInternal, "ec producer: session_id is not a canonical UUID")
	}
	if p.draining {
		return nack(wire.NackInternal, "ec producer: draining; NACK")
	}
	cs := p.consumers[string(req.SessionID)]
	if cs != nil && len(req.Agent) > 0 && cs.agent != "" && string(req.Agent) != cs.agent {
		// A session's READs come from one agent: another claiming it is
		// not that consumer.
		p.stats.OverBound++
		return nack(wire.NackInternal, "ec producer: session bound to another agent; NACK")
	}
	if req.Contact {
		p.contactUntil = now.Add(contactDrive)
		p.fresh = true
		// Only the data-plane contact: what a first OK ack would carry,
		// and, to a Go consumer of a plane that serves through our gate,
		// a grant of no blocks (it pins nothing): its data plane's contact
		// READs nothing under it, which proves its connection to be this
		// consumer session's (pushes go there), and ends it.
		p.stats.Contacts++
		var g *grant
		if req.Attempt != 0 && p.att != nil {
			if cs != nil && cs.contact != nil && cs.contact.by.name == string(ident) {
				p.endGrant(cs.contact) // replaced: one per session
			}
			a := p.askers[string(ident)]
			if (cs == nil || cs.contact == nil && cs.grants < p.perSess) && len(p.byID) < p.maxGrants &&
				(a == nil || a.grants < p.perIdent && a.contacts < maxContactsPerIdent) {
				g = p.contactGrant(req, cs, ident, now)
			}
		}
		p.ack = wire.XferAck{MMHash: string(req.MMHash), Status: wire.OK, SessionID: string(req.SessionID),
			AgentMetadata: p.lastMeta, LeaseMillis: uint64(p.lease.Milliseconds()), Attempt: req.Attempt,
			Touch: plane.TouchPageOf(p.data)}
		if g != nil {
			p.ack.MMHash, p.ack.SessionID = g.MMHash, g.SessionID
			p.ack.Grant, p.ack.Token = g.id, g.token
		}
		if !p.known(req.Known) {
			p.describe(req.AcceptsShape)
		}
		return g
	}
	p.keyBuf = append(append(append(p.keyBuf[:0], req.SessionID...), ':'), req.MMHash...)
	same := p.byKey[string(p.keyBuf)]
	if cs != nil && cs.grants >= p.perSess {
		p.stats.OverBound++
		return nack(wire.NackInternal, "ec producer: grant bound of the session reached; NACK")
	}
	if a := p.askers[string(ident)]; a != nil && a.grants >= p.perIdent {
		// Its own grants end first: retryable, as for its pin share.
		p.stats.OverBound++
		return nack(wire.NackNotReady, "ec producer: identity holds its share of the grants; NACK")
	}
	if len(p.byID) >= p.maxGrants {
		// Identities each within their share hold every grant: some end
		// within a lease.
		p.stats.OverBound++
		return nack(wire.NackNotReady, "ec producer: grant bound reached; NACK")
	}
	if len(same) >= p.perEntry {
		// The earlier grants end as their READs' notifications land: a
		// hot entry fetched again and again meets this bound while they
		// are on their way. Retryable (the reference, which replaces the
		// earlier grant, would grant it).
		p.stats.OverBound++
		return nack(wire.NackNotReady, "ec producer: live grants of the entry at their bound; NACK")
	}
	blocks, res := cachex.PinIfReady(p.cache, string(req.MMHash))
	switch res {
	case cachex.Absent:
		return nack(wire.NackMissing, "ec producer: entry not held; NACK")
	case cachex.NotReady:
		return nack(wire.NackNotReady, "ec producer: entry not ready; NACK")
	}
	// The shares count the blocks a session (and an identity) keeps
	// pinned: a second grant of an entry it holds adds none. The entry is
	// pinned already, so the cache's room is what the grant leaves.
	n := len(blocks)
	if len(same) == 0 && ((cs != nil && cs.blocks+n > p.maxPinned) || p.idents[string(ident)]+n > p.maxPinned) &&
		cachex.Pressure(p.cache, p.reserve) {
		p.unpin(string(req.MMHash))
		p.stats.OverPinned++
		// Retryable: the consumer backs off until its own grants end.
		return nack(wire.NackNotReady, "ec producer: consumer pins its share of the cache and saves need the rest; NACK")
	}
	var key string
	if len(same) > 0 {
		key = same[0].key // share the string
		p.stats.ReRequests++
	} else {
		key = string(p.keyBuf)
	}
	sid, mmHash := key[:len(req.SessionID)], key[len(req.SessionID)+1:]
	if cs == nil {
		cs = p.openConsumer(sid, ident)
	}
	if cs.agent == "" && len(req.Agent) > 0 {
		p.lock() // Authorize reads it
		cs.agent = string(req.Agent)
		p.unlock()
	}
	cs.grants++
	g := p.newGrant()
	g.ProducerXfer = fsm.ProducerXfer{MMHash: mmHash, SessionID: sid, Blocks: blocks, Deadline: now.Add(p.lease)}
	g.id, g.key, g.agent, g.cs = grantIDs.Add(1), key, cs.agent, cs
	p.charge(g, ident)
	g.push = p.pushID(cs, ident)
	p.fresh = true
	if req.Attempt != 0 {
		// A Go consumer: it presents the token with the grant's READs
		// and notification. vLLM's consumers take none.
		p.tokens.Read(g.token[:])
	}
	if len(same) == 0 {
		g.ident = g.by.name
		cs.blocks += n
		p.idents[g.ident] += n
	} else {
		g.ident = same[0].ident // the identity charged for the entry
	}
	p.lock()
	p.byKey[key] = append(same, g)
	p.byID[g.id] = g
	p.unlock()
	p.link(g)
	if p.att != nil {
		p.att.Publish(g.id) // before the ack can leave
	}
	p.stats.Grants++
	p.ids = wirext.Ints(p.ids[:0], blocks)
	p.ack = wire.XferAck{
		MMHash: mmHash, Status: wire.OK, SessionID: sid, SrcBlockIndices: p.ids,
		AgentMetadata: p.lastMeta, Grant: g.id, Token: g.token, LeaseMillis: uint64(p.lease.Milliseconds()), Attempt: req.Attempt,
	}
	// A Go consumer (its request names its attempt) says whether it has
	// our metadata registered (ecx_known), and it may have dropped it (a
	// READ refused as ErrUnknownPeer): its word alone decides. A vLLM
	// consumer says nothing: one that READ from us has us registered.
	if !p.known(req.Known) && (req.Attempt != 0 || !cs.confirmed) {
		p.describe(req.AcceptsShape)
	}
	return g
}

// known reports whether a request's ecx_known names our agent metadata as
// it is: the consumer has it registered.
func (p *ProducerSession) known(digest uint64) bool {
	return digest != 0 && len(p.lastMeta) > 0 && digest == p.metaDigest
}

// describe puts the region's shape, when the consumer takes one, or else
// the mem descriptor into p.ack.
func (p *ProducerSession) describe(acceptsShape bool) {
	if shape, ok := p.regionShape(acceptsShape); ok {
		p.ack.Shape = shape
		p.stats.ShapesSent++
		return
	}
	p.ack.MemDescriptor = p.data.MemDescriptor()
	p.stats.DescsSent++
	p.stats.DescBytes += uint64(len(p.ack.MemDescriptor))
}

// contactGrant makes a grant of no blocks for req, a contact request of a
// Go consumer: a token for its data plane's contact READ, which ends it.
// It stays out of byKey: an entry that happens to have the contact's
// mm_hash keeps its own grants, bounds and share, and a notification
// reaches the contact grant only by its id and token.
func (p *ProducerSession) contactGrant(req *wireview.Req, cs *consumerState, ident []byte, now time.Time) *grant {
	key := string(req.SessionID) + ":" + string(req.MMHash)
	sid, mmHash := key[:len(req.SessionID)], key[len(req.SessionID)+1:]
	if cs == nil {
		cs = p.openConsumer(sid, ident)
	}
	if cs.agent == "" && len(req.Agent) > 0 {
		p.lock()
		cs.agent = string(req.Agent)
		p.unlock()
	}
	cs.grants++
	g := p.newGrant()
	g.ProducerXfer = fsm.ProducerXfer{MMHash: mmHash, SessionID: sid, Deadline: now.Add(p.lease)}
	g.id, g.key, g.agent, g.cs, g.contact = grantIDs.Add(1), key, cs.agent, cs, true
	p.charge(g, ident)
	g.ident = g.by.name
	cs.contact = g
	g.push = p.pushID(cs, ident)
	p.fresh = true
	p.tokens.Read(g.token[:])
	p.lock()
	p.byID[g.id] = g
	p.unlock()
	p.link(g)
	p.stats.Grants++
	return g
}

// charge counts g, made now, against the grants of ident, which asked.
func (p *ProducerSession) charge(g *grant, ident []byte) {
	a := p.askers[string(ident)]
	if a == nil {
		a = &asker{name: string(ident)}
		p.askers[a.name] = a
	}
	a.grants++
	if g.contact {
		a.contacts++
	}
	g.by = a
}

// regionShape returns, when the consumer accepts shapes, the shape the
// data plane's descriptor describes, if it is one, decoding each
// descriptor once (16,000 blocks: about 100 µs), even from a data plane
// that hands out a fresh copy each time.
func (p *ProducerSession) regionShape(accepted bool) (wire.Blocks, bool) {
	if !accepted {
		return wire.Blocks{}, false
	}
	d := p.data.MemDescriptor()
	if len(d) != len(p.shapeOf) || len(d) > 0 && &d[0] != &p.shapeOf[0] {
		if !bytes.Equal(d, p.shapeOf) {
			p.shape, p.shapeOK, _ = wire.DecodeBlocks(d)
		}
		p.shapeOf = d
	}
	return p.shape, p.shapeOK
}

func (p *ProducerSession) lock()   { p.authMu.Lock() }
func (p *ProducerSession) unlock() { p.authMu.Unlock() }

func (p *ProducerSession) unpin(mmHash string) {
	if err := cachex.Unpin(p.cache, mmHash); err != nil {
		// Cannot happen while this session is the only one pinning for
		// its grants; say so loudly if it does.
		p.log.Error("ec producer: unpin failed", "mm_hash", mmHash, "err", err)
	}
}

// pruneConsumers forgets consumer sessions without grants once there are
// many: forgetting only costs the descriptor in its next ack, and the agent
// binding of a session that holds nothing. After a scan it waits for the
// map to double (the sessions left hold grants, so they are at most the
// grants), so that a flood of new sessions costs a scan per doubling, not
// one per request.
func (p *ProducerSession) pruneConsumers() {
	if len(p.consumers) < max(p.pruneAt, 4*p.maxGrants/p.perSess+1024) {
		return
	}
	p.prunes++
	for id, c := range p.consumers {
		if c.grants == 0 {
			delete(p.consumers, id)
		}
	}
	p.pruneAt = 2 * len(p.consumers)
}

// canonicalUUID reports whether s is a UUID in canonical form: 36 lowercase
// hex digits and hyphens, 8-4-4-4-12.
func canonicalUUID(s []byte) bool {
	if len(s) != 36 || s[8] != '-' || s[13] != '-' || s[18] != '-' || s[23] != '-' {
		return false
	}
	for i, c := range s {
		if !lowerHex[c] && i != 8 && i != 13 && i != 18 && i != 23 {
			return false
		}
	}
	return true
}

var lowerHex = func() (t [256]bool) {
	for _, c := range "0123456789abcdef" {
		t[c] = true
	}
	return t
}()

func (p *ProducerSession) newGrant() *grant {
	if n := len(p.spare); n > 0 {
		g := p.spare[n-1]
		p.spare = p.spare[:n-1]
		return g
	}
	g := new(grant)
	g.release = func() {
		// Read before the hold drops: once it is endedBit, the step loop
		// may recycle g.
		mm, pinned := g.MMHash, !g.contact
		if g.hold.Add(-1) == endedBit && pinned {
			p.unpin(mm) // the cache is safe for concurrent use
		}
	}
	return g
}

func (p *ProducerSession) link(g *grant) {
	g.prev, g.next = p.lru.prev, &p.lru
	p.lru.prev.next = g
	p.lru.prev = g
}

// endGrant drops a grant; its pin goes now, or when the last READ being
// served under it is released.
func (p *ProducerSession) endGrant(g *grant) {
	if p.att != nil && !p.closed {
		// Before the pin goes: a consumer's copy that overlaps the end
		// sees the grant retired and drops the bytes.
		p.att.Retire(g.id)
	}
	g.prev.next, g.next.prev = g.next, g.prev
	g.prev, g.next = nil, nil
	g.cs.grants--
	if g.by.grants--; g.contact {
		g.by.contacts--
		if g.cs.contact == g {
			g.cs.contact = nil
		}
	}
	if g.by.grants == 0 {
		delete(p.askers, g.by.name)
	}
	p.lock()
	if !g.contact {
		p.dropKeyed(g)
	}
	delete(p.byID, g.id)
	p.unlock()
	// No Authorize can find g now: only releases change hold.
	if g.hold.Add(endedBit) != endedBit {
		p.held = append(p.held, g) // a READ is still being served
		return
	}
	if !g.contact { // a contact grant pins nothing
		p.unpin(g.MMHash)
	}
	p.recycle(g)
}

// dropKeyed takes g off its key's grants; the last one of the key gives
// back the blocks its session and identity were charged. With authMu held.
func (p *ProducerSession) dropKeyed(g *grant) {
	list := p.byKey[g.key]
	if i := slices.Index(list, g); i >= 0 {
		list = slices.Delete(list, i, i+1)
	}
	if len(list) > 0 {
		p.byKey[g.key] = list
		return
	}
	delete(p.byKey, g.key)
	g.cs.blocks -= len(g.Blocks)
	if p.idents[g.ident] -= len(g.Blocks); p.idents[g.ident] <= 0 {
		delete(p.idents, g.ident)
	}
}

func (p *ProducerSession) recycle(g *grant) {
	rel := g.release
	*g = grant{release: rel}
	p.spare = append(p.spare, g)
}

// reapHeld recycles the ended grants whose last READ was released (the
// release unpinned them).
func (p *ProducerSession) reapHeld() {
	kept := p.held[:0]
	for _, g := range p.held {
		if g.hold.Load() == endedBit {
			p.recycle(g)
		} else {
			kept = append(kept, g)
		}
	}
	clear(p.held[len(kept):])
	p.held = kept
}

func init() {
	hooks.SessionPins = func(s any, dst map[string]int) { s.(*ProducerSession).pinCounts(dst) }
	hooks.OnNotify = func(s any, f func() bool) bool {
		p := s.(*ProducerSession)
		if p.att == nil {
			return false
		}
		p.att.OnNotify(f)
		return true
	}
}

// pinCounts adds the pins per mm_hash this session holds for its grants
// (live ones, and ended ones whose READ is still being served) to dst. For
// the simulator's invariant checks (internal/hooks).
func (p *ProducerSession) pinCounts(dst map[string]int) {
	for g := p.lru.next; g != &p.lru; g = g.next {
		if !g.contact {
			dst[g.MMHash]++
		}
	}
	for _, g := range p.held {
		if g.hold.Load() != endedBit && !g.contact {
			dst[g.MMHash]++
		}
	}
}

// authorizeRelease reports whether a live grant covers a READ by agent: notif
// names the grant ("<session_id>:<mm_hash>", with "#<grant>.<token>" from
// a Go consumer, whose grants take nothing less than their token), every
// block must be one of its entry's, and the grant must not be bound to
// another agent. If it does, the entry stays pinned until release is
// called, even if the grant ends meanwhile: a data plane authorizes
// before serving a READ and release once the bytes are out of the region.
// It is safe for concurrent use, unlike the rest of ProducerSession; the
// block comparison runs without the lock the step loop needs.
func (p *ProducerSession) authorizeRelease(agent string, notif []byte, blocks []int) (release func(), ok bool) {
	if g := p.authorize(agent, notif, blocks); g != nil {
		return g.release, true
	}
	return nil, false
}

// authorize is authorizeRelease, returning the grant held.
func (p *ProducerSession) authorize(agent string, notif []byte, blocks []int) *grant {
	p.authMu.RLock()
	g, _ := p.lookup(notif)
	bound := ""
	if g != nil {
		g.hold.Add(1) // before the unlock: endGrant sees it
		// The agent it is bound to: its request's, or the one its
		// session's first notification came from (a consumer that named
		// none).
		if bound = g.agent; bound == "" {
			bound = g.cs.agent
		}
	}
	p.authMu.RUnlock()
	if g == nil {
		return nil
	}
	if (bound != "" && agent != bound) || !covers(g.Blocks, blocks) {
		g.release()
		return nil
	}
	return g
}

// gate is the session's side of a data plane it is attached to.
type gate struct{ p *ProducerSession }

// Authorize implements plane.Gate; the hold names where the grant's
// pushes go (grant.push), which then go to the connection that proved it.
// A session id is a name the consumer states: grants asked for under it
// from another control-plane identity than the one that opened the
// session are pushed elsewhere, so a peer that states another's session
// id, whether before or after that consumer does, never takes its pushes.
// The lease bounds what the grant has left: a consumer that reads slowly
// does not keep the entry pinned past it.
func (g gate) Authorize(agent string, notif []byte, blocks []int) (plane.Hold, bool) {
	gr := g.p.authorize(agent, notif, blocks)
	if gr == nil {
		return plane.Hold{}, false
	}
	return plane.Hold{Release: gr.release, Consumer: gr.push, Left: g.p.lease}, true
}

// Lease implements plane.Leased: a push of a grant is written within it.
func (g gate) Lease() time.Duration { return g.p.lease }

// maxPushIdents bounds the control-plane identities a consumer session
// keeps a push id for; grants asked by more are not pushed.
const maxPushIdents = 16

// pushID returns where the grants that ident asks for under cs are pushed.
func (p *ProducerSession) pushID(cs *consumerState, ident []byte) uint64 {
	if string(ident) == cs.ident {
		return cs.id
	}
	if id, ok := cs.others[string(ident)]; ok {
		return id
	}
	if len(cs.others) >= maxPushIdents {
		return 0
	}
	if cs.others == nil {
		cs.others = map[string]uint64{}
	}
	p.nextCons++
	cs.others[string(ident)] = p.nextCons
	return p.nextCons
}

// openConsumer starts the consumer session sid, which ident opens.
func (p *ProducerSession) openConsumer(sid string, ident []byte) *consumerState {
	p.pruneConsumers()
	p.nextCons++
	cs := &consumerState{id: p.nextCons, ident: string(ident)}
	p.consumers[sid] = cs
	return cs
}

// covers reports whether every block of want is one of have's, which is
// ascending. A READ asks for the blocks in the order the ack gave them:
// that case is one pass.
func covers(have, want []int) bool {
	if slices.Equal(have, want) {
		return true
	}
	if len(have) == 0 {
		return len(want) == 0
	}
	if lo, hi := have[0], have[len(have)-1]; hi-lo == len(have)-1 { // contiguous
		for _, b := range want {
			if b < lo || b > hi {
				return false
			}
		}
		return true
	}
	// Scattered blocks: a binary search per wanted block, or one pass over
	// each through a bitmap of the grant's span, whichever costs less, so
	// that a READ, granted or refused, costs no more than its own ids take
	// to search, however large the entry.
	words := uint(have[len(have)-1])/64 + 1
	if len(want)*bits.Len(uint(len(have))) <= len(have)+int(words) {
		for _, b := range want {
			if _, ok := slices.BinarySearch(have, b); !ok {
				return false
			}
		}
		return true
	}
	bm := bitmaps.Get().(*[]uint64)
	defer bitmaps.Put(bm)
	*bm = slices.Grow((*bm)[:0], int(words))[:words]
	set := *bm
	clear(set)
	for _, b := range have {
		set[uint(b)/64] |= 1 << (uint(b) % 64)
	}
	for _, b := range want {
		u := uint(b) // a negative id wraps past the end
		if u/64 >= words || set[u/64]&(1<<(u%64)) == 0 {
			return false
		}
	}
	return true
}

var bitmaps = sync.Pool{New: func() any { return new([]uint64) }}

// lookup finds the grant a notification names: by its grant id when it
// carries one ("<key>#<id>.<token>"), where the key must match and the
// token be the grant's (a grant made without a token takes any), else the
// oldest live grant of the key made without a token: a grant with one is
// never ended, nor read, by a notification that does not present it.
// forged says a live grant was named with a wrong or missing token.
// Called with authMu held, or on the step loop.
func (p *ProducerSession) lookup(msg []byte) (g *grant, forged bool) {
	if key, id, tok, ok := wirext.SplitNotifGrant(msg); ok {
		if g := p.byID[id]; g != nil && g.key == string(key) {
			if g.token.IsZero() || subtle.ConstantTimeCompare(g.token[:], tok[:]) == 1 {
				return g, false
			}
			return nil, true
		}
	}
	for _, g := range p.byKey[string(msg)] {
		if g.token.IsZero() {
			return g, false
		}
		forged = true
	}
	return nil, forged
}

func (p *ProducerSession) drainNotifs() {
	var err error
	p.notifs, err = p.notes.DrainNotifs(p.notifs[:0])
	if err != nil {
		p.stats.DrainErrors++
		p.log.Warn("ec producer: draining notifications failed", "err", err)
	}
	for i := range p.notifs {
		n := &p.notifs[i]
		g, forged := p.lookup(n.Msg)
		if g == nil {
			// Keys are valid UTF-8: only a miss needs the check.
			if bytes.HasSuffix(n.Msg, contactSuffix) {
				continue // a consumer's data plane set up its way to us (Contact)
			}
			if forged {
				p.stats.BadTokens++
				p.log.Warn("ec producer: notification without its grant's token; ignored", "agent", n.Agent)
			} else if !utf8.Valid(n.Msg) {
				p.stats.BadNotifs++
				p.log.Warn("ec producer: dropped malformed notification", "agent", n.Agent)
			} else {
				p.stats.UnknownNotifs++
			}
			continue
		}
		cs := g.cs
		want := g.agent
		if want == "" {
			want = cs.agent
		}
		if want != "" && n.Agent != want {
			p.stats.ForeignNotifs++
			p.log.Warn("ec producer: notification from an agent the grant is not bound to; ignored",
				"agent", n.Agent, "bound", want, "mm_hash", g.MMHash)
			continue
		}
		if cs.agent == "" {
			p.lock()           // Authorize reads it
			cs.agent = n.Agent // the first READ tells which agent is this session's
			p.unlock()
		}
		p.stats.Completions++
		cs.confirmed = true // it READ from us: it has our agent registered
		p.endGrant(g)
	}
	clear(p.notifs) // drop references to the messages
}

// drainBroken ends the grants whose READ the data plane served on a
// connection that closed before the consumer confirmed every byte: that
// READ cannot complete, and the consumer asks anew (a new grant) if it
// wants the entry. Only a grant the notification names with its token
// (a Go consumer's), bound to the READ's agent, ends: a bare key would
// name the oldest grant of the key, maybe not the READ's. The pin may
// go at once: every byte served left the region before the connection's
// end was seen (the plane holds the entry while it writes), and a push
// or a READ still being served keeps its own hold.
func (p *ProducerSession) drainBroken() {
	if p.att == nil {
		return
	}
	p.notifs = p.att.Broken(p.notifs[:0])
	for i := range p.notifs {
		n := &p.notifs[i]
		if _, _, tok, ok := wirext.SplitNotifGrant(n.Msg); !ok || tok.IsZero() {
			continue
		}
		g, _ := p.lookup(n.Msg)
		if g == nil {
			continue // ended already: by its notification, its lease, or another READ's end
		}
		if want := cmp.Or(g.agent, g.cs.agent); want != "" && n.Agent != want {
			continue
		}
		p.stats.BrokenReads++
		p.endGrant(g)
	}
	clear(p.notifs)
}

// NextDeadline returns when the first lease runs out; false if none is live.
func (p *ProducerSession) NextDeadline() (deadline time.Time, ok bool) {
	if g := p.lru.next; g != nil && g != &p.lru {
		return g.Deadline, true
	}
	return time.Time{}, false
}

// sweep ends the grants whose lease ran out. The lease list is in deadline
// order as long as the caller's clock does not go back; if it does, a grant
// behind a later one expires late, never early.
func (p *ProducerSession) sweep(now time.Time) {
	for g := p.lru.next; g != &p.lru && g.Expired(now); g = p.lru.next {
		p.stats.Expired++
		p.log.Warn("ec producer: consumer did not complete its READ within the pin lease; unpinning",
			"mm_hash", g.MMHash, "session", g.SessionID)
		p.endGrant(g)
	}
}

// StopGranting answers new requests NACK_INTERNAL; Close once Grants is 0.
func (p *ProducerSession) StopGranting() { p.draining = true }

// Close ends every grant; over NIXL they stay pinned until their READ or
// lease ends, which later Polls see to. It is idempotent and returns nil.
func (p *ProducerSession) Close() error {
	if p.closed {
		return nil
	}
	p.closed = true
	if !p.gating {
		return nil
	}
	p.att.Detach() // the board cleared: no grant of ours is retired one by one
	for g := p.lru.next; g != &p.lru; g = p.lru.next {
		p.endGrant(g)
	}
	if p.driven != nil {
		p.driven.ExpectReads(0, false)
	}
	return nil
}
