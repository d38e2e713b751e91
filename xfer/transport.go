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

// Notif is a completion notification a producer received: Msg came with a
// consumer's finished READ.
type Notif struct {
	Agent string // the consumer's agent
	Msg   []byte // "<session_id>:<mm_hash>[#...]" in this protocol
}

// Errors a DataTransport reports.
var (
	// ErrMayStillWrite: Release could not stop the READ; it may still write.
	ErrMayStillWrite  = errors.New("xfer: READ may still write into its blocks")
	ErrUnknownHandle  = errors.New("xfer: unknown handle")
	ErrUnknownPeer    = errors.New("xfer: unknown peer")
	ErrLengthMismatch = errors.New("xfer: local and remote block counts differ")
	// ErrClosed: returned (or wrapped) by every component once closed.
	ErrClosed = errors.New("ecxfer: closed")
	// ErrBadConfig: a constructor's configuration it cannot run with.
	ErrBadConfig = errors.New("ecxfer: invalid configuration")
)

// DataTransport is a data plane: one-sided READs of a peer's registered
// blocks into local ones, with a notification delivered to the peer when a
// READ completes. Its methods must not block on the network, and must be safe
// for concurrent use.
type DataTransport interface {
	// AgentMetadata is this agent's blob, for OK acks.
	AgentMetadata() []byte
	// MemDescriptor is the region's (wire.AppendBlockDescs).
	MemDescriptor() []byte
	// AddRemotePeer registers a producer from its metadata and descriptor.
	AddRemotePeer(metadata, memDescriptor []byte) (Peer, error)
	// RemoveRemotePeer forgets a producer registered before.
	RemoveRemotePeer(agent string) error
	// PostRead starts a READ of remote into local blocks and returns at once;
	// on completion notif reaches the peer. It keeps no slice.
	PostRead(local []int, agent string, remote []int, notif []byte) (Handle, error)
	// Check reports progress; an error means it cannot tell.
	Check(h Handle) (Progress, error)
	// Release frees h, stopping its READ or saying ErrMayStillWrite.
	Release(h Handle) error
	// DrainNotifs appends the notifications received since the last call.
	DrainNotifs(dst []Notif) ([]Notif, error)
	// Close releases every handle and peer and deregisters the region.
	Close() error
}
