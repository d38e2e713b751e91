// Package fsm holds the state machine of one transfer on each side: the
// consumer's from the request to the moment its blocks may be reused, and
// the producer's grant with its lease. Both take the caller's time and
// read no clock. The session package drives them; no user needs to.
package fsm

import (
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/ecxfer/ecxfer/internal/plane"
	"github.com/ecxfer/ecxfer/internal/wireview"
	"github.com/ecxfer/ecxfer/internal/wirext"
	"github.com/ecxfer/ecxfer/wire"
	"github.com/ecxfer/ecxfer/xfer"
)

// Errors of ConsumerXfer.
var (
	// ErrBadAck: an OK ack whose block list does not fit the request.
	ErrBadAck = errors.New("xfer: OK ack does not fit the request")
	// ErrNotWaiting: the operation needs a transfer still waiting for its ack.
	ErrNotWaiting = errors.New("xfer: transfer is not waiting for an ack")
	// ErrLeaseOver: an OK ack handled, or a READ seen done, after its
	// grant's lease could have run out.
	ErrLeaseOver = errors.New("xfer: past the grant's lease")
)

// ConsumerXfer is the state machine of one fetch on the consumer side: from
// the request, through the READ, to the moment its blocks may be reused.
//
// It frees blocks only on a positive answer from the data plane. A READ
// whose state cannot be told is quarantined, not failed; a READ still
// running at the quarantine deadline is forced out and says so (Forced).
type ConsumerXfer struct {
	MMHash string
	Blocks []int // local destination blocks

	notif    []byte // "<session_id>:<mm_hash>", what the producer matches
	sidLen   int    // the session id's length in notif
	grant    uint64 // the grant the ack named (Grant), or 0
	data     xfer.DataTransport
	cfg      *xfer.Config
	state    State
	reason   xfer.Reason
	cause    error // the error behind reason, where one is known (Cause)
	forced   bool
	deadline time.Time // ack, read or quarantine deadline, by state
	sentAt   time.Time // when the request went out
	lease    time.Duration
	handle   xfer.Handle
	// loose: a Release could not stop the READ; its handle is gone, and
	// it may still write until the quarantine deadline.
	loose     bool
	stuck     error    // why the data plane could not stop the READ (Release's error)
	lastCheck error    // the last Check's error while quarantined
	remote    []int    // scratch: the ack's source blocks
	seen      []uint64 // scratch: for the uniqueness check
	sorted    []int
}

// NewConsumerXfer returns a transfer whose request was sent at sentAt,
// waiting for its ack until ackDeadline.
// cfg must already carry its defaults (xfer.Config.WithDefaults).
func NewConsumerXfer(mmHash string, blocks []int, sessionID string, sentAt, ackDeadline time.Time, data xfer.DataTransport, cfg *xfer.Config) *ConsumerXfer {
	x := &ConsumerXfer{}
	x.Reset(mmHash, blocks, sessionID, sentAt, ackDeadline, data, cfg)
	return x
}

// Reset reuses x for a new transfer, keeping its scratch buffers.
func (x *ConsumerXfer) Reset(mmHash string, blocks []int, sessionID string, sentAt, ackDeadline time.Time, data xfer.DataTransport, cfg *xfer.Config) {
	notif := append(x.notif[:0], sessionID...)
	notif = append(notif, ':')
	notif = append(notif, mmHash...)
	*x = ConsumerXfer{
		MMHash: mmHash, Blocks: blocks, notif: notif, sidLen: len(sessionID), data: data, cfg: cfg,
		state: WaitingAck, sentAt: sentAt, deadline: ackDeadline, remote: x.remote[:0], seen: x.seen[:0], sorted: x.sorted[:0],
		lease: cfg.PinLease,
	}
}

// Grant applies what a Go producer adds to an OK ack, before HandleAck:
// a nonzero grant id, and the grant's token, go into the notification
// ("<session_id>:<mm_hash>#<id>.<token>"), so that the producer ends
// exactly this grant and knows the READ and notification for the
// grantee's; a nonzero lease replaces xfer.Config.PinLease as the
// producer's pin lease for this READ.
func (x *ConsumerXfer) Grant(id uint64, token wire.Token, lease time.Duration) {
	if x.state != WaitingAck {
		return
	}
	if id != 0 {
		x.notif = wirext.AppendNotifGrant(x.notif, id, token)
		x.grant = id
	}
	if lease > 0 {
		x.lease = lease
	}
}

// State returns the current state.
func (x *ConsumerXfer) State() State { return x.state }

// Reason says why the transfer left the happy path (xfer.NoReason if it did not).
func (x *ConsumerXfer) Reason() xfer.Reason { return x.reason }

