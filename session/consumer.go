package session

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"slices"
	"sync/atomic"
	"time"

	"github.com/google/uuid"

	"github.com/ecxfer/ecxfer/internal/fsm"
	"github.com/ecxfer/ecxfer/internal/hooks"
	"github.com/ecxfer/ecxfer/internal/plane"
	"github.com/ecxfer/ecxfer/internal/shrink"
	"github.com/ecxfer/ecxfer/internal/wireview"
	"github.com/ecxfer/ecxfer/internal/wirext"
	"github.com/ecxfer/ecxfer/wire"
	"github.com/ecxfer/ecxfer/xfer"
)

// Sender queues a payload for the producer; it must not block or keep it.
type Sender interface {
	Send(payload []byte) error
}

// Errors of the sessions; closed ones return xfer.ErrClosed.
var (
	ErrInFlight    = errors.New("session: a transfer for this mm_hash is in flight")
	ErrBadBlocks   = errors.New("session: local blocks must be distinct and not negative")
	ErrNotInFlight = errors.New("session: no transfer in flight for this mm_hash")
	// errUnanswered: StartXfer of an mm_hash with 16 requests unanswered
	// (or 2^20 in the session). It is an xfer.ErrQueueFull: retry once
	// replies have come, or on a new session.
	errUnanswered = fmt.Errorf("%w: session: too many requests unanswered", xfer.ErrQueueFull)
)

// Bounds of the requests a consumer session has sent and not seen
// answered. Past them StartXfer refuses (errUnanswered) rather than
// forget one: a reply to a forgotten request would be taken for a later
// request's, whose grant may be younger than the reply's.
const (
	maxUnansweredPerHash = 16
	maxUnanswered        = 1 << 20
)

// attemptIDs numbers the requests of every consumer session of the
// process: a reply that names an attempt names one request, whichever
// session it reaches.
var attemptIDs atomic.Uint64

// ConsumerConfig configures a ConsumerSession. The zero value is usable.
type ConsumerConfig struct {
	Xfer   xfer.Config  // timeouts; zero fields take their defaults
	Logger *slog.Logger // nil: slog.Default()
	Rand   io.Reader    // source of the session id; nil: crypto/rand
}

// ConsumerStats counts what a ConsumerSession has seen.
type ConsumerStats struct {
	Started, Completed, Failed uint64
	Held, Released             uint64 // failures whose READ might still write (BlocksHeld); their blocks given back
	ForcedReleases             uint64 // given back at the quarantine deadline, unconfirmed
	LateCompletions            uint64 // READs done after the producer's lease could have run out
	Nacks                      NackCounts
	BadAcks, Malformed         uint64 // OK acks whose block list did not fit; payloads not decoding as an XferAck
	ForeignAcks, StrayAcks     uint64 // acks echoing another session's id; matched to no transfer awaiting one
	LateAcks, Unread           uint64 // OK acks past their grant's lease (retryable); grants given back unread
	Registrations              uint64 // producer agents registered
}

// ConsumerSession is one connection's consumer side; Poll it past PeerDown.
type ConsumerSession struct {
	id     string
	compat string
	peer   Sender
	data   xfer.DataTransport
	xcfg   xfer.Config
	log    *slog.Logger

	agentName  string            // ours, sent with requests when the data plane has one
	shapes     plane.ShapedPeers // the data plane, when it takes producers' shapes
	registered bool
	agent      xfer.Peer
	agentMeta  []byte
	known      uint64 // wirext.MetaDigest(agentMeta), sent while registered (ecx_known)
	rand       io.Reader
	// ownIDs: the producer granted without naming the grant (vLLM's
	// does), so it tells a READ's notification by "<session_id>:<mm_hash>"
	// alone, and a late one of an earlier grant of the key would end the
	// next grant of it under its READ. Each request then carries a
	// session id of its own, which no other grant shares.
	ownIDs  bool
	ownSent map[string]uint64 // the own ids of unanswered requests, to their attempts
	ownMade int               // ownSent's size when made (Trim)
	contact contact
	replied bool // a reply answered one of our requests
	// echoes: a reply named the request it answers (a Go producer's do),
	// so a reply to a forgotten request is never taken for another's.
	echoes bool
	// forgot remembers, for a while, the requests expire forgot: the first
	// OK reply to one is a grant no READ will use, given back at once.
	forgot forgotten

	byHash      map[string]*cxfer // active and quarantined
	active      []*cxfer          // in start order
	quarantined []*cxfer
	spare       []*cxfer // ended, for reuse

	// sent holds the requests sent and not answered yet, from sentHead
	// on, in the order they were sent (their attempts increase): what a
	// reply can answer (see the package doc). perHash counts them by
	// mm_hash, so that a reply is matched without a scan that could fail:
	// a scan forgets what it passes, so each request is passed once.
	sent     []request
	sentHead int
	perHash  map[string]pending

	// High-water marks, for trim: since the maps were made, and since
	// the last Trim.
	hashesMade, hashesSeen   int
	pendingMade, pendingSeen int // mm_hashes with requests unanswered
	sentSeen, resultsSeen    int

	results Results
	stats   ConsumerStats
	buf     []byte
	ack     wireview.Ack
	sorted  []int
	closed  bool
}

