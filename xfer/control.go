package xfer

import (
	"errors"
	"time"
)

// The control plane's contract. A control plane moves the protocol's
// messages as opaque bytes between a producer's server and its consumers'
// clients; connector drives any that provides these types (the ZeroMQ one
// in package transport, or an engine's own), and links nothing else of it.

// Message is one request a producer's control plane received.
type Message struct {
	Identity []byte // the consumer's connection, for the reply
	Payload  []byte
	// At is when the request arrived; zero: when it is handled.
	At time.Time
}

// Inbound is one payload a consumer's control plane received.
type Inbound struct {
	Addr    string // the producer's address, as given to Send
	Payload []byte
}

// Death is a producer a consumer's control plane declared dead, and why.
type Death struct {
	Addr string // the producer's address, as given to Send
	// Err is the cause; it matches ErrPeerSilent when the producer went
	// silent rather than its connection closing.
	Err error
}

// Errors of control planes, wrapped so that errors.Is tells a refusal worth
// retrying from the end.
var (
	// ErrQueueFull: the send queue is full; a later send may succeed.
	ErrQueueFull = errors.New("xfer: control plane send queue full")
	// ErrPeerDown: the producer was declared dead; the next send reconnects.
	ErrPeerDown = errors.New("xfer: producer is down")
	// ErrNotAllowed: the producer's address is refused by the allowlist.
	ErrNotAllowed = errors.New("xfer: producer address not allowed")
	// ErrPeerSilent: no heartbeat for the peer timeout (see Death).
	ErrPeerSilent = errors.New("xfer: producer silent past the peer timeout")
)
