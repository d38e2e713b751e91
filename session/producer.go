package session

import (
	"bytes"
	"context"
	"log/slog"
	"slices"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/ecxfer/ecxfer/cache"
	"github.com/ecxfer/ecxfer/wire"
	"github.com/ecxfer/ecxfer/xfer"
)

// Message is one request as the control plane received it.
type Message struct {
	Identity []byte // the consumer's ZeroMQ identity
	Payload  []byte
}

// Replier sends a reply to the consumer with the given identity. It must not
// block and must not keep payload after it returns.
type Replier interface {
	Reply(identity, payload []byte) error
}

// ProducerConfig configures a ProducerSession. The zero value is usable.
type ProducerConfig struct {
	// PinLease is how long a grant keeps its entry pinned without a
	// completion notification. Default 30 s.
	PinLease time.Duration
	// MaxGrantsPerSession bounds the live grants of one consumer session,
	// MaxGrants those of all together. A request over either is refused
	// with NACK_INTERNAL, which consumers treat as terminal (they fall back
	// to encoding locally) instead of retrying. Defaults 4096 and 65536:
	// far above what a well-behaved consumer holds.
	MaxGrantsPerSession int
	MaxGrants           int
	Logger              *slog.Logger // nil: slog.Default()
}

// ProducerStats counts what a ProducerSession has done.
type ProducerStats struct {
	Requests      uint64 // decoded requests
	Grants        uint64 // OK acks sent
	Nacks         [6]uint64
	Malformed     uint64 // payloads that did not decode as an XferReq
	ReRequests    uint64 // grants replaced by the same session asking again
	Completions   uint64 // grants ended by their notification
	UnknownNotifs uint64 // notifications matching no grant (late, foreign)
	BadNotifs     uint64 // notifications that are not UTF-8
	Expired       uint64 // grants ended by the lease
	ReplyErrors   uint64 // replies the control plane refused
	DrainErrors   uint64 // failed notification drains
	OverBound     uint64 // requests refused by the grant bounds
	BadSessionIDs uint64 // requests whose session id is not a canonical UUID
	DescsSent     uint64 // OK acks that carried the mem descriptor
}

type consumerState struct {
	grants    int
	confirmed bool
}

// grant is one live ProducerXfer, on the lease list in deadline order.
type grant struct {
	xfer.ProducerXfer
	key        string // "<session_id>:<mm_hash>", the notification's text
	prev, next *grant
}

// ProducerSession grants consumers' requests out of an EmbeddingCache: it
// pins the entry, answers with its blocks and the data plane's metadata,
// and unpins on the completion notification or when the lease runs out. It
// is sans-I/O: requests and the time come in through Poll, replies go out
// through a Replier. It is not safe for concurrent use.
type ProducerSession struct {
	data   xfer.DataTransport
	driven xfer.Driven // data, when it must be told of the live grants
	cache  *cache.EmbeddingCache
	compat string
	lease  time.Duration
	log    *slog.Logger

	authMu sync.RWMutex // guards grants against Authorize, once enabled
	authOn bool
	grants map[string]*grant
	lru    grant // sentinel of the lease list: lru.next expires first
	spare  []*grant

	// Per consumer session: its live grants, and whether it has completed
	// a READ since our agent metadata last changed (then it has registered
	// our agent, and acks can leave the mem descriptor out).
	consumers map[string]*consumerState
	lastMeta  []byte
	perSess   int
	maxGrants int

	req    wire.ReqView
	ack    wire.XferAck
	keyBuf []byte
	ids    []wire.Int
	buf    []byte
	notifs []xfer.Notif
	stats  ProducerStats
	closed bool
}

