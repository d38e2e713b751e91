package xfer

import (
	"errors"
	"fmt"
)

// Handle names one posted READ inside a DataTransport. Zero is never a valid
// handle.
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

// Notif is a completion notification a producer received: a consumer's READ
// of its memory finished, and the consumer attached Msg to it.
type Notif struct {
	Agent string // the consumer's agent
	Msg   []byte // "<session_id>:<mm_hash>" in this protocol
}

// Errors a DataTransport reports.
var (
	// ErrMayStillWrite is returned by Release when the READ could not be
	// stopped: the transport may still write into its local blocks.
	ErrMayStillWrite = errors.New("xfer: READ may still write into its blocks")
	// ErrUnknownHandle is returned for a handle the transport does not hold.
	ErrUnknownHandle = errors.New("xfer: unknown handle")
	// ErrUnknownPeer is returned for an agent name that is not registered.
	ErrUnknownPeer = errors.New("xfer: unknown peer")
	// ErrLengthMismatch is returned by PostRead when the local and remote
	// block lists differ in length.
	ErrLengthMismatch = errors.New("xfer: local and remote block counts differ")
	// ErrClosed is returned by every component of this module once it is
	// closed: data planes, control planes, sessions, pools and producers
	// all return (or wrap) this one value, so one errors.Is tells.
	ErrClosed = errors.New("ecxfer: closed")
	// ErrBadConfig is returned by constructors given a configuration they
	// cannot run with (a required field missing, a nil dependency).
	ErrBadConfig = errors.New("ecxfer: invalid configuration")
)

// DataTransport is the data plane: one-sided READs of a peer's registered
// blocks into local ones, with a notification delivered to the peer when a
// READ completes. The pure-Go TCP plane and NIXL both implement it.
//
// Its methods are called from the engine's step loop and must not block on
// the network; implementations are safe for concurrent use.
type DataTransport interface {
	// AgentMetadata is this agent's blob, sent to consumers in OK acks.
	AgentMetadata() []byte
	// MemDescriptor is the encoded per-block descriptor list of the local
	// region (wire.AppendBlockDescs).
	MemDescriptor() []byte
	// AddRemotePeer registers a producer from its metadata and descriptor.
	AddRemotePeer(metadata, memDescriptor []byte) (Peer, error)
	// RemoveRemotePeer forgets a producer registered before.
	RemoveRemotePeer(agent string) error
	// PostRead starts a READ of the peer's remote blocks into the local
	// ones (same length), returning at once. When it completes, notif is
	// delivered to the peer. It keeps none of its slices after returning.
	PostRead(local []int, agent string, remote []int, notif []byte) (Handle, error)
	// Check reports a READ's progress. An error means the transport cannot
	// tell: the READ may or may not still be writing.
	Check(h Handle) (Progress, error)
	// Release frees a handle. Releasing a READ in progress cancels it where
	// possible; ErrMayStillWrite says it could not be stopped.
	Release(h Handle) error
	// DrainNotifs appends the notifications received since the last call to
	// dst and returns it.
	DrainNotifs(dst []Notif) ([]Notif, error)
	// Close releases every handle and peer and deregisters the region.
	Close() error
}
