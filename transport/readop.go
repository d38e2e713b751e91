package transport

import (
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ecxfer/ecxfer/xfer"
)

// A READ on the consumer side is one readOp, whose state moves as the
// package doc's table says: only its lander (the one that moved it into
// opWriting) moves it out of writing; anyone else may fail it while it is
// queued or sent, or break its connection and wait.
const (
	opQueued int32 = iota
	opSent
	opWriting
	opDone
	opFailed
	opReleased
)

type readOp struct {
	h      xfer.Handle
	id     uint64 // the READ frame's id
	n      int    // blocks
	local  [][2]int
	remote [][2]int // runs of consecutive ids (start, count)
	notif  []byte
	peer   *peer

	state  atomic.Int32
	landed chan struct{}        // closed by the lander as it leaves writing
	link   atomic.Pointer[link] // the connection its frame went on, once sent
	// from: the connection a socket lander reads its bytes from, set
	// before the lander claims it (claimFrom), so that Release can break
	// it: an answer's, or a push's that came before the frame went.
	from atomic.Pointer[link]
	// sentAt: when its frame was written, under its link's mu.
	sentAt time.Time
	staged *staged // the push route found for it (between route and start)
	resend bool    // its push was dropped: the producer must send the bytes
	// refused: the producer answered that no live grant covers it (tests).
	refused atomic.Bool
	// why it failed, set by whoever moves it to opFailed, under whyMu
	// with that move, so that one who sees it failed reads why (failedWhy).
	whyMu sync.Mutex
	why   error
}

// Why READs fail, where nothing more precise is at hand.
var (
	errStopped    = errors.New("transport: the data plane or the producer's peer was closed")
	errRefusedOp  = errors.New("transport: the producer holds no live grant for this READ")
	errPushLost   = errors.New("transport: the producer pushed this READ's bytes, and they were dropped")
	errGrantEnded = errors.New("transport: the grant ended before the copy did")
)

func newReadOp(h xfer.Handle, p *peer, local, remote []int, notif []byte) *readOp {
	return &readOp{h: h, id: uint64(h), n: len(local), local: spans(nil, local), remote: spans(nil, remote),
		notif: notif, peer: p, landed: make(chan struct{})}
}

// claim moves op from state from into writing: the caller is its lander.
func (op *readOp) claim(from int32) bool { return op.state.CompareAndSwap(from, opWriting) }

// claimFrom is claim for a lander that reads op's bytes from l's socket:
// a Release that finds op writing finds l, and breaks it.
func (op *readOp) claimFrom(l *link, from int32) bool {
	op.from.Store(l)
	return op.claim(from)
}

// land ends op's writing, as its lander: done (why nil) or failed for
// why. It wakes a Release waiting for it, and the consumer's loop.
func (op *readOp) land(why error) {
	if why == nil {
		op.state.Store(opDone)
	} else {
		op.whyMu.Lock()
		op.why = why
		op.state.Store(opFailed)
		op.whyMu.Unlock()
	}
	close(op.landed)
	op.peer.ended(op, true)
}

// fail ends op for why unless it is being written (its lander ends it) or
// ended.
func (op *readOp) fail(why error) {
	for {
		s := op.state.Load()
		if s != opQueued && s != opSent {
			return
		}
		op.whyMu.Lock()
		ok := op.state.CompareAndSwap(s, opFailed)
		if ok {
			op.why = why
		}
		op.whyMu.Unlock()
		if ok {
			op.peer.ended(op, true)
			return
		}
	}
}

// grantLive is a same-host copy's outcome: nil, or errGrantEnded when the
// grant ended before the copy did (its bytes are not trusted).
func grantLive(live bool) error {
	if live {
		return nil
	}
	return errGrantEnded
}

// failedWhy is why op failed, or nil while it has not.
func (op *readOp) failedWhy() error {
	op.whyMu.Lock()
	defer op.whyMu.Unlock()
	if op.state.Load() != opFailed {
		return nil
	}
	return op.why
}

// release ends op for Release: at once unless a lander is writing into
// its blocks; then it breaks the connection a socket lander reads from,
// which stops it, and waits for the lander to leave (a copy runs to its
// end). Every lander that reads from a socket claims op with claimFrom.
func (op *readOp) release() {
	for {
		s := op.state.Load()
		switch s {
		case opQueued, opSent:
			if op.state.CompareAndSwap(s, opReleased) {
				op.peer.ended(op, false)
				return
			}
		case opWriting:
			if l := op.from.Load(); l != nil {
				l.breakOp(op)
			}
			<-op.landed
			return
		default:
			return
		}
	}
}

// progress says what Check reports.
func (op *readOp) progress() xfer.Progress {
	switch op.state.Load() {
	case opDone:
		return xfer.Complete
	case opFailed, opReleased:
		return xfer.Failed
	}
	return xfer.InProgress
}
