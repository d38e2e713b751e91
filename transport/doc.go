// Package transport holds the two networks the protocol runs over: the
// ZeroMQ control plane ([Server], the producer's ROUTER; [Client], one
// DEALER per producer) and the pure-Go TCP data plane ([TCPData], an
// xfer.DataTransport). Package session/connector drives both: most
// programs only build them and hand them to connector.NewPool or
// connector.NewProducer, as the README shows. ExampleTCPData uses the data
// plane alone.
//
// The control plane moves bytes and never decodes a message. It speaks
// ZMTP to Go and libzmq peers alike, at addresses written tcp://host:port;
// whatever a peer sends wrong (an oversized frame, a bad handshake,
// silence) closes that one connection. Send, Reply, Drain and Dead never
// block: queues are bounded and refuse with xfer.ErrQueueFull.
//
// The data plane serves a READ only under a live grant of the producer
// session attached to it (and [TCPConfig].Authorize, if set), and lands
// the bytes straight in the consumer's blocks. On one Linux host a
// consumer copies the blocks out of a producer's region made with
// cache.RegionConfig.Shared; across hosts a producer may push a small
// entry with its ack. Close, on either plane, returns once its goroutines
// have stopped.
//
// The bounds, and what a peer can make each side hold: docs/operations.md
// in the repository. The design, and why: docs/design.md.
package transport
