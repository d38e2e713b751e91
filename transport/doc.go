// Package transport holds the two networks the protocol runs over: the
// ZeroMQ control plane ([Server], the producer's ROUTER; [Client], one
// DEALER per producer) and the pure-Go TCP data plane ([TCPData], an
// xfer.DataTransport). Most programs only build them and hand them to
// connector.NewPool or connector.NewProducer, as the README shows;
// ExampleTCPData uses the data plane alone.
//
// The control plane moves bytes and never decodes a message. It speaks
// ZMTP to Go and libzmq peers alike, at tcp://host:port; whatever a peer
// sends wrong closes that one connection. Send, Reply, Drain and Dead
// never block: queues are bounded and refuse with xfer.ErrQueueFull.
//
// The data plane serves a READ only under a live grant of the producer
// session attached to it, and lands the bytes straight in the consumer's
// blocks: on one Linux host copied out of the producer's
// cache.RegionConfig.Shared region, across hosts over TCP, a small entry
// coming pushed with its ack. Close, on either plane, returns once its goroutines
// have stopped.
//
// The bounds, and what a peer can make each side hold: docs/operations.md
// in the repository. The design, and why: docs/design.md.
package transport