// Cause is the error behind Reason, or nil: a failed Check's, the lease's
// for a READ seen done past it, or, Forced, why the READ may still write.
func (x *ConsumerXfer) Cause() error { return x.cause }

// Forced reports whether a quarantined READ was settled by its deadline
// rather than by the data plane confirming it ended: its blocks may still be
// written.
func (x *ConsumerXfer) Forced() bool { return x.forced }

// Deadline returns the deadline of the current state.
func (x *ConsumerXfer) Deadline() time.Time { return x.deadline }

// SentAt returns when the request went out.
func (x *ConsumerXfer) SentAt() time.Time { return x.sentAt }

// LeaseEnd returns the earliest moment the producer's pin lease of this
// transfer's grant can end: the producer granted after the request went
// out, so its lease ends no earlier than the send time plus the lease
// (the ack's, see Grant, else xfer.Config.PinLease). Past it, the
// producer may have reused the blocks.
func (x *ConsumerXfer) LeaseEnd() time.Time { return x.sentAt.Add(x.lease) }

// CheckLease ends a transfer waiting for its ack, retry allowed
// (AckTimeout, reason xfer.LateCompletion), when an ack handled at
// now would come after LeaseEnd, and then returns ErrLeaseOver: no READ
// may be posted, since over NIXL a posted READ cannot be stopped and the
// blocks may hold another entry by now. A new request is a new grant.
func (x *ConsumerXfer) CheckLease(now time.Time) error {
	if x.state != WaitingAck || !now.After(x.LeaseEnd()) {
		return nil
	}
	x.state, x.reason = AckTimeout, xfer.LateCompletion
	return fmt.Errorf("%w: %s: OK ack handled at +%v, lease %v", ErrLeaseOver, x.MMHash, now.Sub(x.sentAt), x.lease)
}

// GrantID returns the grant the ack named (a Go producer's), or 0: then
// the notification names the grant by "<session_id>:<mm_hash>" alone.
func (x *ConsumerXfer) GrantID() uint64 { return x.grant }

// SessionID returns the session id the transfer's request carried.
func (x *ConsumerXfer) SessionID() string { return string(x.notif[:x.sidLen]) }

// HasHandle reports whether a READ handle is held.
func (x *ConsumerXfer) HasHandle() bool { return x.handle != 0 }

// Notif returns the notification the READ carries to the producer.
func (x *ConsumerXfer) Notif() []byte { return x.notif }

// HandleAck posts the READ for an OK ack from peer whose source blocks are
// src. An ack past LeaseEnd posts nothing (see CheckLease). The blocks are
// checked first: as many as the local blocks, each unique and inside the
// peer's region. A failed check or a refused post ends the transfer as
// ReadFailed (xfer.BadAck or xfer.PostFailed) and returns the error;
// no READ runs.
func (x *ConsumerXfer) HandleAck(src []wire.Int, peer xfer.Peer, now time.Time) error {
	if x.state != WaitingAck {
		return fmt.Errorf("%w: %s", ErrNotWaiting, x.state)
	}
	if err := x.CheckLease(now); err != nil {
		return err
	}
	if err := x.checkAck(src, peer); err != nil {
		x.state, x.reason = ReadFailed, xfer.BadAck
		return err
	}
	return x.post(peer, now)
}

// HandleAckView is HandleAck reading the source ids from the ack's view
// straight into ints, in one pass: an entry of 8,192 blocks spends no
// longer on its ids than on its other fields. Ids out of the producer's
// range go through HandleAck, which says which; a count that does not fit
// is refused without decoding the ids.
func (x *ConsumerXfer) HandleAckView(a *wireview.Ack, peer xfer.Peer, now time.Time) error {
	if x.state != WaitingAck {
		return fmt.Errorf("%w: %s", ErrNotWaiting, x.state)
	}
	if err := x.CheckLease(now); err != nil {
		return err
	}
	if a.NumBlocks != len(x.Blocks) {
		// Refused without decoding: an id costs the sender a byte and a
		// decoded one 16, so a long list is not worth reading.
		x.state, x.reason = ReadFailed, xfer.BadAck
		return fmt.Errorf("%w: %d source blocks for %d local", ErrBadAck, a.NumBlocks, len(x.Blocks))
	}
	ids, ok := wireview.AppendBlockIDs(a, x.remote[:0], peer.Blocks)
	if !ok {
		var full wire.XferAck
		if err := wire.DecodeAck(a.Raw, &full); err != nil {
			return err // a checked view's message decodes: cannot happen
		}
		return x.HandleAck(full.SrcBlockIndices, peer, now)
	}
	x.remote = ids
	if err := x.checkUnique(peer); err != nil {
		x.state, x.reason = ReadFailed, xfer.BadAck
		return err
	}
	return x.post(peer, now)
}