// NewProducerSession returns a session serving entries of c through data.
// compatHash is wire.CompatHash of this side.
func NewProducerSession(cfg ProducerConfig, data xfer.DataTransport, c *cache.EmbeddingCache, compatHash string) *ProducerSession {
	if cfg.PinLease <= 0 {
		cfg.PinLease = xfer.DefaultConfig().PinLease
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
	p := &ProducerSession{data: data, cache: c, compat: compatHash, lease: cfg.PinLease, log: log,
		grants: map[string]*grant{}, consumers: map[string]*consumerState{},
		perSess: cfg.MaxGrantsPerSession, maxGrants: cfg.MaxGrants}
	p.lru.prev, p.lru.next = &p.lru, &p.lru
	p.driven, _ = data.(xfer.Driven)
	return p
}

// Stats returns the counters.
func (p *ProducerSession) Stats() ProducerStats { return p.stats }

// Grants returns the number of live grants.
func (p *ProducerSession) Grants() int { return len(p.grants) }

// Poll answers every request in msgs, in order, through out; then drains the
// data plane's completion notifications and ends the grants whose lease ran
// out by now. It never fails: malformed requests are counted, logged and
// not answered.
func (p *ProducerSession) Poll(msgs []Message, now time.Time, out Replier) {
	if p.closed {
		return
	}
	if meta := p.data.AgentMetadata(); !bytes.Equal(meta, p.lastMeta) {
		// A new incarnation of our agent: every consumer registers anew.
		p.lastMeta = append(p.lastMeta[:0], meta...)
		for _, c := range p.consumers {
			c.confirmed = false
		}
	}
	for i := range msgs {
		p.handle(&msgs[i], now, out)
	}
	p.drainNotifs()
	p.sweep(now)
	if p.driven != nil {
		p.driven.ExpectReads(len(p.grants))
	}
}

func (p *ProducerSession) handle(m *Message, now time.Time, out Replier) {
	if err := wire.DecodeReqView(m.Payload, &p.req); err != nil {
		p.stats.Malformed++
		p.log.Warn("ec producer: malformed XferReq", "err", err)
		// Answer what can still be named, so the consumer need not wait
		// out its ack timeout.
		if mm, sid, ok := wire.PeekIDs(m.Payload, "req"); ok {
			p.ack = wire.XferAck{MMHash: string(mm), SessionID: string(sid), Status: wire.NackInternal}
			p.buf = wire.AppendAck(p.buf[:0], &p.ack)
			if out.Reply(m.Identity, p.buf) != nil {
				p.stats.ReplyErrors++
			}
			p.stats.Nacks[wire.NackInternal]++
		}
		return
	}
	p.stats.Requests++
	g := p.grantOrNack(&p.req, now)
	p.buf = wire.AppendAck(p.buf[:0], &p.ack)
	if err := out.Reply(m.Identity, p.buf); err != nil {
		p.stats.ReplyErrors++
		p.log.Warn("ec producer: reply not sent", "mm_hash", string(p.req.MMHash), "err", err)
		if g != nil {
			// The consumer will never READ under this grant: do not hold
			// the pin for a whole lease.
			p.endGrant(g)
		}
	}
}

// grantOrNack applies the reference's rules in order and fills p.ack. Its
// strings alias the request until a grant copies them (one allocation: the
// grant key, of which session id and mm_hash are substrings).
func (p *ProducerSession) grantOrNack(req *wire.ReqView, now time.Time) *grant {
	p.ack = wire.XferAck{}
	nack := func(s wire.Status, msg string) *grant {
		p.ack = wire.XferAck{MMHash: string(req.MMHash), Status: s}
		p.stats.Nacks[s]++
		level := slog.LevelWarn
		if s.Expected() {
			level = slog.LevelInfo
		}
		p.log.Log(context.Background(), level, msg, "mm_hash", p.ack.MMHash, "status", s.String())
		return nil
	}
	if req.EffectiveVersion() != wire.IntOf(wire.ConnectorVersion) {
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
	p.keyBuf = append(append(append(p.keyBuf[:0], req.SessionID...), ':'), req.MMHash...)
	old := p.grants[string(p.keyBuf)]
	cs := p.consumers[string(req.SessionID)]
	if old == nil && (len(p.grants) >= p.maxGrants || (cs != nil && cs.grants >= p.perSess)) {
		p.stats.OverBound++
		return nack(wire.NackInternal, "ec producer: grant bound reached; NACK")
	}
	key := string(p.keyBuf)
	sid, mmHash := key[:len(req.SessionID)], key[len(req.SessionID)+1:]
	entry, res := p.cache.PinIfReady(mmHash)
	switch res {
	case cache.Absent:
		return nack(wire.NackMissing, "ec producer: entry not held; NACK")
	case cache.NotReady:
		return nack(wire.NackNotReady, "ec producer: entry not ready; NACK")
	}
	if old != nil {
		// The consumer timed out and asked again: its old pin goes.
		p.stats.ReRequests++
		p.endGrant(old)
	}
	if cs == nil {
		p.pruneConsumers()
		cs = &consumerState{}
		p.consumers[sid] = cs
	}
	cs.grants++
	g := p.newGrant()
	g.ProducerXfer = xfer.ProducerXfer{MMHash: mmHash, SessionID: sid, Blocks: entry.Blocks, Deadline: now.Add(p.lease)}
	g.key = key
	if p.authOn {
		p.authMu.Lock()
		p.grants[key] = g
		p.authMu.Unlock()
	} else {
		p.grants[key] = g
	}
	p.link(g)
	p.stats.Grants++
	p.ids = wire.Ints(p.ids[:0], entry.Blocks)
	p.ack = wire.XferAck{
		MMHash: mmHash, Status: wire.OK, SessionID: sid, SrcBlockIndices: p.ids,
		AgentMetadata: p.lastMeta,
	}
	if !cs.confirmed {
		p.ack.MemDescriptor = p.data.MemDescriptor()
		p.stats.DescsSent++
	}
	return g
}

// pruneConsumers forgets consumer sessions without grants once there are
// many: forgetting only costs the descriptor in its next ack.
func (p *ProducerSession) pruneConsumers() {
	if len(p.consumers) < 4*p.maxGrants/p.perSess+1024 {
		return
	}
	for id, c := range p.consumers {
		if c.grants == 0 {
			delete(p.consumers, id)
		}
	}
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
	return new(grant)
}

func (p *ProducerSession) link(g *grant) {
	g.prev, g.next = p.lru.prev, &p.lru
	p.lru.prev.next = g
	p.lru.prev = g
}

// endGrant drops a grant and its pin.
func (p *ProducerSession) endGrant(g *grant) {
	g.prev.next, g.next.prev = g.next, g.prev
	mmHash := g.MMHash
	if cs := p.consumers[g.SessionID]; cs != nil {
		cs.grants--
	}
	if p.authOn {
		p.authMu.Lock()
	}
	delete(p.grants, g.key)
	*g = grant{} // Authorize may have held it until now
	if p.authOn {
		p.authMu.Unlock()
	}
	if err := p.cache.Unpin(mmHash); err != nil {
		// Cannot happen while this session is the only one pinning for
		// its grants; say so loudly if it does.
		p.log.Error("ec producer: unpin failed", "mm_hash", mmHash, "err", err)
	}
	p.spare = append(p.spare, g)
}

// GrantCounts adds the live grants per mm_hash to dst: each must equal the
// entry's pins taken by this session. For invariant checks.
func (p *ProducerSession) GrantCounts(dst map[string]int) {
	for g := p.lru.next; g != &p.lru; g = g.next {
		dst[g.MMHash]++
	}
}

// EnableAuthorize makes Authorize usable. Call it before handing
// Authorize to a data plane (connector.NewProducer does): from then on the
// grant table is locked for it. A producer whose data plane cannot gate
// READs (NIXL) skips the locking.
func (p *ProducerSession) EnableAuthorize() { p.authOn = true }

// Authorize reports whether a live grant covers a READ: notif names the
// grant ("<session_id>:<mm_hash>") and every block must be one of its
// entry's. A data plane calls it before serving a READ, so that a peer can
// read only what it was granted. Once EnableAuthorize was called it is safe
// for concurrent use, unlike the rest of ProducerSession; before, it grants
// nothing.
func (p *ProducerSession) Authorize(notif []byte, blocks []int) bool {
	if !p.authOn {
		return false
	}
	p.authMu.RLock()
	defer p.authMu.RUnlock()
	g, ok := p.grants[string(notif)]
	if !ok {
		return false
	}
	for _, b := range blocks {
		if !slices.Contains(g.Blocks, b) {
			return false
		}
	}
	return true
}

func (p *ProducerSession) drainNotifs() {
	var err error
	p.notifs, err = p.data.DrainNotifs(p.notifs[:0])
	if err != nil {
		p.stats.DrainErrors++
		p.log.Warn("ec producer: draining notifications failed", "err", err)
	}
	for i := range p.notifs {
		msg := p.notifs[i].Msg
		g, ok := p.grants[string(msg)]
		if !ok {
			// Keys are valid UTF-8: only a miss needs the check.
			if !utf8.Valid(msg) {
				p.stats.BadNotifs++
				p.log.Warn("ec producer: dropped malformed notification", "agent", p.notifs[i].Agent)
			} else {
				p.stats.UnknownNotifs++
			}
			continue
		}
		p.stats.Completions++
		if cs := p.consumers[g.SessionID]; cs != nil {
			cs.confirmed = true // it READ from us: it has our agent registered
		}
		p.endGrant(g)
	}
	clear(p.notifs) // drop references to the messages
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

// Close ends every grant, releasing its pin, and returns how many there
// were. The data plane is not closed: it belongs to the caller.
func (p *ProducerSession) Close() int {
	if p.closed {
		return 0
	}
	p.closed = true
	n := len(p.grants)
	for g := p.lru.next; g != &p.lru; g = p.lru.next {
		p.endGrant(g)
	}
	if p.driven != nil {
		p.driven.ExpectReads(0)
	}
	return n
}
