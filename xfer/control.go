package xfer

import "time"

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