// post posts the READ of x.remote, checked.
func (x *ConsumerXfer) post(peer xfer.Peer, now time.Time) error {
	h, err := x.data.PostRead(x.Blocks, peer.Agent, x.remote, x.notif)
	if err != nil {
		x.state, x.reason = ReadFailed, xfer.PostFailed
		return fmt.Errorf("xfer: post READ of %s: %w", x.MMHash, err)
	}
	x.handle, x.state = h, Reading
	x.deadline = now.Add(x.cfg.ReadTimeout)
	return nil
}

func (x *ConsumerXfer) checkAck(src []wire.Int, peer xfer.Peer) error {
	if len(src) != len(x.Blocks) {
		return fmt.Errorf("%w: %d source blocks for %d local", ErrBadAck, len(src), len(x.Blocks))
	}
	x.remote = x.remote[:0]
	for _, v := range src {
		id, ok := v.Int()
		if !ok || id < 0 || id >= peer.Blocks {
			return fmt.Errorf("%w: source block %s outside the producer's %d", ErrBadAck, v, peer.Blocks)
		}
		x.remote = append(x.remote, id)
	}
	return x.checkUnique(peer)
}

// checkUnique checks that x.remote, whose ids are in the producer's range,
// names each block once.
func (x *ConsumerXfer) checkUnique(peer xfer.Peer) error {
	if Increasing(x.remote) { // as a producer's blocks usually are
		return nil
	}
	// Else one pass over a bitmap of the producer's blocks (ids are in
	// range by now), or a sort when the producer's region is so large that
	// the bitmap would outweigh the ack.
	words := (peer.Blocks + 63) / 64
	if words > 4*len(x.remote)+1024 {
		x.sorted = append(x.sorted[:0], x.remote...)
		slices.Sort(x.sorted)
		for i := 1; i < len(x.sorted); i++ {
			if x.sorted[i] == x.sorted[i-1] {
				return fmt.Errorf("%w: source block %d repeated", ErrBadAck, x.sorted[i])
			}
		}
		return nil
	}
	x.seen = slices.Grow(x.seen[:0], words)[:words]
	clear(x.seen)
	for _, id := range x.remote {
		w, bit := id/64, uint64(1)<<(id%64)
		if x.seen[w]&bit != 0 {
			return fmt.Errorf("%w: source block %d repeated", ErrBadAck, id)
		}
		x.seen[w] |= bit
	}
	return nil
}

// Poll advances the transfer to now and returns its state.
func (x *ConsumerXfer) Poll(now time.Time) State {
	switch x.state {
	case WaitingAck:
		if now.After(x.deadline) {
			x.state, x.reason = AckTimeout, xfer.AckTimedOut
		}
	case Reading:
		x.pollReading(now)
	case Quarantined:
		x.pollQuarantined(now)
	}
	return x.state
}

func (x *ConsumerXfer) pollReading(now time.Time) {
	p, err := x.data.Check(x.handle)
	switch {
	case err != nil:
		// Unknown is not failed: the DMA may still be running.
		x.cause = err
		x.quarantine(now, xfer.CheckFailed)
	case p == xfer.Complete:
		x.releaseEnded()
		// Past LeaseEnd the blocks may hold something else.
		if now.After(x.LeaseEnd()) {
			x.state, x.reason = ReadFailed, xfer.LateCompletion
			x.cause = fmt.Errorf("%w: %s: READ seen done at +%v, lease %v", ErrLeaseOver, x.MMHash, now.Sub(x.sentAt), x.lease)
		} else {
			x.state = Done
		}
	case p == xfer.Failed:
		if e, ok := plane.As[plane.Explainer](x.data); ok {
			x.cause = e.FailedWhy(x.handle)
		}
		x.releaseEnded()
		x.state, x.reason = ReadFailed, xfer.ReadError
	case now.After(x.deadline):
		x.quarantine(now, xfer.ReadTimedOut)
	}
}

