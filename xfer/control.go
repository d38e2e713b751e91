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
	At       time.Time // when the request arrived; zero: when it is handled
}

// Inbound is one payload a consumer's control plane received.
type Inbound struct {
	Addr    string // the producer's address, as given to Send
	Payload []byte
}

// Death is a producer a consumer's control plane declared dead, and why.
type Death struct {
	Addr string // the producer's address, as given to Send
	Err  error  // the cause; ErrPeerSilent when silent, not disconnected
}

// Errors of control planes, wrapped so that errors.Is tells a refusal worth
// retrying from the end.
var (
	ErrQueueFull  = errors.New("xfer: control plane send queue full")         // a later send may succeed
	ErrPeerDown   = errors.New("xfer: producer is down")                      // declared dead; the next send reconnects
	ErrNotAllowed = errors.New("xfer: producer address not allowed")          // refused by the allowlist
	ErrPeerSilent = errors.New("xfer: producer silent past the peer timeout") // no heartbeat (see Death)
)
