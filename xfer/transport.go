package xfer

import (
	"errors"
	"fmt"
)

// Handle names one posted READ; zero is never valid.
type Handle uint64

// Progress is what a DataTransport says of a posted READ.
type Progress uint8

const (
	InProgress Progress = iota // the data may still be moving
	Complete                   // every byte has landed; nothing more is written
	Failed                     // the READ ended without completing; nothing more is written
)

func (p Progress) String() string {
	switch p {
	case InProgress:
		return "in-progress"
	case Complete:
		return "complete"
	case Failed:
		return "failed"
	}
	return fmt.Sprintf("Progress(%d)", p)
}

// Peer is a producer registered with the local data plane.
type Peer struct {
	Agent  string // the name READs address it by
	Blocks int    // how many blocks its region has: valid remote ids are [0, Blocks)
}

// Notif is what a producer received with a consumer's finished READ.
type Notif struct {
	Agent string // the consumer's agent
	Msg   []byte // "<session_id>:<mm_hash>[#...]" in this protocol
}

// Errors of the planes; ErrClosed once closed, ErrBadConfig from constructors.
var (
	ErrQueueFull      = errors.New("xfer: control plane send queue full")         // a later send may succeed
	ErrPeerDown       = errors.New("xfer: producer is down")                      // declared dead; the next send reconnects
	ErrNotAllowed     = errors.New("xfer: producer address not allowed")          // refused by the allowlist
	ErrPeerSilent     = errors.New("xfer: producer silent past the peer timeout") // no heartbeat (see Death)
	ErrMayStillWrite  = errors.New("xfer: READ may still write into its blocks")
	ErrUnknownHandle  = errors.New("xfer: unknown handle")
	ErrUnknownPeer    = errors.New("xfer: unknown peer")
	ErrLengthMismatch = errors.New("xfer: local and remote block counts differ")
	ErrClosed         = errors.New("ecxfer: closed")
	ErrBadConfig      = errors.New("ecxfer: invalid configuration")
)

// DataTransport is a data plane: one-sided READs of a peer's registered blocks
// into local ones, a completed READ's notif reaching the peer's DrainNotifs
// once. Methods never block on the network and are safe for concurrent use.
type DataTransport interface {
	AgentMetadata() []byte // this agent's blob, sent in OK acks
	MemDescriptor() []byte // the region's descriptor (wire.AppendBlockDescs)
	// AddRemotePeer registers a producer (an error for unusable metadata);
	// each registration needs a RemoveRemotePeer, one more fails ErrUnknownPeer.
	AddRemotePeer(metadata, memDescriptor []byte) (Peer, error)
	RemoveRemotePeer(agent string) error
	// PostRead starts READing remote into local blocks and returns at once,
	// keeping no slice; ErrLengthMismatch, ErrUnknownPeer, ErrClosed.
	PostRead(local []int, agent string, remote []int, notif []byte) (Handle, error)
	// Check fails with ErrUnknownHandle for a handle not held; any other
	// error means it cannot tell whether the READ still writes.
	Check(h Handle) (Progress, error)
	// Release forgets h, stopping its READ, or returns ErrMayStillWrite if
	// it could not. A second Release fails with ErrUnknownHandle.
	Release(h Handle) error
	DrainNotifs(dst []Notif) ([]Notif, error) // appends those since the last call; the caller owns them
	Close() error                             // ends every READ (none left InProgress) and peer, deregisters; again: nil
}