// NewConsumerSession returns a session sending to peer and reading through
// data; xfer.ErrBadConfig for an empty compatHash or a nil dependency.
func NewConsumerSession(cfg ConsumerConfig, peer Sender, data xfer.DataTransport, compatHash string) (*ConsumerSession, error) {
	switch {
	case compatHash == "":
		return nil, fmt.Errorf("%w: session: empty compatibility hash", xfer.ErrBadConfig)
	case peer == nil || data == nil:
		return nil, fmt.Errorf("%w: session: nil sender or data plane", xfer.ErrBadConfig)
	}
	r := cfg.Rand
	if r == nil {
		r = randReader
	}
	u, err := uuid.NewRandomFromReader(r)
	if err != nil {
		return nil, fmt.Errorf("session: session id: %w", err)
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	c := &ConsumerSession{
		id: u.String(), rand: r, compat: compatHash, peer: peer, data: data,
		xcfg: cfg.Xfer.WithDefaults(), log: log, byHash: map[string]*cxfer{}, perHash: map[string]pending{},
	}
	if n, ok := plane.As[plane.Named](data); ok {
		c.agentName = n.Name()
	}
	c.shapes, _ = plane.As[plane.ShapedPeers](data)
	return c, nil
}

// Stats returns the counters.
func (c *ConsumerSession) Stats() ConsumerStats { return c.stats }

// StartXfer asks for mmHash into blocks (untouched until its outcome), ack
// due by ackDeadline. An error records nothing: xfer.ErrClosed, ErrInFlight,
// ErrBadBlocks, or the Sender's (retry an xfer.ErrQueueFull later).
func (c *ConsumerSession) StartXfer(mmHash string, blocks []int, ackDeadline, now time.Time) error {
	if c.closed {
		return xfer.ErrClosed
	}
	if _, ok := c.byHash[mmHash]; ok {
		return fmt.Errorf("%w: %s", ErrInFlight, mmHash)
	}
	if !fsm.DistinctBlocks(blocks, &c.sorted) {
		return fmt.Errorf("%w: %v", ErrBadBlocks, blocks)
	}
	if c.perHash[mmHash].n >= maxUnansweredPerHash || c.unanswered() >= maxUnanswered {
		return fmt.Errorf("%w: %s", errUnanswered, mmHash)
	}
	attempt, sid, err := c.send(mmHash, false, ackDeadline)
	if err != nil {
		return err
	}
	var x *cxfer
	if n := len(c.spare); n > 0 {
		x, c.spare = c.spare[n-1], c.spare[:n-1]
	} else {
		x = new(cxfer)
	}
	x.Reset(mmHash, blocks, sid, now, ackDeadline, c.data, &c.xcfg)
	x.ended, x.moved = false, false
	x.attempt = attempt
	c.byHash[mmHash] = x
	c.hashesSeen = max(c.hashesSeen, len(c.byHash))
	c.hashesMade = max(c.hashesMade, len(c.byHash))
	c.active = append(c.active, x)
	c.stats.Started++
	return nil
}

// send sends a request for mmHash (a contact request: see Contact) and
// records it as unanswered; it returns its attempt and the session id it
// carries: the session's, or one of its own once the producer is known to
// name no grant (see ownIDs).
func (c *ConsumerSession) send(mmHash string, contact bool, expires time.Time) (uint64, string, error) {
	attempt := attemptIDs.Add(1)
	sid := c.id
	if c.ownIDs && !contact {
		// Its own: no other unanswered request may carry it (a reply
		// echoing it is matched by it alone), whatever ConsumerConfig.Rand
		// yields.
		for tries := 0; ; tries++ {
			u, err := uuid.NewRandomFromReader(c.rand)
			if err != nil {
				return 0, "", fmt.Errorf("session: request's session id: %w", err)
			}
			sid = u.String()
			if _, dup := c.ownSent[sid]; !dup && sid != c.id {
				break
			}
			if tries == 8 {
				return 0, "", fmt.Errorf("session: request's session id: ConsumerConfig.Rand keeps repeating %s", sid)
			}
		}
	}
	req := wire.XferReq{MMHash: mmHash, CompatibilityHash: c.compat, SessionID: sid, VersionOnWire: true,
		Agent: c.agentName, Attempt: attempt, AcceptsShape: c.shapes != nil, Contact: contact}
	if c.registered {
		req.Known = c.known
	}
	c.buf = wire.AppendReq(c.buf[:0], &req)
	if err := c.peer.Send(c.buf); err != nil {
		return 0, "", fmt.Errorf("session: send XferReq for %s: %w", mmHash, err)
	}
	r := request{mmHash: mmHash, attempt: attempt, expires: expires}
	if sid != c.id {
		r.sid = sid
		if c.ownSent == nil {
			c.ownSent = map[string]uint64{}
		}
		c.ownSent[sid] = attempt
		c.ownMade = max(c.ownMade, len(c.ownSent))
	}
	c.sent = append(c.sent, r)
	p := c.perHash[mmHash]
	p.n++
	if r.sid == "" {
		p.sess++
	}
	c.perHash[mmHash] = p
	c.sentSeen = max(c.sentSeen, c.unanswered())
	c.pendingSeen = max(c.pendingSeen, len(c.perHash))
	c.pendingMade = max(c.pendingMade, len(c.perHash))
	return attempt, sid, nil
}

// contact is the last contact request (Contact) and what came of it.
type contact struct {
	attempt  uint64 // zero: none sent
	deadline time.Time
	done     bool
	status   wire.Status
	err      error
	notif    []byte      // the contact grant's notification, when the answer made one
	touch    wire.Blocks // the producer's touch page, when the answer named one
}

// Errors of a contact request (contacted).
var (
	errNoContactAnswer = errors.New("session: no answer to the contact request in time")
	errContactLost     = errors.New("session: the connection died before the contact request was answered")
)

// sendContact asks the producer, at now, for its data-plane contact ahead of
// any fetch (wire.XferReq.Contact): a Go producer answers with its agent
// metadata and region, which the session registers as it would a first
// OK ack's, and a producer that does not read the request (vLLM's, or a
// Go producer before it) answers NACK_MISSING. contacted says what came
// of it, by deadline at the latest. A contact sent while another waits
// replaces it (the earlier answer is dropped). It fails as StartXfer does.
func (c *ConsumerSession) sendContact(deadline, now time.Time) error {
	if c.closed {
		return xfer.ErrClosed
	}
	if c.perHash[wirext.ContactHash].n >= maxUnansweredPerHash || c.unanswered() >= maxUnanswered {
		return fmt.Errorf("%w: contact", errUnanswered)
	}
	attempt, _, err := c.send(wirext.ContactHash, true, deadline)
	if err != nil {
		return err
	}
	c.contact = contact{attempt: attempt, deadline: deadline}
	return nil
}

// contacted reports the outcome of the last contact request: done is
// false while it waits for its answer (and before any was sent); once
// done, err says why it ended without an answer (errNoContactAnswer,
// errContactLost) or why the answer could not be used, and otherwise st
// is the answer's status: wire.OK, the producer is registered (registeredPeer).
func (c *ConsumerSession) contacted() (done bool, st wire.Status, err error) {
	return c.contact.done, c.contact.status, c.contact.err
}

// registeredPeer returns the producer as the data plane knows it, once an
// ack (or a contact answer) registered it.
func (c *ConsumerSession) registeredPeer() (xfer.Peer, bool) { return c.agent, c.registered }

// probing reports whether the session's first request (or contact) is
// unanswered: its answer, if it is an OK ack, registers the producer, and
// connector.Pool holds the other requests to that producer until then, so
// that the producer sends its region's description once, not once per
// request.
func (c *ConsumerSession) probing() bool { return !c.registered && !c.replied && c.unanswered() > 0 }

// answered handles the reply to the contact request: ack is its decoded
// answer, or nil for one that does not decode, and then bad says why.
func (c *ConsumerSession) answered(ack *wireview.Ack, bad error) {
	k := &c.contact
	k.done = true
	switch {
	case ack == nil:
		k.err = fmt.Errorf("session: contact answer does not decode: %w: %w", xfer.BadAck, bad)
	case wire.Status(ack.Status) != wire.OK:
		k.status = wire.Status(ack.Status)
	case len(ack.AgentMetadata) == 0:
		k.err = fmt.Errorf("session: contact answer without agent metadata: %w: %w", xfer.BadAck, fsm.ErrBadAck)
	default:
		k.status = wire.OK
		if _, err := c.register(ack); err != nil {
			k.err = fmt.Errorf("session: register the producer from its contact answer: %w", err)
		}
		if ack.Grant != 0 && ack.Token != [16]byte{} {
			k.notif = wirext.AppendNotifGrant(append(append([]byte(c.id), ':'), ack.MMHash...), ack.Grant, ack.Token)
		}
		k.touch = ack.Touch
	}
}

// contactOf returns what a Go producer's contact answer gave the data
// plane's contact (plane.Contacter): the notification of the grant of no
// blocks it made, or nil, which the contact ends with a READ of nothing;
// and its touch page, or none.
func (c *ConsumerSession) contactOf() plane.Contact {
	return plane.Contact{Notif: c.contact.notif, Touch: c.contact.touch}
}

// request is one XferReq sent and not answered yet.
type request struct {
	mmHash  string
	attempt uint64
	sid     string    // its own session id (ownIDs), or "" for the session's
	expires time.Time // its ack deadline
}

// sentAt finds the unanswered request of attempt a, at c.sent[c.sentHead+i].
func (c *ConsumerSession) sentAt(a uint64) (i int, found bool) {
	return slices.BinarySearchFunc(c.sent[c.sentHead:], a, func(r request, a uint64) int { return cmp.Compare(r.attempt, a) })
}

// pending counts the unanswered requests of one mm_hash: all of them, and
// those that carry the session's id.
type pending struct{ n, sess int }

// unanswered returns how many requests are unanswered.
func (c *ConsumerSession) unanswered() int { return len(c.sent) - c.sentHead }

// answer matches a reply for mmHash, echoing session id sid (or none),
// to the request it answers, and forgets that request: the one the reply
// names (attempt, or a request's own session id), else the oldest
// unanswered of mmHash. The requests sent before it, of any mm_hash, are
// forgotten too: the producer answers in order, so it has answered or
// dropped them. It returns the transfer the reply may act on, the one of
// that request if it still waits for its ack; else nil, and the reply is
// to be dropped.
func (c *ConsumerSession) answer(mmHash, sid []byte, attempt uint64) (*cxfer, uint64) {
	p := c.perHash[string(mmHash)]
	if p.n == 0 {
		return nil, 0
	}
	q := c.sent[c.sentHead:]
	i := 0
	byAttempt := func(a uint64) bool {
		var found bool
		i, found = c.sentAt(a)
		return found && q[i].mmHash == string(mmHash)
	}
	switch {
	case attempt != 0:
		if !byAttempt(attempt) {
			return nil, 0 // not ours, answered already, or forgotten
		}
		c.echoes = true
	case len(sid) != 0 && string(sid) != c.id:
		// A request's own id answers exactly that request.
		if a, ok := c.ownSent[string(sid)]; !ok || !byAttempt(a) {
			return nil, 0
		}
	case len(sid) != 0:
		// The session's id answers a request that carried it.
		if p.sess == 0 {
			return nil, 0
		}
		for q[i].sid != "" || q[i].mmHash != string(mmHash) {
			i++
		}
	default:
		for q[i].mmHash != string(mmHash) {
			i++
		}
	}
	answered := q[i].attempt
	c.replied = true
	c.forgetSent(i + 1)
	x := c.byHash[string(mmHash)]
	if x == nil || x.attempt != answered || x.State() != fsm.WaitingAck {
		return nil, answered
	}
	return x, answered
}

// forgetSent forgets the n oldest unanswered requests.
func (c *ConsumerSession) forgetSent(n int) {
	for _, r := range c.sent[c.sentHead : c.sentHead+n] {
		if r.sid != "" {
			delete(c.ownSent, r.sid)
		}
		p := c.perHash[r.mmHash]
		p.n--
		if r.sid == "" {
			p.sess--
		}
		if p.n == 0 {
			delete(c.perHash, r.mmHash)
		} else {
			c.perHash[r.mmHash] = p
		}
	}
	clear(c.sent[c.sentHead : c.sentHead+n])
	c.sentHead += n
	if c.sentHead >= 64 && c.sentHead > len(c.sent)/2 || c.sentHead == len(c.sent) {
		c.compactSent()
	}
}

// compactSent moves the unanswered requests to the front of c.sent.
func (c *ConsumerSession) compactSent() {
	k := copy(c.sent, c.sent[c.sentHead:])
	clear(c.sent[k:])
	c.sent, c.sentHead = c.sent[:k], 0
}

// Poll takes the payloads received since the last call and advances to now.
func (c *ConsumerSession) Poll(msgs [][]byte, now time.Time) {
	if c.closed {
		return
	}
	for _, raw := range msgs {
		if err := wireview.DecodeAck(raw, &c.ack); err != nil {
			c.stats.Malformed++
			c.log.Warn("ec consumer: dropped malformed XferAck", "session", c.id, "err", err)
			c.badAck(raw, err)
			continue
		}
		c.dispatch(&c.ack, now)
	}
	c.advance(now)
}

// badAck handles a reply that does not decode (a status we do not know,
// say) but still names its mm_hash. It answers a request like any other
// reply; if that request's transfer waits for its ack, it ends at once,
// rather than after its ack timeout and retries: the producer has
// answered, and not with a grant we can use. It answers the attempt it
// names, or else the oldest unanswered request of its mm_hash.
func (c *ConsumerSession) badAck(raw []byte, err error) {
	mm, sid, attempt, ok := wireview.PeekIDs(raw, "ack")
	switch {
	case !ok:
		return // it names nothing: counted as Malformed only
	case !c.ours(sid):
		c.stats.ForeignAcks++
		return
	}
	x, answered := c.answer(mm, sid, attempt)
	if x == nil {
		if c.isContact(answered) {
			c.answered(nil, err)
			return
		}
		c.stats.StrayAcks++
		return
	}
	c.fail(x, xfer.BadAck, wire.OK, false, err)
}

// ours reports whether a reply echoing session id sid (or none) may be
// this session's: sid is the session's, or the own id of a request not
// answered yet.
func (c *ConsumerSession) ours(sid []byte) bool {
	if len(sid) == 0 || string(sid) == c.id {
		return true
	}
	_, ok := c.ownSent[string(sid)]
	return ok
}

// isContact reports whether attempt is the contact request's, waiting.
func (c *ConsumerSession) isContact(attempt uint64) bool {
	return attempt != 0 && attempt == c.contact.attempt && !c.contact.done
}

// cxfer is a transfer as the session holds it.
type cxfer struct {
	fsm.ConsumerXfer
	ended bool // its outcome is recorded; advance drops it
	moved bool // quarantined by Cancel: advance drops it from active
	// attempt names its request: only a reply that answers it acts.
	attempt uint64
}

// dispatch handles one ack. Its fields alias the payload: nothing of it is
// kept without a copy.
func (c *ConsumerSession) dispatch(ack *wireview.Ack, now time.Time) {
	if wire.Status(ack.Status) == wire.OK && (ack.Attempt != 0 || !c.ours(ack.SessionID)) &&
		c.forgot.take(ack.Attempt, string(ack.SessionID)) {
		// The first answer to a request expire forgot: a grant no READ
		// will use.
		c.stats.StrayAcks++
		c.unread(ack, nil)
		return
	}
	if !c.ours(ack.SessionID) {
		c.stats.ForeignAcks++
		c.log.Warn("ec consumer: ack for another session ignored", "session", c.id, "acked", string(ack.SessionID), "mm_hash", string(ack.MMHash))
		return
	}
	x, answered := c.answer(ack.MMHash, ack.SessionID, ack.Attempt)
	if x == nil {
		if c.isContact(answered) {
			c.answered(ack, nil)
			return
		}
		c.stats.StrayAcks++ // an earlier request's, a second reply, or not ours
		if answered != 0 && wire.Status(ack.Status) == wire.OK {
			// It answers a request of ours whose transfer ended (cancelled,
			// past its deadline): no one will READ this grant.
			c.unread(ack, nil)
		}
		return
	}
	if status := wire.Status(ack.Status); status != wire.OK {
		c.stats.Nacks[status]++
		level := slog.LevelWarn
		if wirext.Expected(status) {
			level = slog.LevelInfo
		}
		c.log.Log(context.Background(), level, "ec consumer: NACK", "status", status.String(), "mm_hash", x.MMHash, "session", c.id)
		c.fail(x, xfer.Nacked, status, status.Retryable(), nil)
		return
	}
	x.Grant(ack.Grant, ack.Token, time.Duration(min(ack.LeaseMillis, uint64(math.MaxInt64/time.Millisecond)))*time.Millisecond)
	if err := x.CheckLease(now); err != nil {
		c.stats.LateAcks++
		c.log.Warn("ec consumer: OK ack past its lease; no READ posted; may retry", "mm_hash", x.MMHash, "err", err)
		c.fail(x, x.Reason(), wire.OK, true, err)
		c.unread(ack, x.Notif())
		return
	}
	peer, err := c.register(ack)
	if err != nil {
		c.log.Warn("ec consumer: cannot register producer", "mm_hash", x.MMHash, "err", err)
		c.fail(x, xfer.RegisterFailed, wire.OK, false, err)
		return
	}
	if err := x.HandleAckView(ack, peer, now); err != nil {
		c.log.Warn("ec consumer: READ not posted", "mm_hash", x.MMHash, "err", err)
		c.fail(x, x.Reason(), wire.OK, false, err)
		if errors.Is(err, fsm.ErrBadAck) {
			c.stats.BadAcks++
			c.unread(ack, x.Notif())
		}
		if errors.Is(err, xfer.ErrUnknownPeer) {
			// The data plane no longer knows the producer (a load it
			// made later failed): register it again on the next ack.
			c.forget()
		}
		return
	}
	if ack.Grant == 0 {
		// A producer that names no grant tells this READ's notification
		// by "<session_id>:<mm_hash>" alone: from now on every request
		// carries a session id of its own (see ownIDs).
		c.ownIDs = true
	}
}

// forget drops the registration of the producer's agent.
func (c *ConsumerSession) forget() {
	if !c.registered {
		return
	}
	if err := c.data.RemoveRemotePeer(c.agent.Agent); err != nil && !errors.Is(err, xfer.ErrUnknownPeer) {
		c.log.Warn("ec consumer: remove producer agent", "agent", c.agent.Agent, "err", err)
	}
	c.registered = false
	c.agentMeta = c.agentMeta[:0]
}

// register makes sure the producer's agent is known to the data plane, once
// per metadata blob: a different blob means the producer restarted, so the
// old agent is removed first. The descriptor is ignored while the blob is
// unchanged, as the reference does; a shape stands in for a descriptor
// the ack left out.
func (c *ConsumerSession) register(ack *wireview.Ack) (xfer.Peer, error) {
	meta := ack.AgentMetadata
	if c.registered && bytes.Equal(meta, c.agentMeta) {
		return c.agent, nil
	}
	// What a contact answer gave the data plane's contact belongs to the
	// registration it made (answered sets it after this).
	c.contact.notif, c.contact.touch = nil, wire.Blocks{}
	if c.registered {
		c.log.Info("ec consumer: producer restarted; registering again", "agent", c.agent.Agent)
		if err := c.data.RemoveRemotePeer(c.agent.Agent); err != nil {
			c.log.Warn("ec consumer: remove old producer agent", "agent", c.agent.Agent, "err", err)
		}
		c.registered = false
	}
	var peer xfer.Peer
	var err error
	if len(ack.MemDescriptor) == 0 && ack.Shape.Count > 0 && c.shapes != nil {
		peer, err = c.shapes.AddRemotePeerShape(meta, ack.Shape)
	} else {
		peer, err = c.data.AddRemotePeer(meta, ack.MemDescriptor)
	}
	if err != nil {
		return xfer.Peer{}, err
	}
	c.registered, c.agent = true, peer
	c.agentMeta = append(c.agentMeta[:0], meta...)
	c.known = wirext.MetaDigest(c.agentMeta)
	c.stats.Registrations++
	return peer, nil
}

// advance polls every transfer, moving ended ones to the results.
func (c *ConsumerSession) advance(now time.Time) {
	if k := &c.contact; k.attempt != 0 && !k.done && now.After(k.deadline) {
		k.done, k.err = true, errNoContactAnswer
	}
	kept := c.active[:0]
	for _, x := range c.active {
		if x.ended {
			c.spare = append(c.spare, x)
			continue
		}
		if x.moved {
			continue
		}
		switch x.Poll(now) {
		case fsm.WaitingAck, fsm.Reading:
			kept = append(kept, x)
		case fsm.Done:
			c.complete(x)
			c.spare = append(c.spare, x)
		case fsm.AckTimeout:
			c.log.Warn("ec consumer: no XferAck in time; may retry", "mm_hash", x.MMHash, "session", c.id)
			c.fail(x, x.Reason(), wire.OK, true, nil)
			c.spare = append(c.spare, x)
		case fsm.ReadFailed:
			// A READ that failed has ended (its blocks are free); the entry
			// may still be there, under a new grant. One done past its lease
			// is not trusted, and not worth asking again now.
			c.fail(x, x.Reason(), wire.OK, x.Reason() == xfer.ReadError, x.Cause())
			c.spare = append(c.spare, x)
		case fsm.Quarantined:
			c.enterQuarantine(x)
		}
	}
	clear(c.active[len(kept):])
	c.active = kept
	c.drainQuarantine(now)
	c.expire(now)
}

// expire forgets the oldest unanswered requests once their ack deadline
// has passed, where a late reply to one can only be told for what it is:
// the producer names the request a reply answers (echoes), or the request
// carried a session id of its own, which its OK ack echoes. (A NACK names
// neither; one taken for a later request of its mm_hash ends that one
// without a READ.) Others are kept until answered, or the connection
// dies: matched by order, a late reply would otherwise be taken for a
// later request's, whose grant may be younger than the reply's. Records
// go in the order they were sent, so one not yet due holds those behind
// it; with the ack timeout fixed they expire in order.
func (c *ConsumerSession) expire(now time.Time) {
	for c.unanswered() > 0 {
		r := &c.sent[c.sentHead]
		if !now.After(r.expires) || !c.echoes && r.sid == "" || r.attempt == c.contact.attempt && !c.contact.done {
			return
		}
		c.forgot.add(r.attempt, r.sid)
		c.forgetSent(1)
	}
}

// forgotten holds the last maxForgotten requests expire forgot, by
// attempt and by their own session id, until a reply names one.
type forgotten struct {
	attempts map[uint64]string // attempt -> own session id, or ""
	sids     map[string]uint64
	order    []uint64 // attempts, oldest first
}

const maxForgotten = 4096

func (f *forgotten) add(attempt uint64, sid string) {
	if f.attempts == nil {
		f.attempts, f.sids = map[uint64]string{}, map[string]uint64{}
	}
	if len(f.order) >= maxForgotten {
		f.take(f.order[0], "")
	}
	f.attempts[attempt] = sid
	if sid != "" {
		f.sids[sid] = attempt
	}
	f.order = append(f.order, attempt)
}

// take reports whether a reply naming attempt (nonzero) or own session id
// sid answers a forgotten request, and forgets it: a request is answered
// once.
func (f *forgotten) take(attempt uint64, sid string) bool {
	if attempt == 0 {
		var ok bool
		if attempt, ok = f.sids[sid]; !ok || sid == "" {
			return false
		}
	}
	own, ok := f.attempts[attempt]
	if !ok {
		return false
	}
	delete(f.attempts, attempt)
	delete(f.sids, own)
	if i := slices.Index(f.order, attempt); i >= 0 {
		f.order = slices.Delete(f.order, i, i+1)
	}
	return true
}

// enterQuarantine fails a transfer whose READ may still write: its blocks
// stay held (BlocksHeld) until the READ is seen ended, or the quarantine
// deadline passes, and then come back in Released.
func (c *ConsumerSession) enterQuarantine(x *cxfer) {
	c.log.Warn("ec consumer: READ failed and may still write; blocks held", "mm_hash", x.MMHash, "reason", x.Reason().String())
	c.quarantined = append(c.quarantined, x)
	c.results.Failed = append(c.results.Failed, Outcome{MMHash: x.MMHash, Blocks: x.Blocks, Reason: x.Reason(), BlocksHeld: true, Err: x.Cause()})
	c.stats.Failed++
	c.stats.Held++
}

func (c *ConsumerSession) drainQuarantine(now time.Time) {
	kept := c.quarantined[:0]
	for _, x := range c.quarantined {
		if x.Poll(now) != fsm.Settled {
			kept = append(kept, x)
			continue
		}
		if x.Forced() {
			c.stats.ForcedReleases++
			c.log.Warn("ec consumer: quarantine deadline passed; READ not confirmed ended", "mm_hash", x.MMHash)
		}
		o := Outcome{MMHash: x.MMHash, Blocks: x.Blocks, Reason: x.Reason(), Forced: x.Forced()}
		if o.Forced {
			o.Err = x.Cause()
		}
		c.results.Released = append(c.results.Released, o)
		c.stats.Released++
		delete(c.byHash, x.MMHash)
		c.spare = append(c.spare, x)
	}
	clear(c.quarantined[len(kept):])
	c.quarantined = kept
}

// complete records that an active transfer's blocks hold its entry, and
// forgets its mm_hash. The transfer leaves c.active in the next pass of
// advance.
func (c *ConsumerSession) complete(x *cxfer) {
	c.results.Completed = append(c.results.Completed, Outcome{MMHash: x.MMHash, Blocks: x.Blocks})
	c.stats.Completed++
	delete(c.byHash, x.MMHash)
	x.ended = true
}

// fail records that an active transfer ended without its entry, with its
// blocks free, as complete does.
func (c *ConsumerSession) fail(x *cxfer, reason xfer.Reason, status wire.Status, retry bool, cause error) {
	o := Outcome{MMHash: x.MMHash, Blocks: x.Blocks, Reason: reason, Status: status, Retry: retry, Err: cause}
	c.results.Failed = append(c.results.Failed, o)
	c.stats.Failed++
	if reason == xfer.LateCompletion && !retry {
		c.stats.LateCompletions++
	}
	delete(c.byHash, x.MMHash)
	x.ended = true
}

// unread sends the notification of a grant no READ will use, so that the
// producer unpins its entry now instead of at the lease: notif is the
// notification the transfer's READ would have carried, or nil to make it
// from the ack (a transfer that ended before its ack came). It is sent
// only where it can end nothing but that grant: a Go producer's names the
// grant and carries its token; a grant named by "<session_id>:<mm_hash>"
// alone (vLLM's producer) is ended by it only while no other request or
// transfer of this session shares that name. Nothing is sent on a data
// plane that cannot notify without a READ; the producer is registered
// from the ack if it is not yet, as a READ of it would have.
func (c *ConsumerSession) unread(ack *wireview.Ack, notif []byte) {
	nt, ok := plane.As[plane.Notifier](c.data)
	if !ok || len(ack.AgentMetadata) == 0 {
		return
	}
	if _, err := c.register(ack); err != nil { // a first ack, or a restarted producer's
		c.log.Debug("ec consumer: notification of an unread grant not sent", "mm_hash", string(ack.MMHash), "err", err)
		return
	}
	if notif == nil {
		sid := ack.SessionID
		if len(sid) == 0 {
			sid = []byte(c.id)
		}
		if ack.Grant == 0 && c.named(string(sid), string(ack.MMHash)) {
			return
		}
		notif = append(append(append(c.buf[:0], sid...), ':'), ack.MMHash...)
		if ack.Grant != 0 {
			notif = wirext.AppendNotifGrant(notif, ack.Grant, ack.Token)
		}
	} else if ack.Grant == 0 && c.named(string(ack.SessionID), string(ack.MMHash)) {
		return
	}
	if err := nt.Notify(c.agent.Agent, notif); err != nil {
		c.log.Debug("ec consumer: notification of an unread grant not sent", "mm_hash", string(ack.MMHash), "err", err)
		return
	}
	c.stats.Unread++
}

// giveBack sends the notification of x's grant, whose READ was stopped
// for certain: no byte of it will be used, and the producer unpins now
// (it keeps the blocks until its own answer is out). As unread, only
// where it can end no other grant.
func (c *ConsumerSession) giveBack(x *cxfer) {
	nt, ok := plane.As[plane.Notifier](c.data)
	if !ok || !c.registered || x.GrantID() == 0 && c.named(x.SessionID(), x.MMHash) {
		return
	}
	if err := nt.Notify(c.agent.Agent, x.Notif()); err != nil {
		c.log.Debug("ec consumer: notification of a stopped READ's grant not sent", "mm_hash", x.MMHash, "err", err)
		return
	}
	c.stats.Unread++
}

// named reports whether a request still unanswered, or a transfer in
// flight, of mmHash carries session id sid: a notification naming
// "<sid>:<mm_hash>" alone could end its grant.
func (c *ConsumerSession) named(sid, mmHash string) bool {
	if sid == "" {
		sid = c.id
	}
	if x := c.byHash[mmHash]; x != nil && !x.ended && x.SessionID() == sid {
		return true
	}
	if sid == c.id {
		return c.perHash[mmHash].sess > 0
	}
	a, ok := c.ownSent[sid]
	if !ok {
		return false
	}
	i, found := c.sentAt(a)
	return found && c.sent[c.sentHead+i].mmHash == mmHash
}

// PeerDown says the connection died: ack waits fail (Retry); READs run on.
func (c *ConsumerSession) PeerDown(now time.Time) {
	if c.closed {
		return
	}
	c.forgetSent(c.unanswered()) // none will be answered on this connection
	if k := &c.contact; k.attempt != 0 && !k.done {
		k.done, k.err = true, errContactLost
	}
	kept := c.active[:0]
	for _, x := range c.active {
		if x.ended {
			c.spare = append(c.spare, x)
			continue
		}
		if x.moved {
			continue
		}
		if x.PeerDown(now) == fsm.AckTimeout {
			c.fail(x, xfer.PeerDown, wire.OK, true, nil) // the connector knows the death's error
			c.spare = append(c.spare, x)
			continue
		}
		kept = append(kept, x) // reading
	}
	clear(c.active[len(kept):])
	c.active = kept
}

// TakeResults appends the new outcomes to r; reuse r (Reset) to not allocate.
func (c *ConsumerSession) TakeResults(r *Results) {
	c.resultsSeen = max(c.resultsSeen, c.results.Len())
	c.results.appendTo(r)
	c.results.Reset()
}

// trim gives back the memory kept for a past peak: the maps, buffers and
// spare transfers sized for more transfers than the session held since
// the previous trim shrink to what it held (Go's maps never shrink by
// themselves). Call it now and then, a few times per minute at most:
// connector.Pool does, four times per PoolConfig.IdleSession.
func (c *ConsumerSession) trim() {
	if c.closed {
		return
	}
	lately := max(c.hashesSeen, len(c.byHash))
	c.byHash = shrink.Map(c.byHash, &c.hashesMade, lately)
	c.perHash = shrink.Map(c.perHash, &c.pendingMade, max(c.pendingSeen, len(c.perHash)))
	if c.ownSent != nil {
		c.ownSent = shrink.Map(c.ownSent, &c.ownMade, len(c.ownSent))
	}
	c.compactSent()
	c.sent = shrink.Slice(c.sent, max(c.sentSeen, c.unanswered()))
	c.active = shrink.Slice(c.active, lately)
	c.quarantined = shrink.Slice(c.quarantined, lately)
	c.spare = shrink.Slice(keep(c.spare, lately), lately)
	fitResults(&c.results, max(c.resultsSeen, c.results.Len()))
	c.hashesSeen, c.pendingSeen, c.sentSeen, c.resultsSeen = len(c.byHash), len(c.perHash), c.unanswered(), c.results.Len()
}

// fitResults gives back the capacity of r's slices far beyond n outcomes.
func fitResults(r *Results, n int) {
	r.Completed, r.Failed, r.Released = shrink.Slice(r.Completed, n), shrink.Slice(r.Failed, n), shrink.Slice(r.Released, n)
}

// keep drops the elements of a spare list beyond n (and 16 more).
func keep[T any](spare []T, n int) []T {
	if n += 16; len(spare) > n {
		clear(spare[n:])
		spare = spare[:n]
	}
	return spare
}

// Cancel ends mmHash's transfer: reason Canceled, BlocksHeld if its READ
// cannot be stopped (NIXL's). It fails with xfer.ErrClosed or ErrNotInFlight.
func (c *ConsumerSession) Cancel(mmHash string, now time.Time) error {
	return c.abort(mmHash, now, xfer.Canceled)
}

// abort is Cancel for why.
func (c *ConsumerSession) abort(mmHash string, now time.Time, why xfer.Reason) error {
	if c.closed {
		return xfer.ErrClosed
	}
	x, ok := c.byHash[mmHash]
	if !ok || x.ended {
		return fmt.Errorf("%w: %s", ErrNotInFlight, mmHash)
	}
	switch x.State() {
	case fsm.WaitingAck:
		x.Cancel()
		c.fail(x, why, wire.OK, false, nil)
	case fsm.Reading:
		if st, ok := plane.As[plane.Stoppable](c.data); ok && st.StopsReads() && x.Release() == nil {
			c.fail(x, why, wire.OK, false, nil)
			c.giveBack(x)
			return nil
		}
		x.Quarantine(now, why)
		x.moved = true
		c.enterQuarantine(x)
	}
	return nil
}

// InFlight counts the transfers not ended, or whose held blocks are not back.
func (c *ConsumerSession) InFlight() int { return len(c.byHash) }

// Close fails the transfers in flight (Closed), giving held blocks back in the
// next TakeResults and stopped READs' grants to their producer; idempotent.
func (c *ConsumerSession) Close() error {
	if c.closed {
		return nil
	}
	c.closed = true
	st, ok := plane.As[plane.Stoppable](c.data)
	stops := ok && st.StopsReads()
	closeOne := func(x *cxfer, quarantined bool) {
		o := Outcome{MMHash: x.MMHash, Blocks: x.Blocks, Reason: xfer.Closed}
		reading := x.State() == fsm.Reading
		switch err := x.Release(); {
		case err != nil:
			c.log.Warn("ec consumer: READ could not be stopped at close; blocks unsafe", "mm_hash", x.MMHash, "err", err)
			o.Err = err
			if !quarantined {
				held := o
				held.BlocksHeld = true
				c.results.Failed = append(c.results.Failed, held)
			}
			o.Forced = true
			c.results.Released = append(c.results.Released, o)
		case quarantined:
			c.results.Released = append(c.results.Released, o)
		default:
			o.Retry = true
			c.results.Failed = append(c.results.Failed, o)
			if reading && stops {
				// Stopped for certain: the producer unpins now, not at
				// the lease. Ended first, as Cancel's, so that the
				// notification goes where a grant's name is all it has.
				x.ended = true
				c.giveBack(x)
			}
		}
	}
	for _, x := range c.active {
		if !x.ended && !x.moved {
			closeOne(x, false)
		}
	}
	for _, x := range c.quarantined {
		closeOne(x, true)
	}
	c.active, c.quarantined, c.spare = nil, nil, nil
	c.byHash, c.perHash, c.sent, c.sentHead, c.ownSent = nil, nil, nil, 0, nil
	if c.registered {
		if err := c.data.RemoveRemotePeer(c.agent.Agent); err != nil {
			c.log.Warn("ec consumer: remove producer agent", "agent", c.agent.Agent, "err", err)
		}
		c.registered = false
	}
	return nil
}

// internals is what connector.Pool reaches through internal/hooks.
type internals struct{ c *ConsumerSession }

func init() {
	hooks.ConsumerOf = func(s any) hooks.Consumer { return internals{s.(*ConsumerSession)} }
}

func (i internals) Contact(deadline, now time.Time) error { return i.c.sendContact(deadline, now) }
func (i internals) Contacted() (done, again bool, st wire.Status, err error) {
	done, st, err = i.c.contacted()
	again = errors.Is(err, errNoContactAnswer) || errors.Is(err, errContactLost)
	return done, again, st, err
}
func (i internals) ContactOf() plane.Contact      { return i.c.contactOf() }
func (i internals) Registered() (xfer.Peer, bool) { return i.c.registeredPeer() }
func (i internals) Probing() bool                 { return i.c.probing() }
func (i internals) Trim()                         { i.c.trim() }
func (i internals) End(mmHash string, now time.Time, why xfer.Reason) error {
	return i.c.abort(mmHash, now, why)
}