func (x *ConsumerXfer) pollQuarantined(now time.Time) {
	if !x.loose {
		p, err := x.data.Check(x.handle)
		if err == nil && p != xfer.InProgress {
			x.releaseEnded()
			x.state = Settled
			return
		}
		x.lastCheck = err // nil: the last check could not tell, without an error
	}
	if now.After(x.deadline) {
		// Assume the data plane is stuck. The blocks are handed back, but
		// flagged: nothing confirmed the DMA stopped.
		if !x.loose {
			if err := x.data.Release(x.handle); err != nil {
				x.stuck, x.loose = err, true
			}
		}
		if x.forced = x.loose; x.forced {
			x.cause = mayStillWrite(x.MMHash+": not seen ended by the quarantine deadline", x.stuck)
			if x.lastCheck != nil {
				x.cause = fmt.Errorf("%w; its last check: %w", x.cause, x.lastCheck)
			}
		}
		x.handle, x.loose = 0, false
		x.state, x.reason = Settled, xfer.QuarantineTimedOut
	}
}

// quarantine keeps a READ that may still write: its blocks stay held until
// it settles or the quarantine deadline passes.
func (x *ConsumerXfer) quarantine(now time.Time, why xfer.Reason) {
	x.state, x.reason = Quarantined, why
	x.deadline = now.Add(x.cfg.QuarantineTimeout)
}

// releaseEnded frees the handle of a READ the data plane said has ended.
func (x *ConsumerXfer) releaseEnded() {
	_ = x.data.Release(x.handle) // ended: nothing can still write
	x.handle = 0
}

// PeerDown handles the death of the producer's control connection: a
// transfer waiting for its ack ends as AckTimeout (reason
// xfer.PeerDown: retry allowed), since its ack will not come. A READ in
// progress runs on: it moves on the data plane, which is not that
// connection, under a grant the producer keeps until its notification or
// lease, and it is judged when it ends (done within the lease: the entry;
// failed: nothing more writes) or at its deadline (quarantine), as any
// other. It returns the new state.
func (x *ConsumerXfer) PeerDown(_ time.Time) State {
	if x.state == WaitingAck {
		x.state, x.reason = AckTimeout, xfer.PeerDown
	}
	return x.state
}

// Cancel ends a transfer still waiting for its ack (no DMA can be running).
func (x *ConsumerXfer) Cancel() error {
	if x.state != WaitingAck {
		return fmt.Errorf("%w: %s", ErrNotWaiting, x.state)
	}
	x.state, x.reason = AckTimeout, xfer.Closed
	return nil
}

// Quarantine moves a READ in progress to quarantine for why (a cancel, say):
// its blocks stay held until the data plane says it ended, or the
// quarantine deadline passes.
func (x *ConsumerXfer) Quarantine(now time.Time, why xfer.Reason) error {
	if x.state != Reading {
		return fmt.Errorf("xfer: quarantine of a transfer in state %s", x.state)
	}
	x.quarantine(now, why)
	if x.stuck != nil { // a Release that could not stop it said why
		x.cause = mayStillWrite(x.MMHash, x.stuck)
	}
	return nil
}

// Release frees the READ handle, if one is held, for shutdown. It returns
// xfer.ErrMayStillWrite if the data plane could not stop a READ in progress: the
// blocks must then not be reused.
func (x *ConsumerXfer) Release() error {
	if x.handle == 0 {
		if x.loose { // released before, and not stopped
			return mayStillWrite(x.MMHash, x.stuck)
		}
		return nil
	}
	err := x.data.Release(x.handle)
	x.handle = 0
	if err != nil {
		x.loose, x.stuck = true, err
		return mayStillWrite(x.MMHash, err)
	}
	return nil
}

// mayStillWrite is the error of a READ that may still write, for what:
// xfer.ErrMayStillWrite, once, and what the data plane said (err), if
// anything.
func mayStillWrite(what string, err error) error {
	switch {
	case err == nil:
		return fmt.Errorf("%w: %s", xfer.ErrMayStillWrite, what)
	case errors.Is(err, xfer.ErrMayStillWrite):
		return fmt.Errorf("%s: %w", what, err)
	}
	return fmt.Errorf("%w: %s: %w", xfer.ErrMayStillWrite, what, err)
}

// DistinctBlocks reports whether ids are distinct and none negative, as a
// fetch's local blocks must be; scratch holds a sorted copy when they are
// not increasing (no allocation once it has grown).
func DistinctBlocks(ids []int, scratch *[]int) bool {
	if Increasing(ids) {
		return len(ids) == 0 || ids[0] >= 0
	}
	*scratch = append((*scratch)[:0], ids...)
	slices.Sort(*scratch)
	for i, b := range *scratch {
		if b < 0 || (i > 0 && b == (*scratch)[i-1]) {
			return false
		}
	}
	return true
}

// Increasing reports whether every id is above the one before: then they
// are unique without a sort or a bitmap. The blocks a cache hands out
// usually are.
func Increasing(ids []int) bool {
	for i := 1; i < len(ids); i++ {
		if ids[i] <= ids[i-1] {
			return false
		}
	}
	return true
}
